"""The gpupool command: info and a one-case bench, on whatever this machine has."""
import functools
import itertools
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from gpupool import cli
from gpupool.bench import baselines, cases, checks, report, runner, timing
from gpupool.cuda import probe


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
    assert row["gpupool_ms"] > 0 and row["times_s"]["gpupool"]["n"] >= 1
    spread = row["times_s"]["gpupool"]
    assert spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"]
    assert spread["median"] * 1e3 == pytest.approx(row["gpupool_ms"], rel=0.01)
    assert not row["check"].startswith("FAILED")
    assert "| seed [64,7,7] global avg |" in md.read_text()


def test_missing_baseline_is_reported_not_faked(monkeypatch, tmp_path):
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    result = runner.run("small", ["seed [64,7,7]"], "numpy")
    (row,) = result["rows"]
    assert row["missing"]["torch"] == "not installed"
    assert "torch_ms" not in row


def test_host_timing_runs_each_library_in_bursts():
    """Libraries are never interleaved call by call (another library's spinning worker
    threads would be timed too), each burst starts with one untimed call, every library takes
    part in every round, and a burst of fast calls stops at ``max_reps``."""
    calls = []
    funcs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = timing.time_host(funcs, rounds=3, burst_s=0.0, min_reps=4, settle_s=0.0)
    runs = [(name, len(list(group))) for name, group in itertools.groupby(calls)]
    assert [name for name, _ in runs] == ["a", "b", "c"] * 3
    assert all(length == 5 for _, length in runs)
    assert {name: len(t) for name, t in times.items()} == {"a": 12, "b": 12, "c": 12}
    capped = timing.time_host(funcs, rounds=1, burst_s=10.0, max_reps=7, settle_s=0.0)
    assert {name: len(t) for name, t in capped.items()} == {"a": 7, "b": 7, "c": 7}


def test_cupy_backend_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(probe, "gpu_usable", lambda: (False, "no GPU"))
    with pytest.raises(SystemExit, match="--backend cupy.*no GPU"):
        runner.run("small", ["seed [64,7,7]"], "cupy")


@pytest.fixture
def fresh_nvrtc_probe():
    """The probe's once-per-process NVRTC answer, forgotten before and after the test."""
    probe.nvrtc_reason.cache_clear()
    yield
    probe.nvrtc_reason.cache_clear()


@pytest.mark.gpu
def test_gpu_is_usable_only_where_nvrtc_compiles_the_probe(fresh_nvrtc_probe, monkeypatch):
    """The probe compiles its kernel through CuPy's NVRTC with the backend's options."""
    cupy = pytest.importorskip("cupy")
    from gpupool.cuda import kernels
    compiles = []
    real = cupy.cuda.compiler.compile_using_nvrtc
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    monkeypatch.setattr(cupy.cuda.compiler, "compile_using_nvrtc",
                        lambda source, options=(), *a, **k: compiles.append(
                            (source, tuple(options))) or real(source, options, *a, **k))
    assert probe.gpu_usable() == (True, "1 GPU(s)")
    assert compiles == [(probe.PROBE_SOURCE, kernels.compile_options())]
    probe.gpu_usable()
    assert len(compiles) == 1  # once per process


def test_gpu_without_nvrtc_is_not_usable(fresh_nvrtc_probe, monkeypatch, capsys):
    """A GPU with CuPy but no NVRTC (pip install cupy-cuda12x alone): every kernel would fail to
    compile, so the GPU is not usable; gpupool info says why and bench runs on the CPU."""
    cupy = pytest.importorskip("cupy")

    def no_nvrtc(*args, **kwargs):
        raise RuntimeError("CuPy failed to load libnvrtc.so.12: cannot open shared object file")

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    monkeypatch.setattr(cupy.cuda.compiler, "compile_using_nvrtc", no_nvrtc)
    usable, reason = probe.gpu_usable()
    assert not usable
    assert reason.startswith("NVRTC cannot compile a kernel (RuntimeError: CuPy failed to load "
                             "libnvrtc.so.12") and "cuda12" in reason
    assert cli.main(["info"]) == 0
    assert f"backend cupy: not usable: {reason}" in capsys.readouterr().out
    result = runner.run("small", ["seed [64,7,7]"], "auto")
    assert result["backend"] == "numpy" and result["gpu_status"] == reason
    with pytest.raises(SystemExit, match="--backend cupy asked for, but NVRTC cannot compile"):
        runner.run("small", ["seed [64,7,7]"], "cupy")


def test_console_script_runs():
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", "info"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "gpupool" in done.stdout


