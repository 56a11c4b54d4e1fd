"""Benchmark suite behind ``gpupool bench``: real layer shapes, gpupool against every baseline
that is installed, all measured in one run next to the device's own copy bandwidth.

GPU: CUDA-event timings (``cupyx.profiler.benchmark``), warm-up excluded, first call (compile
included) reported apart, inputs of >= 256 MiB with ``--size large`` so repeats measure DRAM,
not L2. CPU: ``time.perf_counter`` medians, baselines timed in the same rounds. Every case is
checked before it is timed: against the NumPy backend (GPU), against each of PyTorch and
onnxruntime that runs it (CPU: every baseline timed is checked too), or against
an independent float64 NumPy reference where neither runs the case. Baselines that are not
installed are reported as missing. Heavy imports (torch, onnxruntime, matplotlib, tqdm) happen
only here, lazily.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import gpupool

LARGE_BYTES = 256 << 20


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # max | avg | lp | gavg | aavg | amax | qmax | qavg
    sample: tuple  # shape of one sample, without N
    dtype: str = "float32"
    kernel: tuple = (2, 2)
    stride: tuple | None = None
    padding: int = 0
    layout: str = "NCHW"
    output_size: tuple = ()
    n: int | None = None  # a fixed N for every --size; None: N set by --size
    batched: bool = True  # False: no N at all (the seed documents' shapes): the input is sample
    indices: bool = False  # max pooling that also returns the argmax indices
    p: float = 2.0  # lp's exponent

    def shape(self, n: int) -> tuple:
        """The input's shape for batch size ``n`` (ignored by an unbatched case)."""
        return ((n,) + self.sample) if self.batched else self.sample


SUITE = (
    Case("resnet stem max 3x3 s2 p1", "max", (64, 112, 112), kernel=(3, 3), stride=(2, 2), padding=1),
    Case("resnet stem max f16", "max", (64, 112, 112), "float16", (3, 3), (2, 2), 1),
    Case("resnet stem max + indices", "max", (64, 112, 112), kernel=(3, 3), stride=(2, 2),
         padding=1, indices=True),
    Case("resnet stem max NHWC", "max", (112, 112, 64), kernel=(3, 3), stride=(2, 2), padding=1,
         layout="NHWC"),
    Case("vgg max 2x2 s2", "max", (64, 224, 224)),
    Case("densenet avg 2x2 s2", "avg", (256, 56, 56)),
    Case("inception avg 3x3 s1 p1", "avg", (192, 35, 35), kernel=(3, 3), stride=(1, 1), padding=1),
    Case("inception avg NHWC", "avg", (35, 35, 192), kernel=(3, 3), stride=(1, 1), padding=1,
         layout="NHWC"),
    Case("resnet50 head global avg", "gavg", (2048, 7, 7)),
    Case("resnet50 head global avg f16", "gavg", (2048, 7, 7), "float16"),
    Case("global avg N=64", "gavg", (2048, 7, 7), n=64),
    Case("global avg N=64 f16", "gavg", (2048, 7, 7), "float16", n=64),
    Case("global avg NHWC", "gavg", (7, 7, 2048), layout="NHWC"),
    Case("adaptive avg 14->7", "aavg", (512, 14, 14), output_size=(7, 7)),
    Case("3d max 2x2x2", "max", (64, 16, 56, 56), kernel=(2, 2, 2)),
    Case("1d max 3 s2 p1", "max", (64, 8192), kernel=(3,), stride=(2,), padding=1),
    Case("1d avg 4 s4", "avg", (64, 8192), kernel=(4,), stride=(4,)),
    Case("int8 max 2x2 s2", "qmax", (64, 112, 112), "int8"),
    Case("int8 avg 2x2 s2", "qavg", (64, 112, 112), "int8"),
    Case("seed [64,56,56] max 2x2 s2", "max", (64, 56, 56), batched=False),
    Case("seed [64,56,56] avg 3x3 s2 p1", "avg", (64, 56, 56), kernel=(3, 3), stride=(2, 2),
         padding=1, batched=False),
    Case("seed [64,7,7] global avg", "gavg", (64, 7, 7), batched=False),
)


