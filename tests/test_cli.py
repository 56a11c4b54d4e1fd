"""The gpupool command: info and a one-case bench, on whatever this machine has."""
import itertools
import json
import subprocess
import sys

import pytest

from gpupool import benchmark, cli


def test_info_reports_numpy_usable(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend numpy: usable" in out
    assert "backend cupy:" in out


def test_info_reports_gpupools_kernel_cache(capsys, monkeypatch, tmp_path):
    pytest.importorskip("cupy")
    monkeypatch.setenv("GPUPOOL_CACHE_DIR", str(tmp_path))
    assert cli.main(["info"]) == 0
    assert f"kernel cache: {tmp_path} (set GPUPOOL_CACHE_DIR" in capsys.readouterr().out


def test_bench_one_case_writes_json_and_markdown(tmp_path, capsys):
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    assert cli.main(["bench", "--backend", "numpy", "--ops", "seed [64,7,7]",
                     "--json", str(js), "--markdown", str(md)]) == 0
    result = json.loads(js.read_text())
    assert result["backend"] == "numpy" and result["copy_bw_gbps"] > 0
    (row,) = result["rows"]
    assert row["case"] == "seed [64,7,7] global avg"
    assert row["gpupool_ms"] > 0 and row["raw_times_s"]["gpupool"]
    assert not row["check"].startswith("FAILED")
    assert "| seed [64,7,7] global avg |" in md.read_text()


def test_missing_baseline_is_reported_not_faked(monkeypatch, tmp_path):
    monkeypatch.setattr(benchmark, "_torch", lambda: (None, None))
    result = benchmark.run("small", ["seed [64,7,7]"], "numpy")
    (row,) = result["rows"]
    assert row["missing"]["torch"] == "not installed"
    assert "torch_ms" not in row


def test_host_timing_runs_each_library_in_bursts():
    """Libraries are never interleaved call by call (another library's spinning worker
    threads would be timed too), each burst starts with one untimed call, every library takes
    part in every round, and a burst of fast calls stops at ``max_reps``."""
    calls = []
    funcs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = benchmark.time_host(funcs, rounds=3, burst_s=0.0, min_reps=4, settle_s=0.0)
    runs = [(name, len(list(group))) for name, group in itertools.groupby(calls)]
    assert [name for name, _ in runs] == ["a", "b", "c"] * 3
    assert all(length == 5 for _, length in runs)
    assert {name: len(t) for name, t in times.items()} == {"a": 12, "b": 12, "c": 12}
    capped = benchmark.time_host(funcs, rounds=1, burst_s=10.0, max_reps=7, settle_s=0.0)
    assert {name: len(t) for name, t in capped.items()} == {"a": 7, "b": 7, "c": 7}


def test_cupy_backend_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(benchmark, "gpu_usable", lambda: (False, "no GPU"))
    with pytest.raises(SystemExit, match="--backend cupy.*no GPU"):
        benchmark.run("small", ["seed [64,7,7]"], "cupy")


def test_console_script_runs():
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", "info"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "gpupool" in done.stdout


@pytest.mark.parametrize("case", benchmark.SUITE, ids=lambda c: c.name)
def test_bench_reference_checks_every_case(case):
    """The bench's own check (used where no baseline runs) accepts gpupool's answer and
    rejects a wrong one."""
    x = benchmark.make_input(case, 1)
    got = benchmark.values(benchmark.gpupool_call(case, x)())
    want = benchmark.reference_values(case, x)
    assert benchmark._check(got, want, case.dtype) == "ok"
    wrong = got.copy()
    wrong.flat[wrong.size // 2] += 1
    assert benchmark._check(wrong, want, case.dtype).startswith("FAILED")