@pytest.mark.parametrize("case", cases.SUITE + cases.BACKWARD, ids=lambda c: c.name)
def test_bench_reference_checks_every_case(case):
    """The bench's own check (used where no baseline runs) accepts gpupool's answer and
    rejects a wrong one."""
    x = cases.make_input(case, 1)
    got = cases.values(cases.gpupool_call(case, x)())
    want = checks.reference_values(case, x)
    assert checks.check_values(got, want, case.dtype) == "ok"
    wrong = got.copy()
    wrong.flat[wrong.size // 2] += 1
    assert checks.check_values(wrong, want, case.dtype).startswith("FAILED")


def _fast_host_timing(monkeypatch):
    """One untimed and one timed call per library: the checks, not the times, are tested."""
    monkeypatch.setattr(timing, "time_host", functools.partial(
        timing.time_host, rounds=1, burst_s=0.0, min_reps=1, settle_s=0.0))


@pytest.mark.parametrize("case", cases.SUITE + cases.BACKWARD, ids=lambda c: c.name)
def test_plain_cupy_baseline_computes_the_case_or_says_why_not(case, monkeypatch):
    """The GPU bench's plain-CuPy baseline, run here on NumPy data with SciPy's ndimage (the
    API cupyx.scipy.ndimage copies): it gives gpupool's values, or a reason when it cannot."""
    ndimage = pytest.importorskip("scipy.ndimage")
    cupyx = type(sys)("cupyx")
    cupyx.scipy = type(sys)("cupyx.scipy")
    cupyx.scipy.ndimage = ndimage
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", cupyx.scipy)
    x = cases.make_input(case, 2)
    call, why = baselines.cupy_call(case, x)
    if call is None:
        assert why and (case.layout == "NHWC" or case.op not in ("max", "gavg")), why
        return
    want = cases.values(cases.gpupool_call(case, x)())
    try:
        result = call()
    except RuntimeError as e:  # the bench reports the baseline as missing (float16 here)
        assert case.dtype == "float16", e
        return
    got = baselines.baseline_values(case, result)
    if case.op in ("max", "qmax"):
        assert_array_equal(got, want)
    else:  # a mean in CuPy's order of summation
        tol = 1e-3 if case.dtype == "float16" else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol / 10)


@pytest.mark.parametrize("case", cases.SUITE + cases.BACKWARD, ids=lambda c: c.name)
def test_small_suite_agrees_with_every_cpu_baseline(case, monkeypatch):
    """Each case of the small suite as ``gpupool bench`` runs it on the CPU: gpupool's answer
    is compared with that of every baseline that runs the case (PyTorch, onnxruntime), and
    each agrees; a baseline is missing only for an op or layout it does not have, and a case
    that none runs is checked against the float64 reference."""
    pytest.importorskip("torch", reason="PyTorch (the test extra) is the CPU baseline checked")
    pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra) is a CPU baseline")
    _fast_host_timing(monkeypatch)
    row = runner.run_case(case, "small", gpu=False)
    assert row.error is None
    assert set(row.missing.values()) <= {"no such op", "no NHWC pooling op"}, row.missing
    baselines = {"torch", "onnxruntime"} - set(row.missing)
    assert set(row.checks) == (baselines or {"reference"})
    assert set(row.checks.values()) == {"ok"}, row.checks
    assert row.check == f"ok (vs {', '.join(row.checks)})"
    assert set(row.times_s) == {"gpupool", *baselines}  # no baseline timed unchecked


@pytest.mark.parametrize("name", ["global avg N=64", "global avg N=64 f16"])
def test_fixed_batch_cases_agree_with_onnxruntime_without_pytorch(name, monkeypatch):
    """Regression: without PyTorch (the README's main command installs none) the fixed N=64
    cases were checked against onnxruntime only, which was given a 5-D tensor (a leading 1
    before the N) and pooled the wrong axes, so the case failed its check."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra) is a CPU baseline")
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    _fast_host_timing(monkeypatch)
    (case,) = [c for c in cases.SUITE if c.name == name]
    row = runner.run_case(case, "small", gpu=False)
    assert (row.check, row.error) == ("ok (vs onnxruntime)", None)


def test_cases_without_a_baseline_are_checked_against_the_reference(monkeypatch):
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    _fast_host_timing(monkeypatch)
    for case in cases.select_cases(["seed"]):
        row = runner.run_case(case, "small", gpu=False)
        assert (row.check, row.error) == ("ok (vs reference)", None)
        assert row.missing == {"torch": "not installed", "onnxruntime": "not installed"}


@pytest.mark.parametrize("name, size, shape", [
    ("global avg N=64", "small", (64, 2048, 7, 7)),
    ("global avg N=64", "large", (64, 2048, 7, 7)),
    ("seed [64,56,56] max 2x2 s2", "small", (64, 56, 56)),
    ("seed [64,7,7] global avg", "large", (64, 7, 7)),
    ("resnet50 head global avg", "small", (4, 2048, 7, 7)),
    ("resnet50 head global avg", "large", (669, 2048, 7, 7)),  # 669 samples: >= 256 MiB
    ("resnet stem max 3x3 s2 p1 backward", "small", (4, 64, 112, 112)),
    ("resnet50 head global avg backward", "large", (669, 2048, 7, 7)),
])
def test_case_input_shapes(name, size, shape):
    (case,) = [c for c in cases.SUITE + cases.BACKWARD if c.name == name]
    assert case.shape(cases.batch_size(case, size)) == shape


def test_backward_rows_time_gpupool_against_pytorchs_own_backward(monkeypatch, tmp_path):
    """The backward rows: each forward case's gradient (the stem max from the forward's
    indices) checked against PyTorch's backward kernel, both timed in the same run, the
    bytes those read and write counted, in the suite's table."""
    pytest.importorskip("torch", reason="PyTorch (the test extra) is the CPU baseline checked")
    _fast_host_timing(monkeypatch)
    md = tmp_path / "b.md"
    assert cli.main(["bench", "--backend", "numpy", "--ops", "backward",
                     "--markdown", str(md)]) == 0
    result = runner.run("small", ["max_bwd", "gavg_bwd"], "numpy")
    assert [r["case"] for r in result["rows"]] == ["resnet stem max 3x3 s2 p1 backward",
                                                  "resnet50 head global avg backward"]
    grad, plane = 4 * 4 * 64 * 56 * 56, 4 * 4 * 64 * 112 * 112
    assert result["rows"][0]["bytes"] == grad + 2 * grad + plane  # gradient, indices, result
    for r in result["rows"]:
        assert r["check"] == "ok (vs torch)" and r["error"] is None, r
        assert r["missing"]["onnxruntime"] == "no such op"
        assert r["torch_over_gpupool"] == pytest.approx(r["torch_ms"] / r["gpupool_ms"],
                                                        rel=0.01, abs=0.01)
    text = md.read_text()
    for case in cases.BACKWARD:
        assert f"| {case.name} |" in text
    assert cases.select_cases(["avg_bwd"], cases.SUITE + cases.BACKWARD) == [cases.BACKWARD[1]]
    assert cases.select_cases(["avg_bwd"]) == []  # the forward suite alone: no such row


