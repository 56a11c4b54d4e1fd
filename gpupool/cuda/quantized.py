"""CUDA backend of :mod:`gpupool.quantized`: kernels in ``kernels_cu/quantized_pool.cu``.

Reuses the float backend's machinery (:mod:`gpupool.cuda.backend`): the source loader
(``load_module``, memoized per device), the launch planner and its thread-to-output maps, and
the index-type rule. The requantization table and the per-position table rows are built on
the host (:func:`gpupool.quantized._avg_plan`) and copied to each device once per plan.

* max, NHWC with ``C % 4 == 0`` (and a 4-byte aligned buffer): ``qmax_pool_nhwc4``, 4 channels
  per 32-bit word with ``__vmaxs4`` / ``__vmaxu4``; otherwise the float backend's integer
  ``max_pool`` kernel (one code per thread: packing bytes would cost more than it saves).
* average: ``qavg_pool`` (window), ``qavg_adaptive``, ``qavg_global`` (one block per NCHW plane)
  and ``qavg_global_nhwc`` (threads along channels and positions, one block per batch row),
  int32 accumulation (int64 where a window could overflow it).
* more than 3 spatial dims: the NumPy backend through a host round trip, as the float ops.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import cupy
import numpy as np

from . import backend as CB
from . import planner
from ..cpu import quantized as cpu_quantized
from ..registry import register
from ..quantized import AvgPlan
from ..spec import AdaptiveSpec, Geometry, WindowSpec

SOURCE = "quantized_pool.cu"
CODE_TYPES = {"int8": "signed char", "uint8": "unsigned char"}
ACC_TYPES = {"int32": "int", "int64": "long long"}
GLOBAL_THREADS = 256


def _b(v: bool) -> str:
    return "true" if v else "false"


def qavg_pool_name(dtype, acc, itype, k, nhwc):
    return f"qavg_pool<{CODE_TYPES[dtype]}, {ACC_TYPES[acc]}, {itype}, {k}, {_b(nhwc)}>"


def qavg_adaptive_name(dtype, acc, itype, nhwc):
    return f"qavg_adaptive<{CODE_TYPES[dtype]}, {ACC_TYPES[acc]}, {itype}, {_b(nhwc)}>"


def qavg_global_name(dtype, acc, itype, nhwc):
    base = "qavg_global_nhwc" if nhwc else "qavg_global"
    return f"{base}<{CODE_TYPES[dtype]}, {ACC_TYPES[acc]}, {itype}>"


def qmax_nhwc4_name(dtype, itype, k):
    return f"qmax_pool_nhwc4<{_b(dtype == 'int8')}, {itype}, {k}>"


def instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) this backend can request."""
    out = []
    ks = (0,) + planner.SPECIALISED_K
    for itype in CB.INDEX_TYPES:
        for dtype in CODE_TYPES:
            out += [(SOURCE, qmax_nhwc4_name(dtype, itype, k)) for k in ks]
            for acc in ACC_TYPES:
                for nhwc in (False, True):
                    out += [(SOURCE, qavg_pool_name(dtype, acc, itype, k, nhwc)) for k in ks]
                    out.append((SOURCE, qavg_adaptive_name(dtype, acc, itype, nhwc)))
                    out.append((SOURCE, qavg_global_name(dtype, acc, itype, nhwc)))
    return out


def _kernel(name: str):
    return CB.kernel(SOURCE, name)


@functools.lru_cache(maxsize=256)
def _device_tables(plan: AvgPlan, device_id: int):
    """The plan's rows and table on ``device_id``, copied once per plan and device. The copy
    is waited for, as any stream may read the tables later."""
    with cupy.cuda.Device(device_id):
        rows, table = cupy.asarray(plan.rows), cupy.asarray(plan.table)
        cupy.cuda.get_current_stream().synchronize()
        return rows, table


def _host_fallback(family, x, spec, out, *extra) -> None:
    """More than 3 spatial dims: the NumPy backend through a host round trip (synchronises)."""
    xh = cupy.asnumpy(x)
    oh = np.empty(out.shape, dtype=out.dtype)
    getattr(cpu_quantized, family)(xh, spec, oh, *extra)
    out.set(oh)


