"""CUDA backend of the backward ops (:mod:`gpupool.gradients`): kernels in
``kernels_cu/pool_backward.cu`` (the ``backward`` entry point of
:class:`gpupool.cuda.entry_points.CudaBackend`).

Reuses the float backend's machinery (:mod:`gpupool.cuda.backend`): kernel loading, launch
steps (cached per spec and device) and the planner, whose gather plan
(:func:`gpupool.cuda.planner.gather_view`) tiles the forward input's positions with one
thread per input element. The kernels gather in the order of the NumPy backend
(:mod:`gpupool.cpu.backward`), so both give the same bits (Lp with p other than 1 and 2 up to
``pow``'s rounding).

* max (window, adaptive, global): int64 indices; other index dtypes are widened first.
* avg (window, adaptive, global) and Lp: the nested sums of the NumPy backend, in float for
  float16 and bfloat16. A global average (an adaptive one to size 1) is a broadcast: threads
  store 16-byte packs of a plane's gradient over its size (``avg_global_backward``).
* global ops run as a 1-D pooling of each flattened plane, so any number of spatial dims;
  window and adaptive ops with more than 3 spatial dims run on the NumPy backend through a
  host round trip, as the forward ops.
* non-contiguous operands are first copied with ``cupy.ascontiguousarray``.
"""
from __future__ import annotations

import math

import cupy
import numpy as np

from . import backend as CB
from . import planner
from ..cpu import backward as cpu_backward
from ..grad_spec import GradSpec
from ..spec import ACC_DTYPES, FLOAT_DTYPES, WindowSpec

SOURCE = "pool_backward.cu"
KERNELS = ("max_window_backward", "max_adaptive_backward", "avg_window_backward",
           "lp_window_backward", "avg_adaptive_backward", "avg_global_backward")
#: The arrays each op's kernels take, in order (names of :class:`gpupool.cuda.backend.Step`).
OPERANDS = {"max": ("grad", "indices", "out"), "avg": ("grad", "out"),
            "lp": ("grad", "y", "x", "out")}


#: The window kernels, which take the bound on covering windows (planner.gather_covers).
WINDOW_KERNELS = ("max_window_backward", "avg_window_backward", "lp_window_backward")


def kernel_name(kernel_base: str, dtype: str, itype: str, nhwc: bool, covers: int = 0) -> str:
    tail = f", {covers}" if kernel_base in WINDOW_KERNELS else ""
    return f"{kernel_base}<{CB.ctype(dtype)}, {itype}, {CB.cbool(nhwc)}{tail}>"


def instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) this backend can request."""
    return [(SOURCE, kernel_name(base, dtype, itype, nhwc, covers)) for base in KERNELS
            for dtype in FLOAT_DTYPES for itype in CB.INDEX_TYPES for nhwc in (False, True)
            for covers in _covers(base, itype)]


def _covers(kernel_base: str, itype: str) -> tuple[int, ...]:
    """The covering-window bounds a kernel is compiled with (planner.gather_covers)."""
    if kernel_base not in WINDOW_KERNELS or itype != "int":
        return (0,)
    return (0, 3) if kernel_base == "max_window_backward" else (0, 1, 2)


@CB.launch_cache
def backward_steps(spec: GradSpec, device_id: int) -> tuple:
    """The launch of ``spec``'s backward on ``device_id`` (built once)."""
    pl = planner.plan(spec, CB.device_info(device_id))
    la = pl.launches[0]
    view = planner.gather_view(spec)
    g = view.geom
    fn = CB.kernel(SOURCE, kernel_name(la.kernel, g.dtype, pl.index_type, g.layout == "NHWC",
                                       dict(la.extra).get("covers", 0)))
    if la.kernel == "avg_global_backward":
        it = CB.itype_scalar(pl.index_type)
        nhwc = g.layout == "NHWC"
        args = (it(g.batch if nhwc else g.planes), it(g.channels if nhwc else 1),
                it(math.prod(g.spatial)), np.int32(la.get("group")))
        return (CB.Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None
    windowed = isinstance(view, WindowSpec)
    args = CB.geo_args(view, CB.itype_scalar(pl.index_type), windowed) + (np.int32(la.rows),)
    if windowed:
        args += tuple(np.int32(math.gcd(s, d)) for s, d in zip(
            planner.canonical3(view.stride, 1), planner.canonical3(view.dilation, 1)))
        if spec.op == "avg":
            args += tuple(np.int32(e) for e in planner.canonical3([e for _, e in view.pads], 0))
            args += (np.int32(view.count_include_pad), np.int32(view.divisor_override or 0))
        elif spec.op == "lp":
            args += (np.dtype(ACC_DTYPES[g.dtype]).type(view.p),)
    return (CB.Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None


def backward(grad, spec: GradSpec, out, indices=None, x=None, y=None) -> None:
    """Write the gradient of the input into ``out`` (C-contiguous, the forward input's
    shape, ``grad``'s dtype), as the NumPy backend's ``backward``."""
    if planner.gather_view(spec).geom.nd > 3:
        CB.on_host(cpu_backward.backward, grad, spec, out, indices=indices, x=x, y=y)
        return
    arrays = {"grad": CB.contiguous(grad), "out": out}
    if spec.op == "max":
        arrays["indices"] = CB.contiguous(indices if indices.dtype == np.int64
                                          else indices.astype(np.int64))
    elif spec.op == "lp":
        arrays["x"], arrays["y"] = CB.contiguous(x), CB.contiguous(y)
    steps, scratch = backward_steps(spec, cupy.cuda.runtime.getDevice())
    CB.launch(steps, scratch, arrays)
