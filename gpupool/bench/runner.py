"""Running the suite: each case checked, then timed (its first call, compile included,
reported apart), then the overhead section; the result dict with the device, the library
versions and the commit."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import gpupool

from ..cuda import probe
from . import baselines, cases, checks, report, timing

OVERHEAD_ROUNDS = 5  # rounds of :func:`.timing.time_host` per overhead case (each call is short)


def preflight(ops=None, outputs: dict | None = None) -> list[cases.Case]:
    """The selected cases, once every argument problem that would stop a run has been ruled
    out: ``ops`` (``select_cases``), each output path of ``outputs`` (option -> path or
    None; ``check_output_path``), and matplotlib for a ``--plot`` path. ``ValueError`` or
    ``ImportError`` otherwise."""
    selected = cases.select_cases(ops, cases.SUITE + cases.BACKWARD)
    outputs = {option: path for option, path in (outputs or {}).items() if path}
    if "--plot" in outputs:
        report.require_matplotlib()
    for option, path in outputs.items():
        report.check_output_path(option, path)
    return selected


def run_case(case: cases.Case, size: str, gpu: bool, overhead: bool = False) -> report.Row:
    """Check ``case``, then time it. ``overhead``: on the GPU, host and loop times per call
    (:func:`.timing.time_launches`, names ``X`` and ``X_loop``) instead of device times."""
    n = cases.batch_size(case, size)
    row = report.Row(case.name, "cupy" if gpu else "numpy", case.shape(n), case.dtype, case.layout)
    try:
        if gpu:
            import cupy

            def time_gpu_call(name, g):
                if overhead:
                    row.times_s[name], row.times_s[f"{name}_loop"] = timing.time_launches(
                        g, cupy.cuda.Device().synchronize)
                else:
                    row.times_s[name] = timing.time_gpu(g)
            x = cases.make_input(case, n, cupy)
            f = cases.gpupool_call(case, x)
            t0 = time.perf_counter()
            result = f()
            cupy.cuda.get_current_stream().synchronize()
            row.first_call_s = time.perf_counter() - t0
            got = cases.values(result)
            on_host = cases.values(cases.gpupool_call(case, x.get())())
            row.checks["numpy backend"] = checks.check_values(got, on_host, case.dtype)
            row.bytes = int(cases.read_bytes(f, x) + cases.output_bytes(result))
            time_gpu_call("gpupool", f)
            calls = {"torch": baselines.torch_call(case, x, "cuda"),
                     "cupy": baselines.cupy_call(case, x)}
            timed = {}
            for name, (bf, why) in calls.items():  # each baseline timed is checked
                try:
                    want = None if bf is None else bf()
                except Exception as e:  # noqa: BLE001 - e.g. a dtype the library lacks
                    bf, why = None, f"{type(e).__name__}: {str(e)[:100]}"
                if bf is None:
                    row.missing[name] = why
                else:
                    row.checks[name] = checks.check_values(
                        got, baselines.baseline_values(case, want), case.dtype)
                    timed[name] = bf
            row.check = checks.check_summary(row.checks)
            for name, bf in timed.items():
                time_gpu_call(name, bf)
        else:
            x = cases.make_input(case, n)
            f = cases.gpupool_call(case, x)
            t0 = time.perf_counter()
            result = f()
            row.first_call_s = time.perf_counter() - t0
            got = cases.values(result)
            row.bytes = int(cases.read_bytes(f, x) + cases.output_bytes(result))
            calls = {"torch": baselines.torch_call(case, x, "cpu"),
                     "onnxruntime": baselines.onnxruntime_call(case, x)}
            if overhead:  # the fixed cost of a tensor, untracked and tracked by autograd
                calls.update(gpupool_tensor=cases.tensor_call(case, x),
                             gpupool_tensor_grad=cases.tensor_call(case, x, True),
                             torch_grad=baselines.torch_call(case, x, "cpu", True))
            baseline_names = ("torch", "onnxruntime", "torch_grad")
            funcs, setups = {"gpupool": f}, {}
            for name, (bf, why) in calls.items():  # each call timed is checked
                if bf is None:
                    row.missing[name] = why
                    continue
                want = bf()
                row.checks[name.replace("_", " ")] = checks.check_values(
                    got, baselines.baseline_values(case, want) if name in baseline_names
                    else cases.values(want), case.dtype)
                if name.startswith("torch"):  # PyTorch at its best: one thread or every core
                    torch = baselines.torch_modules()[0]
                    for n in sorted({1, os.cpu_count() or 1}):
                        funcs[f"{name}@{n}"] = bf
                        setups[f"{name}@{n}"] = lambda n=n: torch.set_num_threads(n)
                else:
                    funcs[name] = bf
            if not set(row.checks) & {"torch", "onnxruntime"}:
                row.checks["reference"] = checks.check_values(
                    got, checks.reference_values(case, x), case.dtype)
            row.check = checks.check_summary(row.checks)
            times = timing.time_host(funcs, setups=setups,
                                     **({"rounds": OVERHEAD_ROUNDS} if overhead else {}))
            for name in ("torch", "torch_grad"):  # at the faster of its thread counts
                runs = {int(k.split("@")[1]): times.pop(k) for k in list(times)
                        if k.split("@")[0] == name}
                if runs:
                    threads = min(runs, key=lambda n: np.median(runs[n]))
                    times[name] = runs[threads]
                    if name == "torch":
                        row.torch_threads = threads
            row.times_s.update(times)
    except Exception as e:  # noqa: BLE001 - a broken case is reported, the sweep goes on
        row.error = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def device_name(gpu: bool) -> str:
    if gpu:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"


def versions(gpu: bool) -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__,
           "gpupool": gpupool.__version__}
    for mod in ("torch", "onnxruntime") + (("cupy",) if gpu else ()):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    if gpu:
        import cupy
        out["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)),
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _progress(items, label: str):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=label, file=sys.stderr, leave=False)
    except ImportError:
        def plain():
            for i, item in enumerate(items, 1):
                print(f"\r{label}: {i}/{len(items)}", end="", file=sys.stderr, flush=True)
                yield item
            print(file=sys.stderr)
        return plain()


def run(size: str = "small", ops=None, backend: str = "auto", json_path=None,
        markdown_path=None, plot_path=None) -> dict:
    """Run the suite; print the table; write the files asked for; return the result dict.

    Bad ``ops`` or an output path that cannot be written (``ValueError``) and a ``plot_path``
    without matplotlib (``ImportError``) are reported before anything runs (``preflight``)."""
    selected = preflight(ops, report.output_options(json_path, markdown_path, plot_path))
    overhead_selected = cases.select_cases(ops, cases.OVERHEAD)
    usable, reason = probe.gpu_usable()
    if backend == "cupy" and not usable:
        raise SystemExit(f"gpupool bench: --backend cupy asked for, but {reason}")
    gpu = backend == "cupy" or (backend == "auto" and usable)
    if gpu:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
    else:
        torch, _ = baselines.torch_modules()
        if torch is not None:
            torch.set_num_threads(os.cpu_count() or 1)
    copy_bw = timing.copy_bandwidth(gpu)
    rows = []
    for case in _progress(selected, "gpupool bench"):
        rows.append(run_case(case, size, gpu))
        if gpu:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
    result = {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "device": device_name(gpu), "backend": "cupy" if gpu else "numpy", "size": size,
              "gpu_status": reason, "versions": versions(gpu), "commit": git_commit(),
              "copy_bw_gbps": round(copy_bw / 1e9, 2)}
    result.update(report.summarise(rows, copy_bw, gpu))
    for r, row in zip(result["rows"], rows):
        r["bytes"] = row.bytes
        r["times_s"] = report.spreads(row.times_s)
    result["overhead"] = report.summarise_overhead(
        [run_case(case, "small", gpu, overhead=True)
         for case in _progress(overhead_selected, "gpupool bench overhead")])
    text = report.markdown(result)
    if result["overhead"]["rows"]:
        text += "\n" + report.overhead_markdown(result)
    print(text)
    for path, write in ((json_path, lambda p: Path(p).write_text(json.dumps(result, indent=1))),
                        (markdown_path, lambda p: Path(p).write_text(text)),
                        (plot_path, lambda p: report.plot(result, p))):
        if path:
            try:
                write(path)
                print(f"wrote {path}", file=sys.stderr)
            except ImportError as e:
                print(f"gpupool bench: {path} not written ({e})", file=sys.stderr)
    return result
