"""The float forward ops on CuPy arrays: window, adaptive (global included) and unpool
pooling, the entry points of :class:`gpupool.cuda.entry_points.CudaBackend`.

Launch plans come from :mod:`gpupool.cuda.planner`; the launch steps of a spec (kernel objects,
grid, block, scalar arguments: :func:`prepared`) are built once per (spec, device). Window and
adaptive pooling with more than 3 spatial dims, which the kernels do not cover, run on the
NumPy backend through a host round trip (:func:`gpupool.cuda.launching.on_host`).
"""
from __future__ import annotations

import math

import cupy
import numpy as np

from . import index_check, kernels, launching, planner
from .names import (acc_dtype, adaptive_name, global_name, packs_name, partial_dtype,
                    rows_name, unpool_name, window_name)
from .grid import divider
from .launching import (Step, alignment, contiguous, geo_args, global_passes, itype_scalar,
                        launch, launch_cache, on_host, reduction_args)
from .row_tiles import ROW_TILE_PARAMS
from ..arrays import dtype_name
from ..spec import AdaptiveSpec, UnpoolSpec, WindowSpec


@launch_cache
def prepared(spec, device_id: int, indices_dtype: str = "int64", scatter: bool = False,
             align: int = 16) -> tuple[tuple[Step, ...], tuple | None]:
    """Launch steps of ``spec`` on ``device_id`` and the (size, dtype) of scratch partials
    (None when a single pass). Compiles the kernels it needs (once per device).
    ``indices_dtype``: dtype of an unpool's indices; ``scatter``: an unpool's scatter plan
    even where its gather applies; ``align``: the bytes the input's start is aligned to
    (:func:`gpupool.cuda.planner.plan`)."""
    pl = planner.plan(spec, launching.device_info(device_id), scatter=scatter, align=align)
    spec = planner.kernel_spec(spec, align)
    itype = pl.index_type
    it = itype_scalar(itype)
    g = spec.geom
    nhwc = g.layout == "NHWC"
    steps = []
    scratch = None
    if pl.family in ("window", "adaptive"):
        la = pl.launches[0]
        geo = geo_args(spec, it, pl.family == "window") + (np.int32(la.rows),)
        if pl.family == "window":
            if la.kernel.endswith("_rows"):
                name = rows_name(la.kernel, g.dtype, tuple(map(la.get, ROW_TILE_PARAMS)))
            elif la.kernel.endswith("_packs"):
                name = packs_name(la.kernel, g.dtype, itype, planner.static_window(spec))
            else:
                name = window_name(la.kernel, g.dtype, itype, planner.static_window(spec), nhwc)
            extra = reduction_args(spec)
        elif la.kernel.endswith("_lanes"):
            name = adaptive_name(la.kernel, g.dtype, itype, nhwc, la.get("batch_rows"))
            extra = tuple(np.int64(divider(v)) for v in (
                math.prod(spec.out_spatial), spec.out_spatial[-2] if g.nd > 1 else 1,
                spec.out_spatial[-1]))
        else:
            name = adaptive_name(la.kernel, g.dtype, itype, nhwc)
            extra = ()
        io = ("x", "out", "indices") if "_indices" in la.kernel else ("x", "out")
        fn = kernels.kernel(name)
        steps.append(Step(fn, la.grid, la.block, io, geo + extra))
    elif pl.family == "global":
        part = partial_dtype(spec.op, g.dtype)
        # an average sums value * (1 / count): finite where the mean is
        scales = (np.dtype(acc_dtype(g.dtype)).type(1.0 / math.prod(g.spatial)),
                  np.dtype(acc_dtype(part)).type(1.0))
        for p in global_passes(spec, pl, it, part):
            name = global_name(p.launch.kernel, spec.op == "max", p.tin, p.tout, itype, p.lanes)
            steps.append(Step(kernels.kernel(name), p.launch.grid,
                               p.launch.block, p.io, p.sizes + (scales[p.second],)))
        if len(pl.launches) > 1:
            scratch = (g.planes * pl.launches[0].get("nchunks"), part)
    else:  # unpool
        la = pl.launches[0]
        gather = la.kernel == "max_unpool_gather"
        tiles = la.kernel == "max_unpool_tiles"
        name = unpool_name(np.dtype(g.dtype).itemsize, indices_dtype, itype,
                           nhwc if gather else None, tiles)
        if tiles:  # the pooled rows, and the windows' D and H sizes
            pool = spec.pooling
            od, oh, ow = planner.canonical3(pool.out_spatial, 1)
            kd, kh, _ = planner.canonical3(pool.kernel, 1)
            scalars = (it(la.get("rows")), it(od * oh), it(oh), it(ow), np.int32(kd),
                       np.int32(kh))
        elif gather:  # the geometry of the pooling that the indices come from
            pool = spec.pooling
            scalars = geo_args(pool, it, True) + (np.int32(la.rows),) + tuple(
                np.int32(math.gcd(s, d)) for s, d in zip(planner.canonical3(pool.stride, 1),
                                                         planner.canonical3(pool.dilation, 1)))
        else:
            scalars = (it(math.prod(g.shape)), it(math.prod(g.spatial)), it(spec.plane_size),
                       it(g.channels))
        steps.append(Step(kernels.kernel(name), la.grid, la.block,
                           ("x", "indices", "out") + (("flags",) if tiles else ()), scalars))
    return tuple(steps), scratch


def _run(x, spec, out, indices, indices_dtype: str = "int64") -> None:
    x = contiguous(x)
    steps, scratch = prepared(spec, cupy.cuda.runtime.getDevice(), indices_dtype,
                              align=alignment(x))
    launch(steps, scratch, {"x": x, "out": out, "indices": indices})


def window(x, spec: WindowSpec, out, indices) -> None:
    if spec.geom.nd > 3:
        from ..cpu import numpy_backend
        on_host(numpy_backend.window, x, spec, out, indices)
        return
    _run(x, spec, out, indices)


def adaptive(x, spec: AdaptiveSpec, out, indices) -> None:
    if spec.geom.nd > 3 and not (spec.is_global and indices is None):
        from ..cpu import numpy_backend
        on_host(numpy_backend.adaptive, x, spec, out, indices)
        return
    _run(x, spec, out, indices)


def unpool(x, spec: UnpoolSpec, out, indices) -> bool:
    """:meth:`gpupool.backends.Backend.unpool`. The tiles (int64 indices, windows that tile
    the output) check the indices as they go, then one 4-byte transfer; where one lies outside
    its window, the check of :func:`gpupool.cuda.index_check.index_rule` and the scatter
    follow. Otherwise that check comes first (one pass, one 8-byte transfer), then the gather
    where windows do not overlap and every index lies in its own window or is -1, else zero
    fill + scatter."""
    if not indices.size:
        out.fill(0)
        return True
    device = cupy.cuda.runtime.getDevice()
    indices_dtype = dtype_name(indices.dtype)
    arrays = {"x": contiguous(x), "out": out, "indices": contiguous(indices)}
    gathers = planner.unpool_gathers(spec)
    if planner.unpool_tiles(spec):
        steps, scratch = prepared(spec, device, indices_dtype, False)
        arrays["flags"] = flags = cupy.zeros(1, np.int32)
        launch(steps, scratch, arrays)
        if not int(flags.get()[0]):
            return True
        gathers = False
    in_plane, in_windows = index_check.index_rule(indices, spec.pooling, gathers)
    if not in_plane:
        return False
    gather = gathers and in_windows
    if not gather:
        out.fill(0)
    steps, scratch = prepared(spec, device, indices_dtype, not gather)
    launch(steps, scratch, arrays)
    return True