def test_backward_rows_fail_their_check_on_a_wrong_gradient(monkeypatch, capsys):
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    monkeypatch.setattr(checks, "reference_values", lambda case, x: np.zeros(x.shape))
    _fast_host_timing(monkeypatch)
    assert cli.main(["bench", "--backend", "numpy", "--ops", "gavg_bwd"]) == 1
    assert "1 case(s) failed: resnet50 head global avg backward" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the command line

def test_version(capsys):
    import gpupool
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpupool {gpupool.__version__}"


def test_no_arguments_prints_help_and_exits_2(capsys):
    """No command is a usage error: the help goes to stderr, the status is argparse's 2."""
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: gpupool") and "info" in err and "bench" in err


@pytest.mark.parametrize("argv", [["--help"], ["info", "--help"], ["bench", "--help"]])
def test_help_is_plain_text(capsys, argv):
    """No reST markup (double backticks, roles) in --help."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for markup in ("``", ":func:", ":class:", ":mod:"):
        assert markup not in out


def test_every_option_has_help():
    for parser in cli.parsers():
        for action in parser._actions:
            if action.option_strings:
                assert action.help, action.option_strings
    bench = cli.parsers()[1]
    (backend,) = [a for a in bench._actions if "--backend" in a.option_strings]
    assert "auto" in backend.help and "cupy" in backend.help


def _one_line_error(capsys) -> str:
    """The CLI's error: one line on stderr, nothing on stdout, no traceback."""
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, (out, err)
    assert "Traceback" not in err
    return err