#: The fixed cost of a call: tiny inputs, where the time is Python and launch overhead, not
#: memory traffic (the "overhead" section of the results).
OVERHEAD = tuple(
    Case(f"overhead {'x'.join(map(str, sample))} {name}", op, sample, dtype, n=1, **kw)
    for sample, ops in (
        ((4, 8, 8), (("max 2x2", "max", "float32", {}),
                     ("max 3x3 s2 p1", "max", "float32",
                      dict(kernel=(3, 3), stride=(2, 2), padding=1)),
                     ("avg 2x2", "avg", "float32", {}),
                     ("lp p=2 2x2", "lp", "float32", {}),
                     ("global avg", "gavg", "float32", {}),
                     ("adaptive avg ->3x3", "aavg", "float32", dict(output_size=(3, 3))),
                     ("adaptive max ->3x3", "amax", "float32", dict(output_size=(3, 3))),
                     ("max 2x2 + indices", "max", "float32", dict(indices=True)),
                     ("int8 max 2x2", "qmax", "int8", {}))),
        ((64, 7, 7), (("max 3x3 s2 p1", "max", "float32",
                       dict(kernel=(3, 3), stride=(2, 2), padding=1)),
                      ("avg 2x2", "avg", "float32", {}),
                      ("global avg", "gavg", "float32", {}),
                      ("max 2x2 + indices", "max", "float32", dict(indices=True)))))
    for name, op, dtype, kw in ops)

OVERHEAD_ROUNDS = 5  # rounds of :func:`time_host` per overhead case (each call is short)

#: the op names ``--ops`` accepts besides parts of case names
OPS = ("max", "avg", "lp", "gavg", "aavg", "amax", "qmax", "qavg")


def select_cases(ops=None, cases=SUITE) -> list[Case]:
    """The ``cases`` whose op is in ``ops`` or whose name contains one of them (all for None).
    ``ValueError`` for no entries, a blank entry (it would select every case), and naming
    every entry that selects nothing in the suite or the overhead cases, listing the valid
    names."""
    if ops is None:
        return list(cases)
    if not ops:
        raise ValueError(f"--ops: no op or case name given: give an op ({', '.join(OPS)}) or "
                         f"part of a case name, or leave --ops out for every case")
    blank = [o for o in ops if not o.strip()]
    if blank:
        raise ValueError(f"--ops {', '.join(map(repr, blank))}: a blank name would select every "
                         f"case: give an op ({', '.join(OPS)}) or part of a case name, or leave "
                         f"--ops out for every case")
    unknown = [o for o in ops if o not in OPS and not any(o in c.name for c in SUITE + OVERHEAD)]
    if unknown:
        raise ValueError(f"--ops {', '.join(map(repr, unknown))} matches no case: give an op "
                         f"({', '.join(OPS)}) or part of a case name ("
                         f"{'; '.join(c.name for c in SUITE + OVERHEAD)})")
    return [c for c in cases if c.op in ops or any(o in c.name for o in ops)]


def check_output_path(option: str, path: str) -> None:
    """``ValueError`` naming ``option`` and ``path`` when the file cannot be written: a
    directory, a missing folder, no permission, a device that refuses writes (/dev/full).
    Nothing is left behind: a missing file is created, written one byte and removed; an
    existing one is opened for appending and written zero bytes, so its contents stay (a
    zero-byte write still fails on a device that refuses writes)."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path!r}: is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path!r}: {folder!r} is not an existing folder")
    existed = os.path.exists(path)
    try:
        with open(path, "ab", buffering=0) as f:
            f.write(b"" if existed else b"\0")
    except OSError as e:
        raise ValueError(f"{option} {path!r}: cannot be written ({e.strerror or e})") from e
    finally:
        if not existed and os.path.exists(path):
            os.remove(os.path.realpath(path))


def preflight(ops=None, outputs: dict | None = None) -> list[Case]:
    """The selected cases, once every argument problem that would stop a run has been ruled
    out: ``ops`` (``select_cases``), each output path of ``outputs`` (option -> path or
    None; ``check_output_path``), and matplotlib for a ``--plot`` path. ``ValueError`` or
    ``ImportError`` otherwise."""
    cases = select_cases(ops)
    outputs = {option: path for option, path in (outputs or {}).items() if path}
    if "--plot" in outputs:
        require_matplotlib()
    for option, path in outputs.items():
        check_output_path(option, path)
    return cases


def require_matplotlib() -> None:
    """``ImportError`` saying how to install matplotlib, which ``--plot`` needs."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib, which is not installed ({e}): "
                          f"pip install \"gpupool[bench]\" (or pip install matplotlib)") from e


