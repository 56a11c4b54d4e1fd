"""The time model held against published H200 measurements: PyTorch's own pooling kernels
(``torch_kernels.cu`` of the calibration folder, compiled from there) launched as PyTorch
launches them on each measured ``torch-ref`` workload, traced on the CPU executor, and their
modeled times set beside the measured ones.

The calibration folder is ``../shared/calibration`` beside the repository, or
``$GPUPOOL_CALIBRATION``. Its ``measured.json`` (or any file of the same schema) lists rows;
a ``torch-ref`` row is modeled when ``torch_kernels.cu`` holds its kernel (max 1d/2d/3d and
avg 1d/2d; bfloat16 runs the float16 template, as in PyTorch).

Traced size: a workload's N x C planes are independent and alike (the kernels find the plane
of an output by division and never cross it), so the trace takes fewer planes and its counts
are multiplied by full over traced planes. For the 1-D grid of the max and average kernels, a
warp's 32 outputs start at a multiple of 32, so the warps' positions within their planes
repeat every ``lcm(plane outputs, 32) / plane outputs`` planes: a whole number of such periods
gives every instruction and access count exactly, and the trace takes enough of them for some
8192 outputs (so that blocks meet planes as they do at full size on average). For the 3-D
max kernel (grid z = frames x planes) one plane is exact. What scaling does not keep: DRAM
sectors shared by two planes (a plane's bytes not a multiple of 32) count once per traced
plane boundary more or less, a fraction of a sector per plane.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import device as devices
from . import instructions, pipes, sass, trace, traffic
from .counts import Counts, launch_counts

ROOT = Path(__file__).resolve().parent.parent
#: The folder of the published measurements and PyTorch's kernels.
CALIBRATION_DIR = Path(os.environ.get("GPUPOOL_CALIBRATION",
                                      ROOT.parent / "shared" / "calibration"))
SOURCE = "torch_kernels.cu"
#: Outputs the trace of a 1-D grid takes at least (whole periods; see the module docstring).
TRACED_OUTPUTS = 8192
#: The rows the device's fitted constants (ISSUE_EFFICIENCY, LAUNCH_SECONDS) come from: the
#: pinned-clock nightly float16 rows without indices (one per workload); every other row
#: checks the fit.
FIT_ROWS = {"source_tag": "NIGHTLY", "dtype": "float16", "indices": False}

KERNELS = {
    ("max", 2): {"float16": "calib::max_pool_forward_nchw<Half, int>",
                 "float32": "calib::max_pool_forward_nchw<float, int>"},
    ("avg", 2): {"float16": "calib::avg_pool2d_out_cuda_frame<Half, float>",
                 "float32": "calib::avg_pool2d_out_cuda_frame<float, float>"},
    ("max", 3): {"float16": "calib::max_pool3d_with_indices_single_out_frame<Half>",
                 "float32": "calib::max_pool3d_with_indices_single_out_frame<float>"},
}


def calibration_file(name: str) -> Path:
    return CALIBRATION_DIR / name


@dataclass(frozen=True)
class Workload:
    """A pooling workload in PyTorch's terms (NC... input, per-dim window parameters)."""

    op: str  # "max" or "avg"
    shape: tuple
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int | None
    dtype: str  # float16 (bfloat16 too) or float32

    @property
    def dims(self) -> int:
        return len(self.kernel)

    @property
    def planes(self) -> int:
        return math.prod(self.shape[:-self.dims])

    def output_size(self) -> tuple:
        """PyTorch's pooling_output_shape per spatial dim (ceil mode: the last window starts
        inside the input or its left padding)."""
        out = []
        for n, k, s, p, d in zip(self.shape[-self.dims:], self.kernel, self.stride,
                                 self.padding, self.dilation):
            span = n + 2 * p - d * (k - 1) - 1
            o = (span + (s - 1 if self.ceil_mode else 0)) // s + 1
            if self.ceil_mode and (o - 1) * s >= n + p:
                o -= 1
            out.append(o)
        return tuple(out)

    @property
    def outputs(self) -> int:
        return self.planes * math.prod(self.output_size())

    def ideal_bytes(self, indices: bool) -> int:
        """Input read once, output (and int64 indices) written once."""
        item = 2 if self.dtype == "float16" else 4
        return item * (math.prod(self.shape) + self.outputs) + 8 * self.outputs * indices