def _no_run(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the suite ran")
    monkeypatch.setattr(runner, "run_case", fail)
    monkeypatch.setattr(timing, "copy_bandwidth", fail)


def test_unknown_op_exits_nonzero_before_running(monkeypatch, capsys):
    _no_run(monkeypatch)
    assert cli.main(["bench", "--backend", "numpy", "--ops", "max", "nosuchop"]) == 2
    err = _one_line_error(capsys)
    assert "'nosuchop'" in err and "'max'" not in err
    assert "gavg" in err and "qavg" in err and "resnet50 head global avg" in err
    with pytest.raises(ValueError, match="nosuchop"):
        runner.run("small", ["nosuchop"], "numpy")


def test_plot_without_matplotlib_exits_nonzero_before_running(monkeypatch, capsys, tmp_path):
    _no_run(monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "b.png"
    assert cli.main(["bench", "--backend", "numpy", "--ops", "seed [64,7,7]",
                     "--plot", str(png)]) == 2
    err = _one_line_error(capsys)
    assert "--plot needs matplotlib" in err and 'pip install "gpupool[bench]"' in err
    assert not png.exists()
    with pytest.raises(ImportError, match="pip install"):
        runner.run("small", ["seed [64,7,7]"], "numpy", plot_path=str(png))


@pytest.mark.parametrize("option", ["--json", "--markdown", "--plot"])
@pytest.mark.parametrize("where, reason", [
    ("a folder", "is a directory"),
    ("a missing folder", "is not an existing folder"),
    ("a file for a folder", "is not an existing folder"),
    ("/dev/full", "No space left on device"),
])
def test_unwritable_output_is_an_error_before_running(monkeypatch, capsys, tmp_path, option,
                                                      where, reason):
    """An output that cannot be written stops the command before the suite runs, on one line
    naming the option and the path (the run used to end in a traceback when it came to write
    it, or /dev/full's write failed after the whole run), and leaves no file behind."""
    _no_run(monkeypatch)
    monkeypatch.setattr(report, "require_matplotlib", lambda: None)  # paths, not matplotlib
    (tmp_path / "file").write_text("kept")
    path = {"a folder": tmp_path, "a missing folder": tmp_path / "missing" / "out",
            "a file for a folder": tmp_path / "file" / "out", "/dev/full": "/dev/full"}[where]
    if where == "/dev/full" and not os.path.exists(path):
        pytest.skip("no /dev/full here")
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["bench", "--backend", "numpy", "--ops", "seed [64,7,7]",
                     option, str(path)]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("gpupool bench: error: ")
    assert f"{option} {str(path)!r}" in err and reason in err
    assert sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "file").read_text() == "kept"


def test_output_check_keeps_an_existing_file_and_leaves_no_new_one(tmp_path):
    existing, new = tmp_path / "existing.md", tmp_path / "new.md"
    existing.write_text("kept")
    report.check_output_path("--markdown", str(existing))
    report.check_output_path("--markdown", str(new))
    assert existing.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.md"]


def test_unwritable_output_in_run_is_found_before_running(monkeypatch, tmp_path):
    _no_run(monkeypatch)
    with pytest.raises(ValueError, match="--json .*is a directory"):
        runner.run("small", ["seed [64,7,7]"], "numpy", json_path=str(tmp_path))


@pytest.mark.parametrize("ops", [[""], ["  "], ["max", ""]])
def test_blank_ops_is_an_error_not_every_case(monkeypatch, capsys, ops):
    """Regression: ``--ops ''`` matched every case name and ran the whole suite."""
    _no_run(monkeypatch)
    assert cli.main(["bench", "--backend", "numpy", "--ops", *ops]) == 2
    err = _one_line_error(capsys)
    assert "--ops" in err and "every case" in err
    assert all(repr(o) in err for o in ops if not o.strip())
    with pytest.raises(ValueError, match="--ops"):
        cases.select_cases(ops)


def test_ops_without_a_value_is_an_error(monkeypatch, capsys):
    _no_run(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--backend", "numpy", "--ops"])
    assert exit_.value.code == 2
    assert "--ops" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--ops: no op or case name given"):
        cases.select_cases([])


@pytest.mark.parametrize("command", ["info", "bench"])
@pytest.mark.parametrize("value", ["abc", "0"])
def test_bad_thread_count_variable_is_a_one_line_error(command, value):
    """A bad GPUPOOL_NUM_THREADS is reported on one line naming the variable and its value,
    with a non-zero status, before anything runs (it was a traceback)."""
    env = dict(os.environ, GPUPOOL_NUM_THREADS=value)
    argv = [sys.executable, "-m", "gpupool.cli", command]
    done = subprocess.run(argv + (["--ops", "nosuchop"] if command == "bench" else []),
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "GPUPOOL_NUM_THREADS" in done.stderr and value in done.stderr


def test_bench_exits_1_when_a_case_fails_its_check(monkeypatch, capsys):
    """A baseline that disagrees fails the case, and the command's status says so."""
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    monkeypatch.setattr(baselines, "onnxruntime_call",
                        lambda case, x: (lambda: np.zeros((1, 64, 1, 1), np.float32), None))
    _fast_host_timing(monkeypatch)
    assert cli.main(["bench", "--backend", "numpy", "--ops", "seed [64,7,7]"]) == 1
    out, err = capsys.readouterr()
    assert "FAILED: values differ (vs onnxruntime)" in out
    assert "1 case(s) failed: seed [64,7,7] global avg" in err


def test_bench_exits_1_when_a_case_raises(monkeypatch, capsys):
    def broken(case, x):
        raise RuntimeError("broken case")
    monkeypatch.setattr(cases, "gpupool_call", broken)
    _fast_host_timing(monkeypatch)
    assert cli.main(["bench", "--backend", "numpy", "--ops", "seed [64,7,7]"]) == 1
    out, err = capsys.readouterr()
    assert "error: RuntimeError: broken case" in out
    assert "1 case(s) failed: seed [64,7,7] global avg" in err


def test_ci_runs_the_small_suite_with_options_the_command_takes():
    """.ci/run ends with the README's main command on the small suite, its results in a
    temporary folder; its options must parse (set -e then fails CI on bench's exit status)."""
    import pathlib
    import shlex
    script = (pathlib.Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[bench]"' in script and "set -euo pipefail" in script
    command = script[script.rindex("\ngpupool bench ") + 1:].replace("\\\n", " ").strip()
    argv = shlex.split(command.replace('"$results/', '"/tmp/'))
    args = cli.parsers()[0].parse_args(argv[1:])
    assert (args.command, args.size, args.ops, args.backend) == ("bench", "small", None, "auto")
    assert args.json == "/tmp/bench.json" and args.markdown == "/tmp/bench.md"


@pytest.mark.parametrize("version, words", [(13020, "13.2"), (12080, "12.8"), (11000, "11.0"),
                                            (12010, "12.1"), (13000, "13.0")])
def test_cuda_versions_read_as_major_minor(version, words):
    assert cli.cuda_version(version) == words


def test_info_prints_cuda_runtime_and_driver_as_major_minor(monkeypatch, capsys):
    cupy = pytest.importorskip("cupy")
    runtime = cupy.cuda.runtime
    monkeypatch.setattr(probe, "gpu_usable", lambda: (True, "1 GPU(s)"))
    monkeypatch.setattr(runtime, "runtimeGetVersion", lambda: 13020)
    monkeypatch.setattr(runtime, "driverGetVersion", lambda: 12080)
    monkeypatch.setattr(runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(runtime, "getDeviceProperties", lambda dev: {
        "name": b"Some GPU", "multiProcessorCount": 132, "major": 9, "minor": 0})
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "CUDA runtime 13.2" in out and "driver 12.8" in out
    assert "13020" not in out and "12080" not in out


# ----------------------------------------------------------------------------- bench/run.py

def _bench_script(name: str):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "bench" / name
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_script():
    import datetime
    return _bench_script("run.py"), datetime.date.today().isoformat()


def test_run_script_never_overwrites_results_without_force(monkeypatch, tmp_path, capsys):
    """Regression: a partial run (--ops) overwrote the committed results of the same date."""
    script, today = _run_script()
    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
    full = tmp_path / f"bench-numpy-small-{today}.md"
    full.write_text("committed")
    args = ["--backend", "numpy", "--results-dir", str(tmp_path)]
    assert script.main(args) == 1
    assert str(full) in capsys.readouterr().err and not calls
    assert full.read_text() == "committed"
    assert script.main(args + ["--force"]) == 0
    (argv,) = calls
    stem = str(tmp_path / f"bench-numpy-small-{today}")
    assert argv == ["bench", "--size", "small", "--backend", "numpy", "--json", stem + ".json",
                    "--markdown", stem + ".md", "--plot", stem + ".png"]


def test_run_script_names_partial_runs_apart(monkeypatch, tmp_path):
    script, today = _run_script()
    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
    (tmp_path / f"bench-numpy-small-{today}.json").write_text("committed")
    assert script.main(["--backend", "numpy", "--ops", "gavg", "--no-plot",
                        "--results-dir", str(tmp_path)]) == 0
    (argv,) = calls
    stem = str(tmp_path / f"bench-numpy-small-{today}-partial")
    assert argv == ["bench", "--size", "small", "--backend", "numpy", "--json", stem + ".json",
                    "--markdown", stem + ".md", "--ops", "gavg"]
    (tmp_path / f"bench-numpy-small-{today}-partial.md").write_text("earlier partial run")
    assert script.main(["--backend", "numpy", "--ops", "gavg",
                        "--results-dir", str(tmp_path)]) == 1


# ----------------------------------------------------------------------------- on the GPU

#: The seed cases: tiny, and between them a max, a padded average (plain CuPy's baseline then
#: goes through cupyx.scipy.ndimage) and a global average. Output bytes counted by hand.
SEED_BYTES = {"seed [64,56,56] max 2x2 s2": 4 * (64 * 56 * 56 + 64 * 28 * 28),
              "seed [64,56,56] avg 3x3 s2 p1": 4 * (64 * 56 * 56 + 64 * 28 * 28),
              "seed [64,7,7] global avg": 4 * (64 * 7 * 7 + 64)}


@pytest.mark.gpu
def test_gpu_bench_checks_each_case_against_the_cpu_and_counts_its_bytes(monkeypatch, capsys):
    """Regression: the GPU rows took a CuPy array's ``.data`` (its device pointer) for a
    QArray's codes, so every check read 'FAILED: shape ()' and the output counted 8 bytes."""
    time_gpu = timing.time_gpu
    monkeypatch.setattr(timing, "time_gpu", lambda f, reps=50: time_gpu(f, 3))
    result = runner.run("small", ["seed"], "cupy")
    assert [r["case"] for r in result["rows"]] == list(SEED_BYTES)
    for row in result["rows"]:
        assert row["error"] is None, row
        assert "numpy backend" in row["checks"] and set(row["checks"].values()) == {"ok"}, row
        for name in ("torch", "cupy"):  # a baseline is timed only when checked
            assert (name in row["checks"]) == (row.get(f"{name}_ms") is not None), row
        assert row["bytes"] == SEED_BYTES[row["case"]]
        assert row["gpupool_ms"] > 0 and row["first_call_ms"] > 0
    assert "seed [64,7,7] global avg" in capsys.readouterr().out


def test_bench_reads_values_and_counts_bytes_of_every_result_kind(backend):
    """A QArray's codes (not a CuPy array's ``.data`` pointer), and indices counted in the
    bytes a case writes."""
    import gpupool
    codes = np.arange(-8, 8, dtype=np.int8).reshape(1, 1, 4, 4)
    q = gpupool.quantized.max_pool(gpupool.quantized.QArray(backend.to_backend(codes), 0.1, 0), 2)
    assert_array_equal(cases.values(q), [[[[-3, -1], [5, 7]]]])
    assert cases.output_bytes(q) == 4
    x = backend.to_backend(codes.astype(np.float32))
    assert_array_equal(cases.values(gpupool.max_pool(x, 2)), [[[[-3, -1], [5, 7]]]])
    assert cases.output_bytes(gpupool.max_pool(x, 2)) == 4 * 4
    assert cases.output_bytes(gpupool.max_pool(x, 2, return_indices=True)) == 4 * (4 + 8)


@pytest.mark.gpu
def test_profile_script_runs_each_case_once_inside_the_profiler_range(capsys):
    import cupy
    assert _bench_script("profile.py").main(["--size", "small", "--ops", "seed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(SEED_BYTES)
    for line, fewest in zip(lines, SEED_BYTES.values()):
        assert f"fewest bytes {fewest} " in line
    ranges = getattr(cupy.cuda.profiler, "ranges", None)  # kept by the CPU executor only
    if ranges is not None:
        cases = ranges[-len(SEED_BYTES):]
        assert all(r["launches"] and not r["compiles"] for r in cases), cases


def test_measure_script_sets_each_measured_case_beside_the_model_of_its_gpu(tmp_path, capsys):
    """bench/measure.py --compare: the CUPTI time where there is one (else the events'), the
    model's time and bound on the measured GPU's profile, their ratio, PyTorch's time; a
    case that raised keeps its error."""
    measured = {"gpu": "NVIDIA H100 80GB HBM3", "method": "median", "cases": [
        {"case": "a", "gpupool": {"cupti": 2e-6, "events": 3e-6},
         "torch": {"cupti": None, "events": 5e-6}, "sm_clock_mhz": 1500.0},
        {"case": "b", "error": "RuntimeError: no", "sm_clock_mhz": None}]}
    model = {"devices": ["H200 at 1500 MHz", "H100 SXM at 1500 MHz"], "cases": [
        {"case": "a", "devices": {"H200 at 1500 MHz": {"seconds": 1e-6, "bound": "dram"},
                                  "H100 SXM at 1500 MHz": {"seconds": 4e-6, "bound": "issue"}}}]}
    paths = [tmp_path / "measured.json", tmp_path / "model.json"]
    for path, data in zip(paths, (measured, model)):
        path.write_text(json.dumps(data))
    assert _bench_script("measure.py").main(["--compare", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "modeled: H100 SXM at 1500 MHz" in out
    assert "| a | 2.0 | 1500 | 4.0 | instructions | 0.50 | 5.0 |" in out.splitlines()
    assert "| b | RuntimeError: no | - | - | - | - | - |" in out.splitlines()


def test_measure_script_times_each_call_and_each_of_its_gpu_events():
    """bench/measure.py: the calls between flush kernels, each one's busy time from its first
    kernel's start to its last kernel's end, and its events' median starts and durations."""
    measure = _bench_script("measure.py")

    def ev(cat, name, ts, dur):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur}

    events = []
    for t0, check in ((0, 10), (1000, 14), (2000, 12)):
        events += [ev("kernel", "l2_flush", t0, 50),
                   ev("gpu_memset", "Memset (Device)", t0 + 60, 1),
                   ev("kernel", "void check<int>(long const*, int*)", t0 + 62, check),
                   ev("gpu_memcpy", "Memcpy DtoH", t0 + 62 + check + 2, 2),
                   ev("cpu_op", "aten::empty", t0 + 70, 5),
                   ev("kernel", "void grad<float>(float const*)", t0 + 120, 30)]
    calls = measure.traced_calls({"traceEvents": events[::-1]}, 3)
    assert [len(c) for c in calls] == [4, 4, 4]
    assert measure.traced_calls({"traceEvents": events}, 4) is None
    assert measure.busy(calls) == pytest.approx(88e-6)  # 62 .. 150 from each flush
    assert measure.breakdown(calls) == [
        {"cat": "gpu_memset", "name": "Memset (Device)", "start": 0.0, "seconds": 1e-6},
        {"cat": "kernel", "name": "check<int>", "start": pytest.approx(2e-6),
         "seconds": pytest.approx(12e-6)},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH", "start": pytest.approx(16e-6),
         "seconds": pytest.approx(2e-6)},
        {"cat": "kernel", "name": "grad<float>", "start": pytest.approx(60e-6),
         "seconds": pytest.approx(30e-6)}]
    assert measure.breakdown(calls[:2] + [calls[2][:3]]) is None  # the calls differ


def test_issued_script_names_each_launch_by_the_marker_before_it(tmp_path, monkeypatch,
                                                                capsys):
    """bench/issued.py parse: ncu's CSV rows grouped into launches, each launch given the case
    of the marker kernel before it (its grid size the case's number); compare: the model's
    launch beside the counted one, a bool template argument as either spells it."""
    issued = _bench_script("issued.py")
    monkeypatch.setattr(issued, "all_cases", lambda: [types.SimpleNamespace(name=n)
                                                      for n in ("a", "b", "c")])
    head = ('"ID","Kernel Name","Block Size","Grid Size","Metric Name","Metric Unit",'
            '"Metric Value"\n')

    def row(i, name, grid, metric, value):
        return f'"{i}","{name}","(32, 1, 1)","({grid}, 1, 1)","{metric}","","{value}"\n'

    csv_text = ("==PROF== Connected\n" + head
                + row(0, "case_marker", 3, "smsp__inst_executed.sum", 5)
                + row(1, "void k<1, float>(const float *)", 8, "smsp__inst_executed.sum",
                      "1,200")
                + row(1, "void k<1, float>(const float *)", 8, "dram__bytes.sum", 64)
                + row(1, "void k<1, float>(const float *)", 8,
                      "smsp__inst_executed_pipe_alu.sum", 600)
                + row(2, "case_marker", 1, "smsp__inst_executed.sum", 5)
                + row(3, "void j(int)", 2, "smsp__inst_executed.sum", 30)
                + row(4, "void r<float, (int)-1>(const T1 *, int)", 4,
                      "smsp__inst_executed.sum", 7))
    (tmp_path / "ncu.csv").write_text(csv_text)
    assert issued.main(["parse", str(tmp_path / "ncu.csv"), "--gpu", "NVIDIA H200",
                        "--results-dir", str(tmp_path), "--sm-clock", "1500"]) == 0
    (path,) = tmp_path.glob("issued-h200-*.json")
    result = json.loads(path.read_text())
    assert result["gpu"] == "NVIDIA H200" and result["sm_clock_mhz"] == 1500
    assert result["cases"] == [
        {"case": "c", "launches": [{"kernel": "k<1, float>", "grid": [8, 1, 1],
                                    "block": [32, 1, 1], "warp_instructions": 1200.0,
                                    "dram_bytes": 64.0, "alu_warp_instructions": 600.0}]},
        {"case": "a", "launches": [{"kernel": "j", "grid": [2, 1, 1], "block": [32, 1, 1],
                                    "warp_instructions": 30.0},
                                   {"kernel": "r<float, -1>", "grid": [4, 1, 1],
                                    "block": [32, 1, 1], "warp_instructions": 7.0}]}]
    model = {"cases": [{"case": "c", "launches": [
        {"kernel": "k<true, float>", "grid": [8, 1, 1], "warp_instructions": 600.0,
         "pipe_warp_instructions": {"alu": 300.0}}]},
        {"case": "a", "launches": [{"kernel": "j", "grid": [2, 1, 1],
                                    "warp_instructions": 20.0}]}]}
    (tmp_path / "model.json").write_text(json.dumps(model))
    assert issued.compare(str(path), [str(tmp_path / "model.json")]) == [
        ("c", "k<true, float>", 600.0, 1200.0, 300.0, 600.0), ("a", "j", 20.0, 30.0, None, None)]
    assert issued.main(["compare", str(path), str(tmp_path / "model.json")]) == 0
    out = capsys.readouterr().out
    assert "| c | `k<true, float>` | 0.00 | 0.00 | 0.50 | 0.50 |" in out
    assert "| a | `j` | 0.00 | 0.00 | 0.67 | - |" in out


def test_measure_script_refuses_to_run_without_a_gpu(capsys):
    if subprocess.run([sys.executable, "-c", "import cupy; assert "
                       "cupy.cuda.runtime.getDeviceCount() > 0"], capture_output=True).returncode == 0:
        pytest.skip("CuPy sees a GPU here")
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[1] / "bench" / "measure.py"
    done = subprocess.run([sys.executable, str(script), "--compile-workers", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no usable GPU" in done.stderr, done.stderr


def test_measure_script_refuses_to_leave_out_the_published_workloads(tmp_path, monkeypatch):
    """Without the calibration folder's workloads a run would time the suite alone under the
    name of the whole set: it stops instead and says where they were looked for."""
    from gpumodel import calibration
    measure = _bench_script("measure.py")
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    with pytest.raises(SystemExit, match="no published workloads at .*GPUPOOL_CALIBRATION"):
        measure.cases(False)
    assert measure.cases(True)  # the cases beyond the suite need none

def test_gpu_job_checks_its_stages_first_and_refuses_a_machine_without_a_gpu(tmp_path):
    """.ci/gpu: an unknown stage stops it before anything runs; the GPU stages refuse to run
    where CuPy sees no GPU (the gpu tests would silently fall back to the executor)."""
    import os
    import pathlib
    job = pathlib.Path(__file__).resolve().parents[1] / ".ci" / "gpu"
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(job), str(tmp_path), "probe", "nosuch"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown stage: nosuch" in done.stderr
    assert not (tmp_path / "gpu-job.log").exists()
    if subprocess.run([sys.executable, "-c", "import cupy; assert "
                       "cupy.cuda.runtime.getDeviceCount() > 0"], capture_output=True).returncode == 0:
        pytest.skip("CuPy sees a GPU here: the job would run")
    done = subprocess.run(["bash", str(job), str(tmp_path), "tests", "bench"], env=env,
                          capture_output=True, text=True, timeout=120)
    log = (tmp_path / "gpu-job.log").read_text()
    assert done.returncode == 1 and log.count("no GPU visible to CuPy: stage refused") == 2
    assert log.rstrip().endswith("gpu job: FAILED")


def test_bench_overhead_section_in_json_and_markdown(tmp_path, monkeypatch):
    """Every overhead case is checked against its baselines and timed per call, in both
    outputs; a suite case selected with it keeps its own table."""
    _fast_host_timing(monkeypatch)
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    assert cli.main(["bench", "--backend", "numpy", "--ops", "overhead", "seed [64,7,7]",
                     "--json", str(js), "--markdown", str(md)]) == 0
    result, text = json.loads(js.read_text()), md.read_text()
    assert [r["case"] for r in result["rows"]] == ["seed [64,7,7] global avg"]
    rows = result["overhead"]["rows"]
    assert [r["case"] for r in rows] == [c.name for c in cases.OVERHEAD]
    assert {r["dtype"] for r in rows} == {"float32", "int8"}
    assert {tuple(r["shape"]) for r in rows} == {(1, 4, 8, 8), (1, 64, 7, 7)}
    assert {c.op for c in cases.OVERHEAD} >= {"max", "avg", "lp", "gavg", "aavg", "amax",
                                              "qmax"}
    for r in rows:
        assert r["error"] is None and r["check"].startswith("ok"), r
        assert r["gpupool_us"] > 0 and r["times_s"]["gpupool"]["n"] >= 1
        for name in ("torch", "onnxruntime", "gpupool_tensor", "gpupool_tensor_grad",
                     "torch_grad"):
            if f"{name}_us" in r:
                assert r[f"{name}_over_gpupool"] == pytest.approx(
                    r[f"{name}_us"] / r["gpupool_us"], rel=0.01, abs=0.01)
            else:
                assert r["missing"][name]
        # the float ops on a tensor, untracked and requiring grad, beside PyTorch's own
        float_op = r["dtype"] == "float32"
        for name in ("gpupool_tensor", "gpupool_tensor_grad", "torch", "torch_grad"):
            assert (f"{name}_us" in r) == float_op, (name, r)
        if float_op:
            assert {"gpupool tensor", "gpupool tensor grad", "torch grad"} <= set(r["checks"])
    assert "### Fixed cost per call" in text
    assert "| gpupool us | gpupool_tensor us (x) | gpupool_tensor_grad us (x) |" in text
    for r in rows:
        assert f"| {r['case']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} |" in text


def test_overhead_only_selects_no_suite_case(monkeypatch):
    _fast_host_timing(monkeypatch)
    result = runner.run("small", ["overhead 4x8x8 adaptive max"], "numpy")
    assert result["rows"] == []
    (row,) = result["overhead"]["rows"]
    assert row["check"] == "ok (vs torch, gpupool tensor, gpupool tensor grad, torch grad)"


def test_overhead_case_failing_its_check_fails_the_bench(monkeypatch, capsys):
    _fast_host_timing(monkeypatch)
    monkeypatch.setattr(baselines, "torch_modules", lambda: (None, None))
    monkeypatch.setattr(checks, "reference_values", lambda case, x: np.zeros((1, 4, 3, 3)))
    assert cli.main(["bench", "--backend", "numpy", "--ops", "overhead 4x8x8 adaptive max"]) == 1
    assert "1 case(s) failed: overhead 4x8x8 adaptive max ->3x3" in capsys.readouterr().err


def test_launch_timing_reports_host_and_synced_loop_times_per_call():
    calls, syncs = [], []
    host, loop = timing.time_launches(lambda: calls.append(1), lambda: syncs.append(len(calls)),
                                      reps=12, loops=3)
    assert len(host) == 12 and len(loop) == 3 and min(host + loop) > 0
    assert len(calls) == 1 + 12 + 3 * 4
    assert syncs == [1, 13, 17, 21, 25]  # after the warm-up, the host calls, each loop


@pytest.mark.parametrize("op", ["lp", "amax", "aavg"])
def test_reference_of_the_new_overhead_ops_matches_gpupool(op):
    (case,) = [c for c in cases.OVERHEAD if c.op == op and c.sample == (4, 8, 8)]
    x = cases.make_input(case, 1)
    got = cases.values(cases.gpupool_call(case, x)())
    np.testing.assert_allclose(got, checks.reference_values(case, x), rtol=1e-5, atol=1e-6)


def test_a_reader_that_leaves_early_gets_no_traceback():
    # gpupool info | head -1: the lines after the first meet a closed pipe
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "info"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("gpupool ")
    proc.stdout.close()
    with proc.stderr:
        stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 1, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
