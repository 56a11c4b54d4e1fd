#!/usr/bin/env python3
"""Measured GPU times of the cases bench/model.py models, to set beside the modeled ones.

On a machine with an NVIDIA GPU and CuPy: every case of the model (the suite and the backward
rows at their --size large shape, and each published TileOPs workload gpupool runs; --beyond:
the cases beyond the suite) is run through gpupool and timed as the published measurements
were: L2 flushed before every call, the median over --reps calls of the device-busy time of
the call's kernels (CUPTI, through PyTorch's profiler; without PyTorch, CUDA events around the
call, which also count the gaps between its launches), and each of the call's GPU events
(kernels, copies, memsets: median start from the call's first event, median duration). Each
published workload also runs through PyTorch's own op on the same input, timed the same way.
The SM clock is read after each case: lock it first (``nvidia-smi -lgc 1500``, the published
measurements' clock) for figures comparable with the model's.

  python bench/measure.py                       # writes bench/results/measured-<gpu>-<date>.json
  python bench/measure.py --beyond
  python bench/measure.py --compare bench/results/measured-h100-2026-11-26.json \\
      bench/results/model-2026-11-28.json        # measured beside modeled (no GPU needed)

Before timing, ``--compile-workers`` processes run each case once, so that NVRTC's compiles
run in parallel and land in gpupool's kernel cache.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]
RESULTS = os.path.join(HERE, "results")
#: bytes written between two timed calls: over twice an H200's 60 MiB (an H100's 50 MiB) of L2
FLUSH_BYTES = 256 << 20


def cases(beyond: bool) -> list:
    """The modeled cases, in bench/model.py's order; the suite's come with the published
    workloads, which must be in the calibration folder."""
    from gpumodel import benchmodel, calibration
    if beyond:
        return benchmodel.beyond_suite_cases()
    workloads = calibration.calibration_file("workloads.json")
    if not workloads.is_file():  # a run without them would not be the whole set, unsaid
        raise SystemExit(f"bench/measure.py: no published workloads at {workloads}; set "
                         f"GPUPOOL_CALIBRATION to the calibration folder")
    return benchmodel.modeled_cases() + benchmodel.workload_cases(workloads)


def full_input(case):
    """The case's input at its full shape, drawn on the GPU (NumPy's draw of a 256 MiB input
    takes a second of host time)."""
    import cupy
    from gpumodel import benchmodel
    shape = benchmodel.full_shape(case)
    cupy.random.seed(0)
    if case.dtype in ("int8", "uint8"):
        info = cupy.iinfo(case.dtype)
        return cupy.random.randint(int(info.min), int(info.max) + 1, size=shape).astype(case.dtype)
    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(case.dtype)


def _run_once(beyond: bool, index: int) -> str | None:
    """Run case ``index`` once (its kernels compiled and cached); an error's text, else None."""
    from gpumodel import benchmodel
    case = cases(beyond)[index]
    try:
        benchmodel.prepared_call(case, full_input(case))[0]()
        import cupy
        cupy.cuda.Device().synchronize()
    except Exception as e:  # noqa: BLE001 - reported with the case's name
        return f"{case.name}: {type(e).__name__}: {e}"
    return None


def compile_ahead(beyond: bool, workers: int) -> list[str]:
    """Run every case once in ``workers`` processes; the errors."""
    count = len(cases(beyond))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        return [e for e in pool.map(_run_once, [beyond] * count, range(count)) if e]


def torch_call(case, x):
    """PyTorch's own op of a published workload on CuPy input ``x`` (shared, not copied), or
    None where PyTorch has no such op."""
    import torch
    import torch.nn.functional as F
    if getattr(case, "workload", "") == "" or case.layout != "NCHW":
        return None
    t = torch.as_tensor(x, device="cuda")
    nd = len(case.output_size) if case.op in ("aavg", "amax") else len(case.kernel)
    if case.op == "max":
        op = getattr(F, f"max_pool{nd}d")
        return lambda: op(t, case.kernel, case.stride, case.padding, case.dilation,
                          case.ceil_mode, return_indices=case.indices)
    if case.op == "avg":
        op = getattr(F, f"avg_pool{nd}d")
        if nd == 1:
            if case.divisor_override is not None:
                return None
            return lambda: op(t, case.kernel, case.stride, case.padding, case.ceil_mode,
                              case.count_include_pad)
        return lambda: op(t, case.kernel, case.stride, case.padding, case.ceil_mode,
                          case.count_include_pad, case.divisor_override)
    if case.op == "amax":
        op = getattr(F, f"adaptive_max_pool{nd}d")
        return lambda: op(t, case.output_size, return_indices=case.indices)
    return lambda: getattr(F, f"adaptive_avg_pool{nd}d")(t, case.output_size)