def batch_size(case: Case, size: str) -> int:
    """N for ``case`` at ``size`` ("small" or "large"); 1 for an unbatched case (no N)."""
    if not case.batched:
        return 1
    if case.n is not None:
        return case.n
    if size == "small":
        return 4
    per_sample = math.prod(case.sample) * np.dtype(case.dtype).itemsize
    return max(1, -(-LARGE_BYTES // per_sample))


# ----------------------------------------------------------------- gpupool calls
def gpupool_call(case: Case, x):
    """The gpupool function of ``case`` bound to input ``x`` (NumPy or CuPy)."""
    kw = {"layout": case.layout}
    if case.op == "max":
        return lambda: gpupool.max_pool(x, case.kernel, case.stride, case.padding,
                                        return_indices=case.indices, **kw)
    if case.op == "avg":
        return lambda: gpupool.avg_pool(x, case.kernel, case.stride, case.padding, **kw)
    if case.op == "lp":
        return lambda: gpupool.lp_pool(x, case.p, case.kernel, case.stride, case.padding, **kw)
    if case.op == "gavg":
        return lambda: gpupool.global_avg_pool(x, spatial_dims=len(case.kernel), **kw)
    if case.op == "aavg":
        return lambda: gpupool.adaptive_avg_pool(x, case.output_size, **kw)
    if case.op == "amax":
        return lambda: gpupool.adaptive_max_pool(x, case.output_size, **kw)
    q = gpupool.quantized.QArray(x, 0.05, 0)
    f = gpupool.quantized.max_pool if case.op == "qmax" else gpupool.quantized.avg_pool
    return lambda: f(q, case.kernel, case.stride, case.padding, layout=case.layout)


def _arrays(result) -> tuple:
    """The arrays of a gpupool result: (values,), (values, indices), or a QArray's (codes,)."""
    parts = result if isinstance(result, tuple) else (result,)
    return tuple(p.data if isinstance(p, gpupool.quantized.QArray) else p for p in parts)


def values(result):
    """Host NumPy values of a gpupool result (array, (values, indices) or QArray)."""
    data = _arrays(result)[0]
    return data.get() if hasattr(data, "get") else np.asarray(data)


def output_bytes(result) -> int:
    """Bytes a gpupool result holds: values, indices when returned, a QArray's codes."""
    return sum(a.nbytes for a in _arrays(result))


def make_input(case: Case, n: int, xp=np):
    rng = np.random.default_rng(0)
    shape = case.shape(n)
    if case.dtype == "int8":
        host = rng.integers(-128, 128, size=shape, dtype=np.int8)
    else:
        host = rng.standard_normal(shape, dtype=np.float32).astype(case.dtype)
    return xp.asarray(host)


# ----------------------------------------------------------------- baselines
def with_batch(case: Case, x):
    """``x`` with its N axis, as the baselines take it: a view with N = 1 prepended for an
    unbatched case, else ``x`` itself."""
    return x if case.batched else x[None]


def baseline_values(case: Case, out) -> np.ndarray:
    """A baseline's result as NumPy values in the case's own layout and shape: the
    values of a (values, indices) pair, a PyTorch tensor's NCHW view back in NHWC, and no
    N axis for an unbatched case."""
    out = out[0] if isinstance(out, (tuple, list)) else out
    if hasattr(out, "movedim"):  # a PyTorch tensor
        out = (out.movedim(1, -1) if case.layout == "NHWC" else out).cpu().numpy()
    elif hasattr(out, "get"):  # a CuPy array
        out = out.get()
    return out if case.batched else out[0]


def _torch():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, None
    return torch, F


def torch_call(case: Case, x, device: str):
    """PyTorch on the same data (NCHW logical tensor; channels_last for NHWC), or
    (None, reason)."""
    torch, F = _torch()
    if torch is None:
        return None, "not installed"
    if case.op in ("qmax", "qavg"):
        return None, "no such op"
    if device == "cuda" and not torch.cuda.is_available():
        return None, "built without CUDA or no GPU for it"
    t = torch.as_tensor(with_batch(case, x), device=device)
    nd = len(case.kernel)
    if case.layout == "NHWC":
        t = t.movedim(-1, 1)  # a channels_last view: the same memory as x
    if case.op == "max":
        f = getattr(F, f"max_pool{nd}d")
        k, s = (case.kernel[0], (case.stride or case.kernel)[0]) if nd == 1 else (case.kernel, case.stride)
        return (lambda: f(t, k, s, case.padding, return_indices=case.indices)), None
    if case.op == "avg":
        f = getattr(F, f"avg_pool{nd}d")
        k, s = (case.kernel[0], (case.stride or case.kernel)[0]) if nd == 1 else (case.kernel, case.stride)
        return (lambda: f(t, k, s, case.padding, count_include_pad=False)), None
    if case.op == "lp":  # PyTorch omits the abs: the same for an even p
        if case.p % 2 or case.padding:
            return None, "odd p or padding (PyTorch's LpPool has neither abs nor padding)"
        f = getattr(F, f"lp_pool{nd}d")
        return (lambda: f(t, case.p, case.kernel, case.stride)), None
    if case.op == "gavg":
        return (lambda: F.adaptive_avg_pool2d(t, 1)), None
    if case.op == "amax":
        return (lambda: F.adaptive_max_pool2d(t, case.output_size)), None
    return (lambda: F.adaptive_avg_pool2d(t, case.output_size)), None


def onnxruntime_call(case: Case, x):
    """onnxruntime CPU on the same data, or (None, reason)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None, "not installed"
    if case.layout == "NHWC":
        return None, "no NHWC pooling op"
    if case.op in ("aavg", "amax", "qavg"):
        return None, "no such op"
    nd = len(case.kernel)
    xb = np.ascontiguousarray(with_batch(case, x))
    elem = TensorProto.INT8 if case.dtype == "int8" else (
        TensorProto.FLOAT16 if case.dtype == "float16" else TensorProto.FLOAT)
    if case.op == "gavg":
        node = helper.make_node("GlobalAveragePool", ["X"], ["Y"])
    else:
        attrs = dict(kernel_shape=list(case.kernel), strides=list(case.stride or case.kernel),
                     pads=[case.padding] * (2 * nd))
        if case.op == "lp":
            attrs["p"] = int(case.p)
        node = helper.make_node({"max": "MaxPool", "qmax": "MaxPool", "lp": "LpPool"}.get(
                                    case.op, "AveragePool"),
                                ["X"], ["Y", "I"] if case.indices else ["Y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("X", elem, xb.shape)],
                              [helper.make_tensor_value_info(name, type_, None) for name, type_
                               in (("Y", elem), ("I", TensorProto.INT64))[:1 + case.indices]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - an unsupported type is a missing baseline
        return None, f"unsupported: {str(e)[:60]}"
    feed = {"X": xb}
    return (lambda: sess.run(None, feed)[0]), None


def cupy_call(case: Case, x):
    """Plain CuPy doing the same pooling: a reshape + reduction when k == s and there is no
    padding, else for max a ``cupyx.scipy.ndimage`` filter (padding with the dtype's lowest
    value, which never wins) + slicing; or (None, reason): ndimage's mean counts the padding,
    where gpupool's default divides by the valid taps. The leading axes (N, as
    :func:`with_batch` gives it, and C) are kept."""
    if case.layout != "NCHW" or case.op in ("qavg", "aavg", "amax", "lp"):
        return None, "no plain-CuPy equivalent"
    x = with_batch(case, x)
    nd = len(case.kernel)
    lead, spatial = x.shape[:-nd], x.shape[-nd:]
    if case.op == "gavg":
        return (lambda: x.mean(axis=tuple(range(-nd, 0)), keepdims=True)), None
    k, s = case.kernel, case.stride or case.kernel
    if k == s and case.padding == 0 and all(i % kk == 0 for i, kk in zip(spatial, k)):
        split = lead + tuple(v for i, kk in zip(spatial, k) for v in (i // kk, kk))
        axes = tuple(len(lead) + 2 * a + 1 for a in range(nd))
        red = "max" if case.op in ("max", "qmax") else "mean"
        return (lambda: getattr(x.reshape(split), red)(axis=axes)), None
    if case.op not in ("max", "qmax"):
        return None, "no plain-CuPy equivalent (ndimage's mean counts the padding)"
    try:
        from cupyx.scipy import ndimage
    except ImportError as e:
        return None, f"cupyx.scipy.ndimage not importable ({e})"
    if any(case.padding > kk // 2 for kk in k):
        return None, "no plain-CuPy equivalent (a window starting before ndimage's first)"
    size = (1,) * len(lead) + k
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    # window o starts at o*s - p and ndimage centres a window of k at its start + k // 2
    sl = (Ellipsis,) + tuple(slice(kk // 2 - case.padding, kk // 2 - case.padding + ss * (
        (i + 2 * case.padding - kk) // ss) + 1, ss) for i, kk, ss in zip(spatial, k, s))
    return (lambda: ndimage.maximum_filter(x, size=size, mode="constant", cval=lowest)[sl]), None


# ----------------------------------------------------------------- timing
def time_host(funcs: dict, rounds=10, burst_s=0.05, min_reps=3, max_reps=200,
              settle_s=0.02, setups: dict | None = None) -> dict:
    """Wall times of each callable in steady state, as a user calling one library sees it.

    Each round runs every callable in turn for a burst of ``burst_s`` (``min_reps`` to
    ``max_reps`` calls) after a ``settle_s`` pause and one untimed call, so a slow spell of a
    shared machine still hits every library alike. Calls are never interleaved one by one: the
    worker threads of PyTorch (OpenMP) and onnxruntime keep spinning for a while after a
    call, and a library timed right after another one pays for those spinning threads (seen
    on 2 cores: all three libraries 1.5-5x slower than alone). ``setups[name]``, when given,
    runs before each of that callable's bursts (e.g. to set a library's thread count)."""
    times = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            if setups and name in setups:
                setups[name]()
            time.sleep(settle_s)
            f()
            end = time.perf_counter() + burst_s
            reps = 0
            while reps < min_reps or (reps < max_reps and time.perf_counter() < end):
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
                reps += 1
    return times


def time_launches(f, sync, reps=200, loops=10) -> tuple[list[float], list[float]]:
    """The fixed cost of a GPU call: ``(host, loop)`` seconds per call, ``host`` each call's
    own time on the host (launches queued, no wait for the device), ``loop`` the time of a
    loop of ``reps // loops`` calls ended by ``sync()``, per call (``loops`` such loops)."""
    f()
    sync()
    host = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        host.append(time.perf_counter() - t)
    sync()
    per_loop = max(1, reps // loops)
    loop = []
    for _ in range(loops):
        t = time.perf_counter()
        for _ in range(per_loop):
            f()
        sync()
        loop.append((time.perf_counter() - t) / per_loop)
    return host, loop


def time_gpu(f, reps=50) -> list[float]:
    from cupyx.profiler import benchmark
    return [float(t) for t in benchmark(f, n_repeat=reps, n_warmup=5).gpu_times[0]]


def copy_bandwidth(gpu: bool) -> float:
    """Bytes read + written per second by a large device (or host) copy."""
    if gpu:
        import cupy
        a = cupy.ones(LARGE_BYTES, dtype=cupy.uint8)
        b = cupy.empty_like(a)
        t = float(np.median(time_gpu(lambda: b.__setitem__(Ellipsis, a), 20)))
    else:
        a = np.ones(LARGE_BYTES // 4, dtype=np.uint8)
        b = np.empty_like(a)
        t = float(np.median(time_host({"copy": lambda: np.copyto(b, a)})["copy"]))
    return 2 * a.nbytes / t


# ----------------------------------------------------------------- the run
@dataclass
class Row:
    case: str
    backend: str
    shape: tuple
    dtype: str
    layout: str
    bytes: int = 0
    check: str = "unchecked"  # "ok (vs ...)" or each failed check
    checks: dict = field(default_factory=dict)  # reference name -> "ok" or "FAILED: ..."
    first_call_s: float | None = None
    times_s: dict = field(default_factory=dict)  # name -> raw times
    missing: dict = field(default_factory=dict)  # baseline -> reason
    error: str | None = None
    torch_threads: int | None = None  # the thread count of PyTorch's faster median (CPU)

    def median(self, name: str) -> float | None:
        t = self.times_s.get(name)
        return float(np.median(t)) if t else None


def _check(got, want, dtype: str) -> str:
    if got.shape != want.shape:
        return f"FAILED: shape {got.shape} vs {want.shape}"
    exact = dtype == "int8"
    tol = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}.get(dtype, 0)
    ok = np.array_equal(got, want) if exact else np.allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
    return "ok" if ok else "FAILED: values differ"


def check_summary(checks: dict) -> str:
    """One line for a row's checks: "ok (vs a, b)", else each failed one with its name."""
    failed = [f"{v} (vs {name})" for name, v in checks.items() if v != "ok"]
    return "; ".join(failed) if failed else f"ok (vs {', '.join(checks)})"


def reference_values(case: Case, x) -> np.ndarray:
    """The case computed independently of gpupool: float64 (exact for int8 codes) over
    ``np.pad`` + sliding-window views, for checking cases that no baseline runs."""
    nd = len(case.kernel)
    a = np.asarray(x).astype(np.float64)
    if case.layout == "NHWC":
        a = np.moveaxis(a, -1, -nd - 1)
    axes = tuple(range(a.ndim - nd, a.ndim))
    if case.op == "gavg":
        r = a.mean(axis=axes, keepdims=True)
    elif case.op in ("aavg", "amax"):  # window i spans [floor(i*I/O), ceil((i+1)*I/O))
        r = np.empty(a.shape[:-nd] + tuple(case.output_size))
        for pos in np.ndindex(*case.output_size):
            win = tuple(slice(i * size // o, -(-(i + 1) * size // o))
                        for i, size, o in zip(pos, a.shape[-nd:], case.output_size))
            part = a[(...,) + win]
            r[(...,) + pos] = (part.max if case.op == "amax" else part.mean)(axis=axes)
    else:
        kernel, stride, pad = case.kernel, case.stride or case.kernel, case.padding
        is_max = case.op in ("max", "qmax")
        padded = np.pad(a, [(0, 0)] * (a.ndim - nd) + [(pad, pad)] * nd,
                        constant_values=-np.inf if is_max else np.nan)
        win = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=axes)
        win = win[(...,) + tuple(slice(None, None, st) for st in stride) + (slice(None),) * nd]
        taps = tuple(range(win.ndim - nd, win.ndim))
        if is_max:
            r = win.max(axis=taps)
        elif case.op == "lp":
            r = np.nansum(np.abs(win) ** case.p, axis=taps) ** (1 / case.p)
        else:
            r = np.nanmean(win, axis=taps)  # NaN = padding
        if case.op == "qavg":  # default scales: zp + round half away from zero, zp = 0
            r = np.clip(np.sign(r) * np.floor(np.abs(r) + 0.5), -128, 127)
    return np.moveaxis(r, -nd - 1, -1) if case.layout == "NHWC" else r


def run_case(case: Case, size: str, gpu: bool, overhead: bool = False) -> Row:
    """Check ``case``, then time it. ``overhead``: on the GPU, host and loop times per call
    (:func:`time_launches`, names ``X`` and ``X_loop``) instead of device times."""
    n = batch_size(case, size)
    row = Row(case.name, "cupy" if gpu else "numpy", case.shape(n), case.dtype, case.layout)
    try:
        if gpu:
            import cupy

            def time_gpu_call(name, g):
                if overhead:
                    row.times_s[name], row.times_s[f"{name}_loop"] = time_launches(
                        g, cupy.cuda.Device().synchronize)
                else:
                    row.times_s[name] = time_gpu(g)
            x = make_input(case, n, cupy)
            f = gpupool_call(case, x)
            t0 = time.perf_counter()
            result = f()
            cupy.cuda.get_current_stream().synchronize()
            row.first_call_s = time.perf_counter() - t0
            got = values(result)
            row.checks["numpy backend"] = _check(got, values(gpupool_call(case, x.get())()),
                                                 case.dtype)
            row.bytes = int(x.nbytes + output_bytes(result))
            time_gpu_call("gpupool", f)
            baselines = {"torch": torch_call(case, x, "cuda"), "cupy": cupy_call(case, x)}
            timed = {}
            for name, (bf, why) in baselines.items():  # each baseline timed is checked
                try:
                    want = None if bf is None else bf()
                except Exception as e:  # noqa: BLE001 - e.g. a dtype the library lacks
                    bf, why = None, f"{type(e).__name__}: {str(e)[:100]}"
                if bf is None:
                    row.missing[name] = why
                else:
                    row.checks[name] = _check(got, baseline_values(case, want), case.dtype)
                    timed[name] = bf
            row.check = check_summary(row.checks)
            for name, bf in timed.items():
                time_gpu_call(name, bf)
        else:
            x = make_input(case, n)
            f = gpupool_call(case, x)
            t0 = time.perf_counter()
            result = f()
            row.first_call_s = time.perf_counter() - t0
            got = values(result)
            row.bytes = int(x.nbytes + output_bytes(result))
            tf, torch_why = torch_call(case, x, "cpu")
            of, why = onnxruntime_call(case, x)
            for name, bf in (("torch", tf), ("onnxruntime", of)):  # each baseline timed
                if bf is not None:
                    row.checks[name] = _check(got, baseline_values(case, bf()), case.dtype)
            if not row.checks:
                row.checks["reference"] = _check(got, reference_values(case, x), case.dtype)
            row.check = check_summary(row.checks)
            funcs, setups = {"gpupool": f}, {}
            if tf is None:
                row.missing["torch"] = torch_why
            else:  # PyTorch at its best: one thread or every core, whichever is faster
                torch = _torch()[0]
                for n in sorted({1, os.cpu_count() or 1}):
                    funcs[f"torch@{n}"] = tf
                    setups[f"torch@{n}"] = lambda n=n: torch.set_num_threads(n)
            if of is None:
                row.missing["onnxruntime"] = why
            else:
                funcs["onnxruntime"] = of
            times = time_host(funcs, setups=setups, **({"rounds": OVERHEAD_ROUNDS} if overhead
                                                       else {}))
            torch_runs = {int(k[6:]): times.pop(k) for k in list(times) if k.startswith("torch@")}
            if torch_runs:
                row.torch_threads = min(torch_runs, key=lambda n: np.median(torch_runs[n]))
                times["torch"] = torch_runs[row.torch_threads]
            row.times_s.update(times)
    except Exception as e:  # noqa: BLE001 - a broken case is reported, the sweep goes on
        row.error = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def gpu_usable() -> tuple[bool, str]:
    """(usable, reason) for the CuPy backend."""
    try:
        import cupy
    except ImportError as e:
        return False, f"CuPy not installed ({e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return False, f"no usable CUDA driver/GPU ({type(e).__name__}: {str(e)[:120]})"
    return (True, f"{count} GPU(s)") if count else (False, "no GPU")


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


def summarise(rows: list[Row], copy_bw: float, gpu: bool) -> dict:
    """Per-row medians, GB/s, % of copy bandwidth and baseline ratios; suite geomeans."""
    table, ratios = [], {}
    for r in rows:
        entry = {"case": r.case, "shape": list(r.shape), "dtype": r.dtype, "layout": r.layout,
                 "check": r.check, "checks": r.checks, "error": r.error, "missing": r.missing,
                 "first_call_ms": None if r.first_call_s is None else round(r.first_call_s * 1e3, 2)}
        tg = r.median("gpupool")
        if tg:
            entry.update(gpupool_ms=round(tg * 1e3, 4), gbps=round(r.bytes / tg / 1e9, 2),
                         pct_copy_bw=round(100 * r.bytes / tg / copy_bw, 1))
            for name in r.times_s:
                if name != "gpupool":
                    tb = r.median(name)
                    entry[f"{name}_ms"] = round(tb * 1e3, 4)
                    entry[f"{name}_over_gpupool"] = round(tb / tg, 3)
                    if r.dtype in ("float32", "float16") and not r.error:
                        ratios.setdefault((r.dtype, name), []).append((r.case, tg / tb))
        if r.torch_threads is not None:
            entry["torch_threads"] = r.torch_threads
        table.append(entry)
    geo = {}
    for (dtype, name), pairs in sorted(ratios.items()):
        vals = [v for _, v in pairs]
        worst = max(pairs, key=lambda p: p[1])
        geo.setdefault(dtype, {})[name] = {
            "cases": len(vals), "geomean_gpupool_time_over_baseline":
            round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 3),
            "worst_case": worst[0], "worst_gpupool_time_over_baseline": round(worst[1], 3)}
    return {"rows": table, "summary": geo}