def row_workload(row: dict) -> tuple[Workload | None, str]:
    """The workload of a measured row and "", or None and why it is not modeled."""
    op, dims = row["op"][:-2], int(row["op"][-2])
    if row["op"][0] == "a" and row["op"][:4] in ("aavg", "amax"):
        return None, "adaptive pooling: no PyTorch kernel in the calibration source"
    if (op, max(dims, 2)) not in KERNELS:
        return None, f"{row['op']}: no PyTorch kernel of it in {SOURCE}"
    if row["dtype"] not in ("float16", "bfloat16", "float32"):
        return None, f"dtype {row['dtype']}"
    if any(d != 1 for d in row["dilation"]) and op == "avg":
        return None, "average pooling has no dilation"
    return Workload(op, tuple(row["shape"]), tuple(row["kernel"]), tuple(row["stride"]),
                    tuple(row["padding"]), tuple(row["dilation"]), bool(row["ceil_mode"]),
                    bool(row["count_include_pad"]), row["divisor_override"],
                    "float32" if row["dtype"] == "float32" else "float16"), ""


def row_clock(row: dict) -> float | None:
    """The SM clock a row states (Hz), None when it states none."""
    import re
    m = re.search(r"SM (\d+) MHz", row.get("clock", ""))
    return float(m.group(1)) * 1e6 if m else None


@dataclass
class Launched:
    """The kernel a workload launched at its traced size, and what scales it to full size."""

    name: str
    work: float  # full over traced planes
    full_blocks: int


def _as_2d(w: Workload) -> Workload:
    """A 1-D workload as PyTorch runs it: 2-D with H = 1."""
    if w.dims != 1:
        return w
    return replace(w, shape=w.shape[:-1] + (1, w.shape[-1]), kernel=(1,) + w.kernel,
                   stride=(1,) + w.stride, padding=(0,) + w.padding,
                   dilation=(1,) + w.dilation)