FLUSH_SOURCE = r"""
extern "C" __global__ void l2_flush(unsigned int* buffer, unsigned long long words) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < words; i += (unsigned long long)gridDim.x * blockDim.x)
        buffer[i] = (unsigned int)i;
}
"""


class Timer:
    """Times a call: L2 flushed before each (kernel ``l2_flush``), the device-busy time of its
    kernels (CUPTI through PyTorch's profiler), and CUDA events around it."""

    def __init__(self, reps: int, warmup: int = 3):
        import cupy
        self.reps, self.warmup = reps, warmup
        self.buffer = cupy.empty(FLUSH_BYTES // 4, dtype=cupy.uint32)
        self.kernel = cupy.RawKernel(FLUSH_SOURCE, "l2_flush")
        try:
            import torch
            self.torch = torch if torch.cuda.is_available() else None
        except ImportError:
            self.torch = None

    def flush(self):
        import numpy as np
        self.kernel((1024,), (256,), (self.buffer, np.uint64(self.buffer.size)))

    def seconds(self, f) -> dict:
        """{"cupti": median device-busy seconds (None without PyTorch), "events": median
        seconds between CUDA events recorded before and after the call, "kernels": the call's
        GPU events (:func:`breakdown`; absent without PyTorch)}."""
        import contextlib
        import cupy
        for _ in range(self.warmup):
            self.flush()
            f()
        cupy.cuda.Device().synchronize()
        marks = []
        if self.torch is None:
            profile = contextlib.nullcontext()
        else:
            from torch.profiler import ProfilerActivity, profile as torch_profile
            profile = torch_profile(activities=[ProfilerActivity.CUDA])
        with profile:
            for _ in range(self.reps):
                self.flush()
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                f()
                end.record()
                marks.append((start, end))
            cupy.cuda.Device().synchronize()
        events = statistics.median(cupy.cuda.get_elapsed_time(a, b) * 1e-3 for a, b in marks)
        if self.torch is None:
            return {"cupti": None, "events": events}
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            profile.export_chrome_trace(path)
            with open(path) as f:
                calls = traced_calls(json.load(f), self.reps)
        return {"cupti": busy(calls), "events": events, "kernels": breakdown(calls)}


#: The trace categories of a call's GPU events.
GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def traced_calls(trace: dict, reps: int) -> list[list[dict]] | None:
    """Each timed call's GPU events in order of start, told apart by the flush kernels
    between them (None if there are not ``reps`` calls)."""
    found = sorted((e for e in trace.get("traceEvents", ()) if e.get("cat") in GPU_EVENTS),
                   key=lambda e: e["ts"])
    calls = []
    for e in found:
        if e["name"] == "l2_flush":
            calls.append([])
        elif calls:
            calls[-1].append(e)
    calls = [c for c in calls if c]
    return calls if len(calls) == reps else None


def busy(calls) -> float | None:
    """Median over the calls of the first kernel's start to the last kernel's end, s."""
    kernels = [[e for e in c if e["cat"] == "kernel"] for c in calls or ()]
    if not kernels or not all(kernels):
        return None
    return statistics.median((k[-1]["ts"] + k[-1]["dur"] - k[0]["ts"]) * 1e-6 for k in kernels)


def breakdown(calls) -> list[dict] | None:
    """The GPU events of a call, in order: each one's category, name (a kernel's without its
    arguments), median start from the call's first event and median duration, s (None where
    the calls do not run the same events)."""
    if not calls:
        return None
    names = [[(e["cat"], e["name"]) for e in c] for c in calls]
    if any(n != names[0] for n in names):
        return None
    return [{"cat": cat,
             "name": name.split("(", 1)[0].removeprefix("void ") if cat == "kernel" else name,
             "start": statistics.median((c[i]["ts"] - c[0]["ts"]) * 1e-6 for c in calls),
             "seconds": statistics.median(c[i]["dur"] * 1e-6 for c in calls)}
            for i, (cat, name) in enumerate(names[0])]


def sm_clock_mhz() -> float | None:
    """The GPU's SM clock now, from nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def gpu_name() -> str:
    """The name of the current GPU, as its driver gives it (e.g. "NVIDIA H200")."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else name


def measure(beyond: bool, reps: int, ops) -> dict:
    import cupy
    from bench.model import selected
    from gpumodel import benchmodel
    timer = Timer(reps)
    rows = []
    for case in cases(beyond):
        if not selected(case, ops):
            continue
        row = {"case": case.name}
        try:
            x = full_input(case)
            f, _ = benchmodel.prepared_call(case, x)
            row["gpupool"] = timer.seconds(f)
            baseline = torch_call(case, x) if timer.torch is not None else None
            if baseline is not None:
                row["torch"] = timer.seconds(baseline)
        except Exception as e:  # noqa: BLE001 - kept with the case, the others go on
            row["error"] = f"{type(e).__name__}: {e}"
        row["sm_clock_mhz"] = sm_clock_mhz()
        rows.append(row)
        print(json.dumps(row), flush=True)
        x = f = baseline = None
        cupy.get_default_memory_pool().free_all_blocks()
    return {"date": datetime.date.today().isoformat(),
            "gpu": gpu_name(),
            "sm_count": cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"],
            "reps": reps,
            "method": f"median of {reps} calls, {FLUSH_BYTES >> 20} MiB written before each; "
                      "cupti: first kernel start to last kernel end of the call; events: CUDA "
                      "events around the call",
            "cases": rows}


def device_label(gpu: str, labels) -> str | None:
    """The model's device label of the measured GPU (an H100 or an H200)."""
    for label in labels:
        if label.split()[0] in gpu:
            return label
    return None


def compared(measured: dict, models: list[dict]) -> str:
    """Markdown: each measured case with its modeled time and bound on the measured GPU's
    profile (bound names as bench/model.py's tables give them)."""
    from bench.model import bound_name
    modeled = {row["case"]: row for m in models for row in m["cases"]}
    labels = [label for m in models for label in m["devices"]]
    label = device_label(measured["gpu"], labels)
    lines = [f"Measured on {measured['gpu']} ({measured['method']}); modeled: "
             f"{label or 'no matching profile'}.", "",
             "| case | measured us | SM MHz | modeled us | bound | measured / modeled | "
             "PyTorch us |", "|---|---|---|---|---|---|---|"]
    for row in measured["cases"]:
        mine = row.get("gpupool", {})
        seconds = mine.get("cupti") or mine.get("events")
        model = modeled.get(row["case"], {}).get("devices", {}).get(label)
        theirs = row.get("torch", {})
        torch_seconds = theirs.get("cupti") or theirs.get("events")
        cells = [row["case"],
                 f"{seconds * 1e6:.1f}" if seconds else row.get("error", "-")[:60],
                 f"{row['sm_clock_mhz']:.0f}" if row.get("sm_clock_mhz") else "-",
                 f"{model['seconds'] * 1e6:.1f}" if model else "-",
                 bound_name(model) if model else "-",
                 f"{seconds / model['seconds']:.2f}" if model and seconds else "-",
                 f"{torch_seconds * 1e6:.1f}" if torch_seconds else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/measure.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beyond", action="store_true", help="the cases beyond the suite")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                        help="only cases of these ops or whose names contain one of these")
    parser.add_argument("--reps", type=int, default=30, help="timed calls per case")
    parser.add_argument("--compile-workers", type=int, default=8, metavar="N",
                        help="processes that compile the kernels first (0: none)")
    parser.add_argument("--results-dir", default=RESULTS, metavar="DIR",
                        help="where the file goes (default: bench/results next to this script)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite a result file of the same name")
    parser.add_argument("--compare", nargs="+", metavar="JSON",
                        help="a measured file, then model files: print them side by side")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as f:
            measured = json.load(f)
        models = []
        for path in args.compare[1:]:
            with open(path) as f:
                models.append(json.load(f))
        print(compared(measured, models), end="")
        return 0
    from gpupool.cuda.probe import gpu_usable
    usable, why = gpu_usable()
    if not usable:
        print(f"bench/measure.py: no usable GPU: {why}", file=sys.stderr)
        return 1
    words = gpu_name().split()
    stem = os.path.join(args.results_dir,
                        f"measured-{(words[1] if len(words) > 1 else 'gpu').lower()}-"
                        f"{datetime.date.today().isoformat()}"
                        f"{'-beyond' if args.beyond else ''}{'-partial' if args.ops else ''}")
    if os.path.exists(stem + ".json") and not args.force:
        print(f"bench/measure.py: not overwriting {stem}.json; pass --force to replace it",
              file=sys.stderr)
        return 1
    if args.compile_workers:
        for error in compile_ahead(args.beyond, args.compile_workers):
            print(f"compile ahead: {error}", file=sys.stderr)
    result = measure(args.beyond, args.reps, args.ops)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
