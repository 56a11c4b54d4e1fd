"""CUDA backend of the backward ops (:mod:`gpupool.gradients`): kernels in
``kernels_cu/pool_backward.cu`` (the ``backward`` entry point of
:class:`gpupool.cuda.entry_points.CudaBackend`).

Reuses the float backend's machinery: kernel loading (:mod:`gpupool.cuda.kernels`), launch
steps (:mod:`gpupool.cuda.launching`, cached per spec and device) and the planner, whose gather plan
(:func:`gpupool.cuda.planner.gather_view`) tiles the forward input's positions with one
thread per input element. The kernels gather in the order of the NumPy backend
(:mod:`gpupool.cpu.backward`), so both give the same bits (Lp with p other than 1 and 2 up to
``pow``'s rounding).

* max (window, adaptive, global): int64 indices; other index dtypes are widened first. A 2-D
  NCHW window max of stride 2 or average of stride 2 or 1, with 2 or 3 taps
  (:func:`gpupool.cuda.tiled_gathers.cells`), takes a cell of rows per thread, each covering
  window loaded once (``max_cells_backward``, ``avg_cells_backward``: its divisor computed
  once too).
* avg (window, adaptive, global) and Lp: the nested sums of the NumPy backend, in float for
  float16 and bfloat16. A global average (an adaptive one to size 1) is a broadcast: threads
  store 16-byte packs of a plane's gradient over its size (``avg_global_backward``); so do
  averages whose windows tile the input, 2 wide along W (NCHW), a thread per pack of gradients
  (``avg_tiles_backward``), or any window size (NHWC), a thread per pack of a gradient
  position's channels (``avg_channel_tiles_backward``).
* global ops run as a 1-D pooling of each flattened plane, so any number of spatial dims;
  window and adaptive ops with more than 3 spatial dims run on the NumPy backend through a
  host round trip, as the forward ops.
* non-contiguous operands are first copied with ``cupy.ascontiguousarray``.
"""
from __future__ import annotations

import math

import cupy
import numpy as np

from . import index_check, kernels, launching, planner
from .names import backward_name
from .launching import (Step, contiguous, geo_args, itype_scalar, launch, launch_cache,
                        on_host, reduction_args)
from ..cpu import backward as cpu_backward
from ..grad_spec import GradSpec
from ..spec import WindowSpec

#: The arrays each op's kernels take, in order (names of :class:`gpupool.cuda.launching.Step`).
OPERANDS = {"max": ("grad", "indices", "out"), "avg": ("grad", "out"),
            "lp": ("grad", "y", "x", "out")}


@launch_cache
def backward_steps(spec: GradSpec, device_id: int, checks: bool = False) -> tuple:
    """The launch of ``spec``'s backward on ``device_id`` (built once); ``checks``: that of
    a max's kernel that checks the indices as it goes (its step also takes "flags"), None
    where none does."""
    pl = planner.plan(spec, launching.device_info(device_id))
    la = pl.launches[0]
    if checks and la.kernel != "max_cells_backward":
        return None
    view = planner.gather_view(spec)
    g = view.geom
    extra = dict(la.extra)
    base = "max_cells_checked_backward" if checks else la.kernel
    fn = kernels.kernel(backward_name(base, g.dtype, pl.index_type, g.layout == "NHWC",
                                      extra.get("covers", 0), extra.get("stride", 2)))
    if la.kernel == "avg_global_backward":
        it = itype_scalar(pl.index_type)
        nhwc = g.layout == "NHWC"
        args = (it(g.batch if nhwc else g.planes), it(g.channels if nhwc else 1),
                it(math.prod(g.spatial)), np.int32(la.get("group")))
        return (Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None
    if la.kernel == "avg_tiles_backward":
        it = itype_scalar(pl.index_type)
        kd, kh, _ = planner.canonical3(view.kernel, 1)
        args = (it(la.get("rows")), it(planner.canonical3(view.out_spatial, 1)[1]),
                it(view.out_spatial[-1]), np.int32(kd), np.int32(kh),
                np.int32(view.divisor_override or math.prod(view.kernel)))
        return (Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None
    if la.kernel == "avg_channel_tiles_backward":
        it = itype_scalar(pl.index_type)
        kd, kh, kw = planner.canonical3(view.kernel, 1)
        _, oh, ow = planner.canonical3(view.out_spatial, 1)
        args = (it(la.get("rows")), it(oh), it(ow), it(g.channels), np.int32(kd), np.int32(kh),
                np.int32(kw), np.int32(view.divisor_override or math.prod(view.kernel)))
        return (Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None
    if la.kernel in ("max_cells_backward", "avg_cells_backward"):
        (ih, iw), (oh, ow) = g.spatial, view.out_spatial
        args = tuple(np.int32(v) for v in (ih, iw, oh, ow, *view.kernel,
                                           *(pb for pb, _ in view.pads)))
        if spec.op == "avg":
            args = (np.int32(g.planes),) + args + tuple(np.int32(v) for v in (
                *(pe for _, pe in view.pads), view.count_include_pad,
                view.divisor_override or 0))
        io = OPERANDS[spec.op] + (("flags",) if base == "max_cells_checked_backward" else ())
        return (Step(fn, la.grid, la.block, io, args),), None
    windowed = isinstance(view, WindowSpec)
    args = geo_args(view, itype_scalar(pl.index_type), windowed) + (np.int32(la.rows),)
    if windowed:
        args += tuple(np.int32(math.gcd(s, d)) for s, d in zip(
            planner.canonical3(view.stride, 1), planner.canonical3(view.dilation, 1)))
        args += reduction_args(view)
    return (Step(fn, la.grid, la.block, OPERANDS[spec.op], args),), None


def backward(grad, spec: GradSpec, out, indices=None, x=None, y=None) -> None:
    """Write the gradient of the input into ``out`` (C-contiguous, the forward input's
    shape, ``grad``'s dtype), as the NumPy backend's ``backward``."""
    if planner.gather_view(spec).geom.nd > 3:
        on_host(cpu_backward.backward, grad, spec, out, indices=indices, x=x, y=y)
        return
    steps, scratch = backward_steps(spec, cupy.cuda.runtime.getDevice())
    launch(steps, scratch, _arrays(grad, out, indices, x, y))


def checked_max_backward(grad, spec: GradSpec, out, indices) -> bool:
    """:meth:`gpupool.backends.Backend.checked_max_backward`: the gradients by cells of stride 2
    check the indices as they go (``max_cells_checked_backward``, then a 4-byte transfer); the
    others run after :func:`gpupool.cuda.index_check.index_rule` (a pass and its transfer)."""
    checking = (planner.gather_view(spec).geom.nd <= 3
                and backward_steps(spec, cupy.cuda.runtime.getDevice(), True))
    if checking:
        steps, scratch = checking
        arrays = _arrays(grad, out, indices)
        arrays["flags"] = flags = cupy.zeros(1, np.int32)
        launch(steps, scratch, arrays)
        return not int(flags.get()[0])
    in_plane, in_windows = index_check.index_rule(indices, spec.forward, True)
    if in_plane and in_windows:
        backward(grad, spec, out, indices=indices)
    return in_plane and in_windows


def _arrays(grad, out, indices=None, x=None, y=None) -> dict:
    """The kernels' operands by name: C-contiguous, a max's indices as int64."""
    arrays = {"grad": contiguous(grad), "out": out}
    if indices is not None:
        arrays["indices"] = contiguous(indices if indices.dtype == np.int64
                                          else indices.astype(np.int64))
    if x is not None:
        arrays["x"], arrays["y"] = contiguous(x), contiguous(y)
    return arrays