def summarise_overhead(rows: list[Row]) -> dict:
    """Per-row median microseconds per call and each baseline's time over gpupool's (a
    ``_loop`` time over gpupool's loop time)."""
    table = []
    for r in rows:
        entry = {"case": r.case, "shape": list(r.shape), "dtype": r.dtype, "check": r.check,
                 "checks": r.checks, "error": r.error, "missing": r.missing,
                 "raw_times_s": r.times_s}
        for name in r.times_s:
            entry[f"{name}_us"] = round(r.median(name) * 1e6, 2)
        for name in r.times_s:
            own = "gpupool_loop" if name.endswith("_loop") else "gpupool"
            if not name.startswith("gpupool") and r.times_s.get(own):
                entry[f"{name}_over_gpupool"] = round(r.median(name) / r.median(own), 3)
        if r.torch_threads is not None:
            entry["torch_threads"] = r.torch_threads
        table.append(entry)
    return {"rows": table}


def overhead_markdown(result: dict) -> str:
    """The overhead section's table: microseconds per warm call."""
    rows = result["overhead"]["rows"]
    names = sorted({k[:-3] for r in rows for k in r if k.endswith("_us")},
                   key=lambda n: (not n.startswith("gpupool"), n))
    head = ["case", "shape", "dtype"] + [f"{n} us" + ("" if n.startswith("gpupool") else " (x)")
                                         for n in names] + ["check"]
    lines = ["### Fixed cost per call", "",
             "Warm calls on tiny inputs, median microseconds per call"
             + (" (GPU: `X` = host time of one call, launches queued; `X_loop` = a loop of "
                "calls ended by one device sync, per call)" if result["backend"] == "cupy"
                else "") + "; (x) = baseline time / gpupool time.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"]]
        if r.get("error"):
            cells += [f"error: {r['error']}"] + [""] * (len(head) - 4)
        else:
            for n in names:
                if f"{n}_us" not in r:
                    cells.append(f"missing: {r['missing'].get(n.removesuffix('_loop'), 'n/a')}")
                elif n.startswith("gpupool"):
                    cells.append(f"{r[n + '_us']:.1f}")
                else:
                    cells.append(f"{r[n + '_us']:.1f} ({r[n + '_over_gpupool']:.2f}x)")
            cells.append(r["check"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    names = sorted({k[:-3] for row in result["rows"] for k in row
                    if k.endswith("_ms") and k not in ("gpupool_ms", "first_call_ms")})
    head = ["case", "shape", "dtype", "layout", "gpupool ms", "GB/s", "% copy bw"] + \
           [f"{n} ms (x)" for n in names] + ["first call ms", "check"]
    lines = [f"**{result['device']}**, backend `{result['backend']}`, size `{result['size']}`, "
             f"copy bandwidth {result['copy_bw_gbps']} GB/s (measured in this run); "
             f"(x) = baseline time / gpupool time, > 1 means gpupool is faster.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        if r.get("error"):
            cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"], r["layout"],
                     f"error: {r['error']}"] + [""] * (len(head) - 5)
        else:
            cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"], r["layout"],
                     f"{r['gpupool_ms']:.3f}", f"{r['gbps']:.1f}", f"{r['pct_copy_bw']:.0f}"]
            for n in names:
                cells.append(f"{r[n + '_ms']:.3f} ({r[n + '_over_gpupool']:.2f}x)" if n + "_ms" in r
                             else f"missing: {r['missing'].get(n, 'n/a')}")
            cells += [str(r["first_call_ms"]), r["check"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if any("torch_threads" in r for r in result["rows"]):
        lines.append("- torch: the faster of 1 thread and every core, per case (JSON: "
                     "`torch_threads`)")
    for dtype, per_baseline in result["summary"].items():
        for name, s in per_baseline.items():
            lines.append(f"- {dtype} vs {name}: geomean gpupool time / {name} time = "
                         f"{s['geomean_gpupool_time_over_baseline']} over {s['cases']} cases; "
                         f"worst {s['worst_gpupool_time_over_baseline']} ({s['worst_case']})")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if "gbps" in r]
    names = ["gpupool"] + sorted({k[:-3] for r in rows for k in r if k.endswith("_ms")
                                  and k not in ("gpupool_ms", "first_call_ms")})
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.8), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        gbps = [r["bytes"] / (r[f"{name}_ms"] / 1e3) / 1e9 if f"{name}_ms" in r else 0
                for r in rows] if name != "gpupool" else [r["gbps"] for r in rows]
        ax.bar(np.arange(len(rows)) + i * width, gbps, width, label=name)
    ax.axhline(result["copy_bw_gbps"], color="k", linestyle="--", label="copy bandwidth")
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [r["case"] for r in rows],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"gpupool bench ({result['device']}, {result['backend']}, {result['size']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def output_options(json_path=None, markdown_path=None, plot_path=None) -> dict:
    """The output paths by the ``gpupool bench`` option that gives them."""
    return {"--json": json_path, "--markdown": markdown_path, "--plot": plot_path}


def run(size: str = "small", ops=None, backend: str = "auto", json_path=None,
        markdown_path=None, plot_path=None) -> dict:
    """Run the suite; print the table; write the files asked for; return the result dict.

    Bad ``ops`` or an output path that cannot be written (``ValueError``) and a ``plot_path``
    without matplotlib (``ImportError``) are reported before anything runs (``preflight``)."""
    cases = preflight(ops, output_options(json_path, markdown_path, plot_path))
    overhead_cases = select_cases(ops, OVERHEAD)
    usable, reason = gpu_usable()
    if backend == "cupy" and not usable:
        raise SystemExit(f"gpupool bench: --backend cupy asked for, but {reason}")
    gpu = backend == "cupy" or (backend == "auto" and usable)
    if gpu:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
    else:
        torch, _ = _torch()
        if torch is not None:
            torch.set_num_threads(os.cpu_count() or 1)
    copy_bw = copy_bandwidth(gpu)
    rows = []
    for case in _progress(cases, "gpupool bench"):
        rows.append(run_case(case, size, gpu))
        if gpu:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
    result = {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "device": device_name(gpu), "backend": "cupy" if gpu else "numpy", "size": size,
              "gpu_status": reason, "versions": versions(gpu), "commit": git_commit(),
              "copy_bw_gbps": round(copy_bw / 1e9, 2)}
    result.update(summarise(rows, copy_bw, gpu))
    for r, row in zip(result["rows"], rows):
        r["bytes"] = row.bytes
        r["raw_times_s"] = row.times_s
    result["overhead"] = summarise_overhead(
        [run_case(case, "small", gpu, overhead=True)
         for case in _progress(overhead_cases, "gpupool bench overhead")])
    text = markdown(result)
    if result["overhead"]["rows"]:
        text += "\n" + overhead_markdown(result)
    print(text)
    for path, write in ((json_path, lambda p: Path(p).write_text(json.dumps(result, indent=1))),
                        (markdown_path, lambda p: Path(p).write_text(text)),
                        (plot_path, lambda p: plot(result, p))):
        if path:
            try:
                write(path)
                print(f"wrote {path}", file=sys.stderr)
            except ImportError as e:
                print(f"gpupool bench: {path} not written ({e})", file=sys.stderr)
    return result
