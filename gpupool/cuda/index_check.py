"""The check of a max's indices on CuPy arrays (the ``index_rule`` entry point of
:class:`gpupool.cuda.entry_points.CudaBackend`), which the backward ops and ``max_unpool`` run
before their kernels: one pass of ``max_index_check`` (``kernels_cu/max_pool.cu``) over the
indices, then one 8-byte transfer to the host. Poolings of more than 3 spatial dims, which
the kernels do not reach, are checked by CuPy's own ops
(:func:`gpupool.windows.index_rule`)."""
from __future__ import annotations

import cupy
import numpy as np

from . import kernels, launching, planner
from .grid import divider
from .launching import Step, contiguous, geo_args, itype_scalar, launch_cache
from .names import index_check_name
from .. import windows as rules
from ..arrays import dtype_name
from ..spec import WindowSpec


@launch_cache
def check_step(pooling, device_id: int, indices_dtype: str) -> Step:
    """The launch that checks indices of dtype ``indices_dtype`` of ``pooling`` (a WindowSpec
    or AdaptiveSpec) on ``device_id`` (built once)."""
    pl = planner.index_check_plan(pooling, launching.device_info(device_id))
    la = pl.launches[0]
    windowed = isinstance(pooling, WindowSpec)
    g = pooling.geom
    nhwc = g.layout == "NHWC"
    name = index_check_name(indices_dtype, pl.index_type, nhwc, not windowed)
    it = itype_scalar(pl.index_type)
    dilation = planner.canonical3(pooling.dilation if windowed else (), 1)
    sizes = (g.channels if nhwc else 1,) + planner.canonical3(pooling.out_spatial, 1)[::-1] + (
        planner.canonical3(g.spatial, 1)[:0:-1]) + dilation
    args = (geo_args(pooling, it, windowed) + (np.int32(1),)
            + tuple(np.int64(divider(v)) for v in sizes))
    return Step(kernels.kernel(name), la.grid, la.block, ("indices", "flags"), args)


def index_rule(indices, pooling, windows: bool) -> tuple[bool, bool | None]:
    """:func:`gpupool.windows.index_rule` of CuPy ``indices`` (non-empty, of ``pooling``'s
    output shape), on the current device."""
    if pooling.geom.nd > 3:
        return rules.index_rule(indices, pooling, windows, cupy)
    flags = cupy.zeros(2, np.int32)
    check_step(pooling, cupy.cuda.runtime.getDevice(), dtype_name(indices.dtype))(
        {"indices": contiguous(indices), "flags": flags})
    out_of_plane, outside = flags.get().tolist()
    in_plane = not out_of_plane
    return in_plane, (not outside) if windows else None
