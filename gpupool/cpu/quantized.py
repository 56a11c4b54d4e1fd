"""NumPy backend of :mod:`gpupool.quantized`: integer arithmetic only.

Window sums reuse the float backend's separable tap loops in the narrowest integer dtype that
holds them; adaptive sums are differences of prefix sums. :func:`requantize` applies the host
table of :func:`gpupool.quantized.requant_table` exactly as the CUDA kernels do; when the
accumulators are narrow (small windows) it is run once per plan over every possible
accumulator, and each call is then a single gather from that code table (:func:`_code_table`).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .numpy_backend import window
from .reduce import canonical, expand, in_blocks, scratch, separable_window
from ..quantized_spec import HEAD, LEVELS, AvgPlan
from ..spec import AdaptiveSpec, WindowSpec, adaptive_window


def requantize(acc, rows, plan: AvgPlan, out) -> None:
    """``out = saturate(zp_out + sign(acc) * f(|acc|))`` through the plan's table (int64
    throughout; ``rows`` broadcasts against ``acc``)."""
    table = plan.table
    x = np.abs(acc, dtype=np.int64)
    np.minimum(x, table[rows, 2], out=x)
    shift = table[rows, 1]
    v = x * table[rows, 0]
    v += (np.int64(1) << shift) >> 1
    v >>= shift
    np.clip(v, 0, LEVELS, out=v)
    base = rows * np.int64(table.shape[1]) + HEAD + v
    flat = table.reshape(-1)
    v += flat[base + 1] <= x
    v -= flat[base] > x
    np.negative(v, out=v, where=acc < 0)
    v += plan.zp_out
    np.clip(v, plan.qmin, plan.qmax, out=v)
    out[...] = v


CODE_TABLE_LIMIT = 1 << 20  # entries; wider accumulators requantize through the table per call


@functools.lru_cache(maxsize=64)
def _code_table(plan: AvgPlan):
    """``(amax, width, codes)`` with ``codes[row * width + amax + acc]`` the output code of every
    accumulator ``|acc| <= amax`` (``amax = 255 * max valid taps``), computed by
    :func:`requantize` itself; ``None`` when that table would exceed ``CODE_TABLE_LIMIT``."""
    amax = 255 * plan.max_count
    rows, width = len(plan.table), 2 * amax + 1
    if rows * width > CODE_TABLE_LIMIT:
        return None
    acc = np.broadcast_to(np.arange(-amax, amax + 1, dtype=np.int64), (rows, width))
    codes = np.empty((rows, width), dtype=np.int64)
    requantize(acc, np.arange(rows)[:, None], plan, codes)
    dtype = np.result_type(np.min_scalar_type(plan.qmin), np.min_scalar_type(plan.qmax))
    return amax, width, codes.astype(dtype).reshape(-1)


def _requantizer(plan: AvgPlan, geom):
    """``(sum_dtype, finish)``: the working dtype for window sums of the codes (``zp_in`` not
    yet subtracted: the plan's counts of valid taps each) and ``finish(acc, dest)``, which
    requantizes them, broadcasting per position as ``geom``'s canonical layout."""
    table = _code_table(plan)
    rows, counts = plan.rows_and_counts()
    if table is None:
        rows = expand(rows, geom)
        zp_counts = expand(counts.astype(np.int64) * plan.zp_in, geom)

        def finish(acc, dest):
            acc -= zp_counts
            requantize(acc, rows, plan, dest)
        return np.dtype(plan.acc_dtype), finish
    amax, width, codes = table
    offsets = expand((rows.astype(np.int64) * width + amax
                       - counts.astype(np.int64) * plan.zp_in).astype(np.int32), geom)

    def finish(acc, dest):
        shape = np.broadcast_shapes(acc.shape, offsets.shape)
        index = np.add(acc, offsets, out=scratch("index", shape, np.intp))
        np.take(codes, index, out=dest)  # in range by construction
    # |sum of the codes| <= amax (255 per tap): int16 sums whenever that fits
    return np.dtype(np.int16 if amax <= np.iinfo(np.int16).max else plan.acc_dtype), finish


def qmax_window(x, spec: WindowSpec, out) -> None:
    window(x, spec, out, None)  # integer max: exact as it is


def qavg_window(x, spec: WindowSpec, out, plan: AvgPlan) -> None:
    geom = spec.geom
    xc, oc = canonical(x, geom), canonical(out, geom)
    acc_dtype, finish = _requantizer(plan, geom)

    def block(b0, b1):
        finish(separable_window(xc[b0:b1], spec, acc_dtype), oc[b0:b1])  # sums of the codes
    in_blocks(block, geom.batch, x.itemsize * math.prod(geom.spatial) * geom.channels)


def qavg_adaptive(x, spec: AdaptiveSpec, out, plan: AvgPlan) -> None:
    geom = spec.geom
    xc, oc = canonical(x, geom), canonical(out, geom)
    _, finish = _requantizer(plan, geom)
    axes = tuple(range(1, geom.nd + 1))
    bounds = [np.array([adaptive_window(i, size, o) for i in range(o)], dtype=np.intp)
              for size, o in zip(geom.spatial, spec.out_spatial)]

    def block(b0, b1):
        cur = xc[b0:b1]
        if spec.is_global:
            acc = np.sum(cur, axis=axes, dtype=np.int64, keepdims=True)
        else:  # window sum = difference of prefix sums, one axis at a time
            for axis, b in zip(axes, bounds):
                prefix = np.cumsum(cur, axis=axis, dtype=np.int64)
                pad = [(0, 0)] * prefix.ndim
                pad[axis] = (1, 0)
                prefix = np.pad(prefix, pad)
                cur = np.take(prefix, b[:, 1], axis=axis) - np.take(prefix, b[:, 0], axis=axis)
            acc = cur
        finish(acc, oc[b0:b1])
    in_blocks(block, geom.batch, x.itemsize * math.prod(geom.spatial) * geom.channels)