def _word_spec(spec: WindowSpec) -> WindowSpec:
    """The same window over 32-bit words of 4 channels (NHWC, C % 4 == 0)."""
    g = spec.geom
    geom = Geometry(g.func, g.shape[:-1] + (g.channels // 4,), "int32", g.layout, g.nd)
    return dataclasses.replace(spec, geom=geom)


def _can_use_vmax4(x, spec: WindowSpec) -> tuple[bool, str]:
    g = spec.geom
    if g.layout != "NHWC":
        return False, "NCHW: consecutive threads read consecutive columns, one code each"
    if g.channels % 4:
        return False, f"C = {g.channels} is not a multiple of 4"
    if x.data.ptr % 4:
        return False, "buffer not 4-byte aligned"
    return True, "NHWC with C % 4 == 0: 4 channels per 32-bit word"


@register("qmax_window", "cupy")
def qmax_window(x, spec: WindowSpec, out) -> None:
    if spec.geom.nd > 3:
        _host_fallback("qmax_window", x, spec, out)
        return
    x = CB._contiguous(x)
    ok, _ = _can_use_vmax4(x, spec)
    if not ok:
        CB.window(x, spec, out, None)
        return
    wspec = _word_spec(spec)
    device_id = cupy.cuda.runtime.getDevice()
    pl = planner.plan(wspec, CB.device_info(device_id))
    la = pl.launches[0]
    it = CB._itype_scalar(pl.index_type)
    geo = CB._geo_args(wspec, it, True) + (np.int32(la.rows),)
    fn = _kernel(qmax_nhwc4_name(spec.geom.dtype, pl.index_type, planner.static_window(spec)))
    fn(la.grid, la.block, (x.view(cupy.uint32), out.view(cupy.uint32)) + geo)


def _requant_args(plan: AvgPlan) -> tuple:
    return (np.int32(plan.zp_in), np.int32(plan.zp_out), np.int32(plan.qmin),
            np.int32(plan.qmax))


@register("qavg_window", "cupy")
def qavg_window(x, spec: WindowSpec, out, plan: AvgPlan) -> None:
    if spec.geom.nd > 3:
        _host_fallback("qavg_window", x, spec, out, plan)
        return
    device_id = cupy.cuda.runtime.getDevice()
    rows, table = _device_tables(plan, device_id)
    pl = planner.plan(spec, CB.device_info(device_id))
    la = pl.launches[0]
    it = CB._itype_scalar(pl.index_type)
    geo = CB._geo_args(spec, it, True) + (np.int32(la.rows),)
    name = qavg_pool_name(spec.geom.dtype, plan.acc_dtype, pl.index_type,
                          planner.static_window(spec), spec.geom.layout == "NHWC")
    _kernel(name)(la.grid, la.block,
                  (CB._contiguous(x), out) + geo + (rows, table) + _requant_args(plan))


@register("qavg_adaptive", "cupy")
def qavg_adaptive(x, spec: AdaptiveSpec, out, plan: AvgPlan) -> None:
    g = spec.geom
    nhwc = g.layout == "NHWC"
    device_id = cupy.cuda.runtime.getDevice()
    rows, table = _device_tables(plan, device_id)
    x = CB._contiguous(x)
    if spec.is_global:
        seglen = math.prod(g.spatial)
        span = math.prod(g.shape) + GLOBAL_THREADS
        itype = "int" if span <= planner.INT32_LIMIT else "long long"
        it = CB._itype_scalar(itype)
        fn = _kernel(qavg_global_name(g.dtype, plan.acc_dtype, itype, nhwc))
        if nhwc:  # threads along channels (up to 64) and positions, one block a batch row
            tx, ty = planner.block_shape(g.channels, 64, seglen)
            y, z = planner._plane_grid(g.batch)
            fn((planner._cdiv(g.channels, tx), y, z), (tx, ty, 1),
               (x, out, it(g.batch), it(seglen), it(g.channels), table) + _requant_args(plan))
        else:
            fn((g.planes, 1, 1), (GLOBAL_THREADS, 1, 1),
               (x, out, it(seglen), table) + _requant_args(plan))
        return
    if g.nd > 3:
        _host_fallback("qavg_adaptive", x, spec, out, plan)
        return
    pl = planner.plan(spec, CB.device_info(device_id))
    la = pl.launches[0]
    it = CB._itype_scalar(pl.index_type)
    geo = CB._geo_args(spec, it, False) + (np.int32(la.rows),)
    name = qavg_adaptive_name(g.dtype, plan.acc_dtype, pl.index_type, nhwc)
    _kernel(name)(la.grid, la.block, (x, out) + geo + (rows, table) + _requant_args(plan))