def traced_planes(w: Workload) -> int:
    """Planes the trace of a 1-D-grid kernel takes (module docstring)."""
    per_plane = math.prod(w.output_size())
    period = math.lcm(per_plane, traffic.WARP) // per_plane
    return min(w.planes, period * max(1, -(-TRACED_OUTPUTS // (period * per_plane))))


def _scaled(w: Workload, planes: int) -> Workload:
    return replace(w, shape=(planes,) + w.shape[-w.dims:])


def launch(w: Workload, library) -> Launched:
    """Run PyTorch's kernel of ``w`` at its traced size from ``library`` (a trace build of
    the calibration source, inside a :class:`gpumodel.trace.Recorder` that records it)."""
    rng = np.random.default_rng(0)
    w = _as_2d(w)
    dtype = np.float16 if w.dtype == "float16" else np.float32
    name = KERNELS[(w.op, w.dims)][w.dtype]
    if w.dims == 3:
        planes = 1
        s = _scaled(w, planes)
        ot, oh, ow = s.output_size()
        x = rng.standard_normal(s.shape).astype(dtype)
        out, idx = np.zeros((planes, ot, oh, ow), dtype), np.zeros((planes, ot, oh, ow), np.int64)
        i32 = np.int32
        args = (x, out, idx, i32(1), *(i32(v) for v in s.shape[-3:]), i32(planes), i32(ot),
                i32(oh), i32(ow), *(i32(v) for v in w.kernel), *(i32(v) for v in w.stride),
                *(i32(v) for v in w.padding), *(i32(v) for v in w.dilation), i32(0),
                np.bool_(False))
        block = (32, 8, 1)
        grid = (-(-ow // 32), -(-oh // 8), ot * planes)
        full_grid = (grid[0], grid[1], ot * w.planes)
        library.kernel(name)(grid, block, args)
        return Launched(name, w.planes / planes, math.prod(full_grid))
    planes = traced_planes(w)
    s = _scaled(w, planes)
    oh, ow = s.output_size()
    n = planes * oh * ow
    x = rng.standard_normal(s.shape).astype(dtype)
    out = np.zeros((planes, oh, ow), dtype)
    i32, i64 = np.int32, np.int64
    h, wd = s.shape[-2:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = w.kernel, w.stride, w.padding, w.dilation
    if w.op == "max":
        idx = np.zeros((planes, oh, ow), np.int64)
        args = (i32(n), x, i64(planes), i64(h), i64(wd), i32(oh), i32(ow), i32(kh), i32(kw),
                i32(sh), i32(sw), i32(ph), i32(pw), i32(dh), i32(dw), out, idx)
        threads = 256
    else:
        divisor = w.divisor_override or 0
        args = (i32(n), x, i64(planes), i64(h), i64(wd), i64(oh), i32(ow), i32(kh), i32(kw),
                i32(sh), i32(sw), i32(ph), i32(pw), out, i32(divisor),
                np.bool_(w.count_include_pad), np.bool_(w.divisor_override is not None))
        threads = 1024
    library.kernel(name)((-(-n // threads),), (threads,), args)
    return Launched(name, w.planes / planes, -(-w.outputs // threads))


@functools.lru_cache(maxsize=1)
def _compiled(names: tuple) -> tuple[dict, dict, dict]:
    """(control flows, load batchings, registers) of the calibration kernels, by name."""
    import cudacpu
    with cudacpu.installed_cupy():
        nvrtc = cudacpu.real_nvrtc()
        if nvrtc is None:
            raise RuntimeError("gpumodel.calibration: CuPy's NVRTC is not importable")
        compiled = sass.compile_kernels(nvrtc, calibration_file(SOURCE).read_text(), names)
    code = sass.disassemble(compiled.cubin)
    flows = {n: instructions.control_flow(code[m]) for n, m in compiled.mangled.items()}
    return flows, sass.load_batching(compiled), traffic.register_usage(compiled)


def model_workloads(workloads) -> dict[Workload, Counts]:
    """The full-size counts of PyTorch's kernel of each workload (traced on the executor)."""
    from cudacpu import executor
    workloads = list(dict.fromkeys(workloads))
    names = tuple(sorted({n for by in KERNELS.values() for n in by.values()}))
    flows, batching, regs = _compiled(names)
    source = calibration_file(SOURCE).read_text()
    out = {}
    with trace.Recorder() as recorder:
        library = executor.Library(
            executor.build_library(source, names, executor.Build.from_env()), names)
        for w in workloads:
            done = launch(w, library)
            la = recorder.launches[-1]
            out[w] = launch_counts(la, flows[done.name], batching[done.name],
                                   regs.get(done.name), done.work, [done.work] * len(la.arrays),
                                   done.full_blocks)
    return out


@dataclass
class RowResult:
    row: dict
    workload: Workload | None
    reason: str  # why not modeled ("" when modeled)
    counts: Counts | None = None
    clock: float | None = None

    def predicted(self, device: devices.Device) -> devices.LaunchTime:
        return self.counts.time(device.at_clock(self.clock or devices.CALIBRATION_CLOCK))

    @property
    def measured(self) -> float:
        return self.row["time_us"] * 1e-6

    def ratio(self, device) -> float:
        return self.predicted(device).seconds / self.measured

    @property
    def in_fit(self) -> bool:
        """A modeled row the fitted constants come from."""
        return self.counts is not None and all(self.row.get(k) == v
                                               for k, v in FIT_ROWS.items())


def torch_rows(measured: dict) -> list[RowResult]:
    """The ``torch-ref`` rows of a measured file, each modeled where its kernel exists."""
    rows = [r for r in measured["points"] if r["impl"] == "torch-ref"]
    results = []
    for r in rows:
        w, why = row_workload(r)
        results.append(RowResult(r, w, why, clock=row_clock(r)))
    counts = model_workloads([x.workload for x in results if x.workload])
    for x in results:
        if x.workload:
            x.counts = counts[x.workload]
    return results


def load(path) -> dict:
    with open(path) as f:
        data = json.load(f)
    if "points" not in data:
        raise ValueError(f"{path}: not a measured file (no 'points')")
    return data


def fit(results: list[RowResult], device: devices.Device) -> devices.Device:
    """``device`` with ISSUE_EFFICIENCY and LAUNCH_SECONDS fitted to the FIT_ROWS of
    ``results`` (least squares of the relative errors)."""
    from scipy.optimize import least_squares
    rows = [r for r in results if r.in_fit]

    def residuals(p):
        d = replace(device, issue_efficiency=p[0], launch_seconds=p[1] * 1e-6)
        return [r.ratio(d) - 1 for r in rows]

    done = least_squares(residuals, [device.issue_efficiency, device.launch_seconds * 1e6],
                         bounds=([0.05, 0.0], [1.0, 50.0]))
    return replace(device, issue_efficiency=float(done.x[0]),
                   launch_seconds=float(done.x[1]) * 1e-6)


#: ALU busy percentage (Nsight Compute's) from which a launch is taken as bound by its ALU.
ALU_BOUND_PERCENT = 80


def pipe_efficiency(issued: dict, device: devices.Device) -> list[float]:
    """The fraction of its ALU's issue slots each launch of ``issued`` (a file of
    ``bench/issued.py parse``: per-pipe counts and times on ``device``'s GPU and clock) that
    Nsight Compute found more than ALU_BOUND_PERCENT busy on its ALU filled: its ALU warp
    instructions at the ALU's rate over its time less the fixed cost per launch.
    PIPE_EFFICIENCY is their median."""
    rate = device.issue_rate * pipes.RATES["alu"]
    return [launch["alu_warp_instructions"] / rate
            / (launch["nanoseconds"] * 1e-9 - device.launch_seconds)
            for case in issued["cases"] for launch in case["launches"]
            if launch.get("alu_busy_percent", 0) > ALU_BOUND_PERCENT]
