"""NumPy backend: vectorised pooling on the CPU.

Every op works on a canonical view ``(B, *spatial)`` (NCHW) or ``(B, *spatial, C)`` (NHWC),
so spatial axes are always ``1..nd``. Python loops run over window taps only, never over
output elements; values-only max, avg and lp are separable and reduce one spatial axis at a
time. No padded copy is made: each tap's output range is clipped to the taps that land inside
the input. A small block instead gathers every tap of every window at once and combines them in
the same order (:func:`_gather_reduce`): fewer NumPy calls, the same bits. Blocks of planes
sized to stay in cache run on the thread pool of :mod:`gpupool.cpu.threads` (NumPy ufuncs release
the GIL). Nothing on that pool calls BLAS: the global average's mat-vec runs in the calling
thread (:func:`threads.blas_threads`).
"""
from __future__ import annotations

import functools
import itertools
import math
import sys
import threading
from dataclasses import dataclass

import numpy as np

from . import threads
from ..registry import register
from ..spec import AdaptiveSpec, UnpoolSpec, WindowSpec, adaptive_window

BLOCK_BYTES = 1 << 21  # input bytes per work item (best measured on 2 cores); 2+ blocks: threads
SCRATCH_BYTES = 1 << 22  # temporaries up to this size reuse a per-thread buffer
_workspace = threading.local()


def _canonical(a, geom):
    """Reshape to ``(B, *spatial)`` or ``(B, *spatial, C)``; a view whenever possible."""
    return a.reshape((geom.batch,) + a.shape[len(geom.lead):])


def _in_blocks(func, n_items: int, item_bytes: int) -> None:
    """Call ``func(start, stop)`` over ``[0, n_items)`` in cache-sized blocks, on the thread
    pool of :mod:`gpupool.cpu.threads`. Floating-point warnings are silenced: inf - inf gives NaN,
    as on the GPU."""
    inner = func

    def func(start, stop):
        with np.errstate(all="ignore"):
            inner(start, stop)

    per_block = max(1, BLOCK_BYTES // max(item_bytes, 1))
    if n_items <= per_block:
        func(0, n_items)
        return
    blocks = -(-n_items // per_block)
    per_block = -(-n_items // blocks)  # blocks of even size: no short one at the end
    threads.run_all(func, [(i, min(i + per_block, n_items)) for i in range(0, n_items, per_block)])


def _scratch(slot, shape, dtype) -> np.ndarray:
    """Uninitialised temporary of ``shape``: a view of this thread's reusable buffer ``slot``
    (valid until the thread asks for ``slot`` again), or a fresh array when large. Reuse keeps
    small calls off freshly mapped pages, whose faults cost more than the pooling itself."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > SCRATCH_BYTES:
        return np.empty(shape, dtype)
    buffers = _workspace.__dict__.setdefault("buffers", {})
    buf = buffers.get(slot)
    if buf is None or buf.size < nbytes:
        buf = buffers[slot] = np.empty(max(nbytes, 4096), np.uint8)
    return np.ndarray(shape, dtype, buffer=buf)


@functools.cache
def _accumulator(dtype) -> np.dtype:
    """Working dtype: float16 sums run in float32 (NumPy has no fast float16 loops; values-only
    float16 max runs on int16 keys instead, see :func:`_half_keys`)."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _widened(xb, dtype):
    """``xb`` itself when already ``dtype``, else a copy widened to ``dtype`` in this thread's
    scratch (float16 -> float32 by :func:`_half_as_float32`, then scaled)."""
    if xb.dtype == dtype:
        return xb
    if not (xb.dtype == np.float16 and dtype == np.float32):
        cur = _scratch("input", xb.shape, dtype)
        np.copyto(cur, xb)
        return cur
    cur, factor = _half_as_float32(xb)
    if factor != 1:
        np.multiply(cur, np.float32(1 / factor), out=cur)
    return cur


UNSCALED_HALF = 2.0 ** -112  # a half's bits moved into float32 fields: value * 2**-112


def _half_as_float32(xb):
    """``(cur, factor)``: float32 scratch holding the float16 ``xb`` times ``factor``, exactly,
    through integer passes (several times faster than NumPy's cast): the half's bits,
    sign-extended to int32 and shifted left by 13, hold exponent and mantissa in the float32
    fields and the sign in bits 31..28; clearing bits 30..28 leaves a float32 equal to the
    value times 2**-112 (the bias difference), for normals and subnormals alike. Where the
    block holds an inf or NaN (two int16 maxima tell), those get the all-ones exponent and
    the block is scaled to the values themselves (``factor`` 1)."""
    cur = _scratch("input", xb.shape, np.float32)
    half, bits = xb.view(np.int16), cur.view(np.int32)
    np.copyto(bits, half)
    np.left_shift(bits, 13, out=bits)
    np.bitwise_and(bits, np.int32(-0x70000001), out=bits)  # 0x8FFFFFFF
    # inf/NaN: bit patterns 0x7C00..0x7FFF (positive) and 0xFC00..0xFFFF (negative)
    if half.size and (half.max() >= 0x7C00 or half.view(np.uint16).max() >= 0xFC00):
        magnitude = np.bitwise_and(half, 0x7FFF, out=_scratch("keys", xb.shape, np.int16))
        special = np.greater_equal(magnitude, 0x7C00, out=_scratch("mask", xb.shape, np.bool_))
        np.bitwise_or(bits, 0x70000000, out=bits, where=special)
        np.multiply(cur, np.float32(2.0 ** 112), out=cur)
        return cur, 1.0
    return cur, UNSCALED_HALF


@functools.cache
def _lowest(dtype):
    """-inf, or an integer dtype's minimum."""
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _tap_range(size: int, out: int, stride: int, offset: int) -> tuple[int, int]:
    """Outputs ``o`` in [lo, hi) whose tap ``o*stride + offset`` lies in [0, size)."""
    lo = max(0, -(offset // stride))
    hi = min(out, (size - 1 - offset) // stride + 1)
    return lo, max(lo, hi)


def _slice_along(axis: int, sl: slice) -> tuple:
    return (slice(None),) * axis + (sl,)


def _window_taps(size, out, kernel, stride, pad_begin, dilation):
    """Per tap: (input offset, output slice, input slice) along one dim; taps that miss the
    input entirely are left out."""
    taps = []
    for t in range(kernel):
        offset = t * dilation - pad_begin
        lo, hi = _tap_range(size, out, stride, offset)
        if lo < hi:
            start = lo * stride + offset
            taps.append((offset, slice(lo, hi), slice(start, start + (hi - lo - 1) * stride + 1, stride)))
    return taps


MAX_DENSE_EDGES = 8  # beyond this many border outputs (each computed apart) dense does not pay
# Outer axes go dense (every row position, then a strided row copy) while the rows a strided
# ufunc call would skip are short: ``inner * (stride - 1)`` elements, measured on 2 cores.
DENSE_MAX_ROW = 56
LITTLE_ENDIAN = sys.byteorder == "little"


@dataclass(frozen=True)
class _AxisPlan:
    """How one spatial dim is reduced, computed once per (size, window) and reused by every
    block. ``interior``: the outputs ``[lo, hi)`` whose taps all hit the input; ``edges``: the
    other outputs, with the offsets of the taps that hit. ``flat``: ``size == out * stride``,
    so each tap is one strided call over the whole block. ``dense``: combine the taps at
    every flat position with contiguous calls, then copy the interior out with one strided
    copy (the innermost axis of any geometry; outer axes when strided rows would be short)."""

    size: int
    out: int
    stride: int
    taps: tuple
    flat: bool
    dense: bool
    interior: tuple
    edges: tuple


@functools.lru_cache(maxsize=512)
def _axis_plan(size, out, kernel, stride, pad_begin, dilation) -> _AxisPlan:
    taps = tuple(_window_taps(size, out, kernel, stride, pad_begin, dilation))
    offsets = [off for off, _, _ in taps]
    if len(taps) < 2:
        return _AxisPlan(size, out, stride, taps, False, False, (0, 0), ())
    lo = _tap_range(size, out, stride, min(offsets))[0]
    hi = max(lo, _tap_range(size, out, stride, max(offsets))[1])
    edges = tuple((o, tuple(off for off in offsets if 0 <= o * stride + off < size))
                  for o in (*range(lo), *range(hi, out)))
    flat = size == out * stride
    dense = lo < hi and len(edges) <= MAX_DENSE_EDGES and not (flat and stride == 1)
    return _AxisPlan(size, out, stride, taps, flat, dense, (lo, hi), edges)


def _reduce_axis(cur, axis, plan: _AxisPlan, combine, init, dtype, dest=None):
    """Combine the taps of one dim into ``dest`` (or scratch slot ``axis % 2``) whose ``axis``
    has ``plan.out`` entries."""
    out_len = plan.out
    shape = cur.shape[:axis] + (out_len,) + cur.shape[axis + 1:]
    res = _scratch(axis % 2, shape, dtype) if dest is None else dest
    rows = math.prod(cur.shape[:axis])
    if rows > 1 and cur.flags.c_contiguous:
        inner = math.prod(cur.shape[axis + 1:])
        if plan.dense and (inner == 1 or 0 < inner * (plan.stride - 1) <= DENSE_MAX_ROW):
            _reduce_axis_dense(cur, plan, combine, init, res, rows, inner)
            return res
        if plan.flat:
            _reduce_axis_flat(cur, plan, combine, init, res, rows, inner)
            return res
    # taps in window order, as every path combines them (float sums round alike): the
    # leading taps that reach every output start the result, else ``init`` does
    taps = plan.taps
    full = 0
    while full < min(2, len(taps)) and taps[full][1].stop - taps[full][1].start == out_len:
        full += 1
    if full == 2:
        combine(cur[_slice_along(axis, taps[0][2])], cur[_slice_along(axis, taps[1][2])], out=res)
    elif full == 1:
        np.copyto(res, cur[_slice_along(axis, taps[0][2])])
    else:
        res.fill(init)
    for _, dst, src in taps[full:]:
        view = res[_slice_along(axis, dst)]
        combine(view, cur[_slice_along(axis, src)], out=view)
    return res


def _reduce_axis_flat(cur, plan: _AxisPlan, combine, init, res, rows, inner):
    """``_reduce_axis`` when ``size == out * stride``: output row r, column o of every tap
    reads flat input row ``(r*out + o)*stride + offset``, so each tap is ONE ufunc call over
    the whole block instead of one per short row; the edge outputs are then recomputed."""
    size, out_len, stride = plan.size, plan.out, plan.stride
    src3 = cur.reshape(rows, size, inner)
    res3 = res.reshape(rows, out_len, inner)
    flat_in = src3.reshape(rows * size, inner)
    flat_out = res3.reshape(rows * out_len, inner)
    # outputs where some tap would leave the flat buffer are edge outputs: skip them
    offsets = [off for off, _, _ in plan.taps]
    lo = max(0, -(min(offsets) // stride))
    hi = min(rows * out_len, (rows * size - 1 - max(offsets)) // stride + 1)
    if lo < hi:
        src = [flat_in[lo * stride + off:(hi - 1) * stride + off + 1:stride] for off in offsets]
        dst = flat_out[lo:hi]
        combine(src[0], src[1], out=dst)
        for tap in src[2:]:
            combine(dst, tap, out=dst)
    _fill_edges(src3, res3, plan, combine, init)


def _reduce_axis_dense(cur, plan: _AxisPlan, combine, init, res, rows, inner):
    """Combine the taps at EVERY flat position ``j`` with contiguous (SIMD) ufunc calls,
    ``dense[j] = combine(x[j + offset*inner])``, then copy the interior outputs
    ``dense[(r*size + o*stride)*inner + c]`` out with one strided copy (NumPy's ufunc loops
    over strided or short rows are several times slower), then the edges. An interior
    output's taps lie in its row, so every ``j`` read lies in ``[max(0, -min offset),
    n - max offset)`` (offsets in elements)."""
    size, stride = plan.size, plan.stride
    flat_in = cur.reshape(-1)
    n = flat_in.size
    offsets = [off * inner for off, _, _ in plan.taps]
    lo, hi = max(0, -min(offsets)), n - max(offsets)
    buf = _scratch("dense", (max(n, hi) + 1,), res.dtype)  # + 1: see _copy_every
    span = buf[lo:hi]
    combine(flat_in[lo + offsets[0]:hi + offsets[0]], flat_in[lo + offsets[1]:hi + offsets[1]], out=span)
    for off in offsets[2:]:
        combine(span, flat_in[lo + off:hi + off], out=span)
    res3 = res.reshape(rows, plan.out, inner)
    if plan.flat:  # flat output row i = r*out + o reads dense row i*stride: edges overwritten after
        first = -(-lo // (stride * inner))
        last = min(rows * plan.out, (hi - inner) // (stride * inner) + 1)
        _copy_every(res3.reshape(1, -1, inner)[:, first:last], buf, first * stride, 0, stride)
    else:  # interior output o of row r reads buf[r*size + o*stride] (o*stride may pass size)
        o_lo, o_hi = plan.interior
        _copy_every(res3[:, o_lo:o_hi], buf, o_lo * stride, size * inner, stride)
    _fill_edges(cur.reshape(rows, size, inner), res3, plan, combine, init)


_HALF_PAIRS = {1: (np.uint16, np.uint8), 2: (np.uint32, np.uint16), 4: (np.uint64, np.uint32)}


def _copy_every(dst, buf, start: int, row_len: int, stride: int) -> None:
    """``dst[r, i, c] = buf[r*row_len + (start + i*stride)*inner + c]`` for ``dst`` of shape
    ``(rows, count, inner)`` and a 1D contiguous ``buf`` holding every element read plus
    one. Single elements taken every other one are read as the low halves of double-width
    integers: a contiguous narrowing cast, about twice as fast as NumPy's strided copy. The
    strided views are built on ``buf`` as a buffer, so NumPy checks they stay inside it."""
    rows, count, inner = dst.shape
    step = buf.itemsize
    if (stride == 2 and inner == 1 and step in _HALF_PAIRS and LITTLE_ENDIAN
            and (rows == 1 or row_len % 2 == 0)
            and start + (rows - 1) * row_len + 2 * count <= buf.size):
        wide, narrow = _HALF_PAIRS[step]
        pairs = np.ndarray((rows, count), wide, buffer=buf, offset=start * step,
                           strides=(row_len * step, 2 * step))
        np.copyto(dst[..., 0].view(narrow), pairs, casting="unsafe")
        return
    np.copyto(dst, np.ndarray((rows, count, inner), buf.dtype, buffer=buf,
                              offset=start * inner * step,
                              strides=(row_len * step, stride * inner * step, step)))


def _fill_edges(src3, res3, plan: _AxisPlan, combine, init):
    """Outputs where some tap misses the input, from the taps that hit (``init`` if none)."""
    stride = plan.stride
    for o, valid in plan.edges:
        col = res3[:, o]
        if not valid:
            col.fill(init)
            continue
        if len(valid) == 1:
            np.copyto(col, src3[:, o * stride + valid[0]])
        else:
            combine(src3[:, o * stride + valid[0]], src3[:, o * stride + valid[1]], out=col)
        for off in valid[2:]:
            combine(col, src3[:, o * stride + off], out=col)


def _valid_counts(spec: WindowSpec, include_pad: bool):
    """Divisor per output position, shape ``out_spatial``: product of per-dim tap counts."""
    counts = np.ones((), dtype=np.float64)
    for a, (size, out, k, s, (pb, pe), d) in enumerate(zip(
            spec.geom.spatial, spec.out_spatial, spec.kernel, spec.stride, spec.pads,
            spec.dilation)):
        pos = np.arange(out)[:, None] * s - pb + np.arange(k)[None, :] * d
        high = size + pe if include_pad else size
        low = -pb if include_pad else 0
        per_dim = ((pos >= low) & (pos < high)).sum(axis=1).astype(np.float64)
        counts = np.multiply.outer(counts, per_dim)
    return counts


@functools.lru_cache(maxsize=256)
def _avg_divisor(spec: WindowSpec):
    """``(divisor, empty)``: the divisor per output position in the working dtype,
    broadcastable against a canonical block (a scalar when every window has the same one),
    and the mask of the windows with no valid tap, which give +0 (None when there are none).
    Sums are divided, not multiplied by a reciprocal: the CUDA kernels' rounding."""
    valid = _valid_counts(spec, False)
    divisor = (np.full(spec.out_spatial, float(spec.divisor_override))
               if spec.divisor_override else _valid_counts(spec, spec.count_include_pad))
    divisor = np.where(valid > 0, divisor, 1.0).astype(_accumulator(np.dtype(spec.geom.dtype)))
    empty = None
    if not valid.all():
        empty = _expand(valid == 0, spec.geom)
        empty.flags.writeable = False
    if (divisor == divisor.flat[0]).all():
        return divisor.flat[0], empty
    divisor.flags.writeable = False
    return _expand(divisor, spec.geom), empty


# blocks up to this size whose windows hold up to DIRECT_TAPS taps in all reduce through one
# gather (:func:`_gather_reduce`)
DIRECT_BYTES, DIRECT_TAPS = 1 << 15, 1 << 16


def _direct(cur, nd: int, window_taps: int, outputs: int) -> bool:
    """Whether the block ``cur`` reduces through :func:`_gather_reduce`: it is small, and so
    is its gather (``window_taps`` taps per window, ``outputs`` windows per plane)."""
    return (cur.nbytes <= DIRECT_BYTES and cur.size // math.prod(cur.shape[1:nd + 1])
            * window_taps * outputs <= DIRECT_TAPS)


@functools.lru_cache(maxsize=256)
def _window_gather(spec: WindowSpec) -> tuple:
    """The :func:`_gather_plan` of a window op (built only for planes small enough for it)."""
    taps = []
    for size, out, k, s, (pb, _), d in zip(spec.geom.spatial, spec.out_spatial, spec.kernel,
                                           spec.stride, spec.pads, spec.dilation):
        pos = np.arange(k)[:, None] * d + (np.arange(out) * s - pb)[None, :]
        taps.append((pos, (pos >= 0) & (pos < size)))
    return _gather_plan(spec.geom.spatial, taps)


def _gather_plan(spatial, taps):
    """``(index, padded)`` for :func:`_gather_reduce`: ``index[k_nd, ..., k_1, q]`` is the flat
    plane position of tap ``k_a`` of each dim for output ``q`` (flat over the output plane),
    or the plane size (one past the plane, where a block gets the sentinel) when any of those
    taps misses the input; ``padded``: whether any does. ``taps``: per dim, the positions
    ``(taps, outputs)`` and their validity."""
    nd = len(spatial)
    plane_strides = [math.prod(spatial[a + 1:]) for a in range(nd)]
    kernel = [pos.shape[0] for pos, _ in taps]
    out = [pos.shape[1] for pos, _ in taps]
    flat, valid = np.zeros((), np.intp), np.ones((), bool)
    for a, (pos, ok) in enumerate(taps):
        shape = [1] * (2 * nd)
        shape[nd - 1 - a], shape[nd + a] = kernel[a], out[a]
        flat = flat + (pos * plane_strides[a]).reshape(shape)
        valid = valid & ok.reshape(shape)
    index = np.where(valid, flat, math.prod(spatial)).reshape(kernel[::-1] + [math.prod(out)])
    index.flags.writeable = False
    return index, not valid.all()


def _gather_reduce(cur, nd: int, gather, combine, sentinel, dest):
    """``_reduce_axis`` over every spatial dim of a small block at once: one gather of every
    tap of every window (a tap outside the input reads ``sentinel``, which leaves a sum or max
    unchanged: -0.0 for sums that may hold -0.0, +0 for Lp's terms, the lowest value for a
    max), then the taps of the first dim combined in tap order for every tap of the others,
    then those of the second dim, ...: the order and so the rounding of the separable path.
    ``dest`` (C-contiguous, shape ``(rows, *out_spatial, *tail)``) receives the result."""
    index, padded = gather
    rows, tail = cur.shape[0], cur.shape[nd + 1:]
    flat = cur.reshape((rows, -1) + tail)
    if padded:
        ext = np.empty((rows, flat.shape[1] + 1) + tail, cur.dtype)
        ext[:, :-1] = flat
        ext[:, -1] = sentinel
        flat = ext
    taps = flat.take(index, axis=1)  # (rows, k_nd, ..., k_1, outputs, *tail)
    for level in range(nd):
        axis = nd - level
        count = taps.shape[axis]
        first = taps[(slice(None),) * axis + (0,)]
        if level == nd - 1:
            res = dest.reshape(first.shape)
        elif count == 1:
            taps = first
            continue
        else:
            res = np.empty(first.shape, taps.dtype)
        if count == 1:
            np.copyto(res, first)
        else:
            combine(first, taps[(slice(None),) * axis + (1,)], out=res)
            for k in range(2, count):
                combine(res, taps[(slice(None),) * axis + (k,)], out=res)
        taps = res
    return dest


def _separable_window(xb, spec: WindowSpec, dtype, dest=None):
    """Values-only window reduction of a block, one spatial axis at a time; the last axis is
    written into ``dest`` when given, else into scratch (consume it before the next call)."""
    # sums start from their first tap (-0.0 + x is x), or from +0 for Lp's terms, which are
    # never negative, so that an empty window sums to +0
    combine, init = ((np.maximum, _lowest(dtype)) if spec.op == "max" else
                     (np.add, dtype.type(-0.0 if spec.op == "avg" else 0.0)))
    cur = _widened(xb, dtype)
    if spec.op == "lp":  # |x| ** p, never in place on the input
        powers = cur if cur is not xb else _scratch("input", xb.shape, dtype)
        np.abs(cur, out=powers)
        cur = powers
        if spec.p == 2.0:
            np.square(cur, out=cur)
        elif spec.p != 1.0:
            np.power(cur, dtype.type(spec.p), out=cur)
    nd = spec.geom.nd
    if _direct(cur, nd, math.prod(spec.kernel), math.prod(spec.out_spatial)):
        shape = cur.shape[:1] + spec.out_spatial + cur.shape[nd + 1:]
        return _gather_reduce(cur, nd, _window_gather(spec), combine, init,
                              _scratch(nd % 2, shape, dtype) if dest is None else dest)
    for a in range(nd):
        plan = _axis_plan(spec.geom.spatial[a], spec.out_spatial[a], spec.kernel[a],
                          spec.stride[a], spec.pads[a][0], spec.dilation[a])
        cur = _reduce_axis(cur, a + 1, plan, combine, init, dtype, dest if a == nd - 1 else None)
    return cur


def _expand(per_plane, geom):
    """Broadcast an ``out_spatial`` array against a canonical block."""
    return per_plane[..., None] if geom.layout == "NHWC" else per_plane


@dataclass(frozen=True)
class _ArgmaxPlan:
    """The window's valid taps for max with indices. ``taps``: per tap, in row-major window
    order, the output and input slices of each dim; ``offsets``: the tap's flat offset from
    its window's start, with one more entry (-1) for "no valid tap"; ``starts``: each
    output's flat window start ``sum(o*s - pb) * plane stride``, shaped ``out_spatial``;
    ``empty``: whether some window has no valid tap."""

    taps: tuple
    offsets: np.ndarray
    starts: np.ndarray
    empty: bool


@functools.lru_cache(maxsize=256)
def _argmax_plan(spec: WindowSpec) -> _ArgmaxPlan:
    geom = spec.geom
    plane_strides = [math.prod(geom.spatial[a + 1:]) for a in range(geom.nd)]
    per_dim = [_window_taps(size, out, k, s, pb, d) for size, out, k, s, (pb, _), d in zip(
        geom.spatial, spec.out_spatial, spec.kernel, spec.stride, spec.pads, spec.dilation)]
    taps, offsets = [], []
    for combo in itertools.product(*per_dim):
        taps.append(tuple((dst, src) for _, dst, src in combo))
        offsets.append(sum((off + spec.pads[a][0]) * plane_strides[a]
                           for a, (off, _, _) in enumerate(combo)))
    starts = np.zeros((), np.int64)
    for a in range(geom.nd):
        first = (np.arange(spec.out_spatial[a], dtype=np.int64) * spec.stride[a]
                 - spec.pads[a][0]) * plane_strides[a]
        starts = np.add.outer(starts, first)
    if geom.layout == "NHWC":
        starts = starts[..., None]
    starts.flags.writeable = False
    offsets = np.array(offsets + [-1], np.int64)
    offsets.flags.writeable = False
    empty = bool((_valid_counts(spec, False) == 0).any())
    return _ArgmaxPlan(tuple(taps), offsets, starts, empty)


def _argmax_taps(xb, plan: _ArgmaxPlan, maxima, indices):
    """Indices of the window maxima already computed in ``maxima``, PyTorch's rule
    (``v > m || isnan(v)`` scanning taps row-major from the first valid tap): the first tap
    equal to the max, or the last NaN tap where the max is NaN; -1 for an empty window.
    The tap number is found first, in a one-byte (or two-byte) array: taps scanned in reverse
    with unconditional overwrites, so the first match wins; then one gather turns tap numbers
    into flat offsets and one add puts the window starts on them."""
    count = len(plan.taps)
    tap_ids = _scratch("tap ids", maxima.shape, np.uint8 if count < 255 else np.int32)
    tap_ids.fill(count)  # "no valid tap": its offset entry is -1
    mask = _scratch("mask", maxima.shape, np.bool_)

    def views(t):
        dst = (slice(None),) + tuple(d for d, _ in plan.taps[t])
        src = (slice(None),) + tuple(s for _, s in plan.taps[t])
        return dst, xb[src]

    for t in reversed(range(count)):
        dst, v = views(t)
        m = np.equal(v, maxima[dst], out=mask[dst])
        np.copyto(tap_ids[dst], t, where=m, casting="unsafe")
    if maxima.dtype.kind == "f" and np.isnan(maxima).any():
        for t in range(count):
            dst, v = views(t)
            # NaN != NaN: np.isnan skips elements of a strided out= (float32/64, NumPy 2.4)
            m = np.not_equal(v, v, out=mask[dst])
            np.copyto(tap_ids[dst], t, where=m, casting="unsafe")
    np.take(plan.offsets, tap_ids, out=indices)
    if plan.empty:
        np.add(indices, plan.starts, out=indices, where=tap_ids != count)
    else:
        np.add(indices, plan.starts, out=indices)


KEYED_INDEX_DTYPES = frozenset(map(np.dtype, ("float16", "float32", "int8", "uint8", "int16",
                                              "int32")))
TOP_KEY = np.int64(0x7FFFFFFF)  # the key of every NaN: above +inf's
LOW_BITS = np.int64(0xFFFFFFFF)


def _order_keys(xb):
    """int32 keys in the order of the values (PyTorch's: -0 equals +0, NaN above all), in
    scratch: integers as they are; floats from their bits, negative ones with the magnitude
    bits flipped, -0 as +0 and every NaN as :data:`TOP_KEY`."""
    keys = _scratch("keys32", xb.shape, np.int32)
    if xb.dtype.kind in "iu":
        np.copyto(keys, xb)
        return keys
    if xb.dtype == np.float16:
        np.copyto(keys, _half_keys(xb))  # NaN already the top int16 key
        np.copyto(keys, TOP_KEY, where=keys == HALF_NAN_KEY)
    else:
        bits = xb.view(np.int32)
        np.right_shift(bits, 31, out=keys)
        np.bitwise_and(keys, 0x7FFFFFFF, out=keys)
        np.bitwise_xor(keys, bits, out=keys)
        if np.isnan(xb.max()):
            np.copyto(keys, TOP_KEY, where=np.isnan(xb))
    np.add(keys, keys == -1, out=keys, casting="unsafe")  # -0's key is -1, +0's is 0
    return keys


@functools.lru_cache(maxsize=64)
def _position_bits(spatial: tuple, nhwc: bool):
    """Per input position p of a plane: ``LOW_BITS - p`` (the first of tied values wins a max)
    and ``p`` (the last NaN wins), shaped to broadcast against a canonical block."""
    pos = np.arange(math.prod(spatial), dtype=np.int64).reshape(spatial + ((1,) if nhwc else ()))
    first = (LOW_BITS - pos).astype(np.uint32).view(np.int32)  # as a composite's low word
    pos = pos.astype(np.int32)
    for a in (first, pos):
        a.flags.writeable = False
    return first, pos


def _keyed_max_indices(xb, spec: WindowSpec, values, indices) -> None:
    """Max with indices as ONE separable max over int64 composites ``key << 32 | tie bits``:
    the first of tied taps in row-major window order is the one at the smallest input
    position, so the tie bits ``LOW_BITS - position`` (``position`` for NaN, whose last tap
    wins) make the max of the composites pick PyTorch's tap. The values are then gathered at
    the indices: the winning element itself, bit for bit."""
    geom = spec.geom
    nhwc = geom.layout == "NHWC"
    keys = _order_keys(xb)
    first, last = _position_bits(geom.spatial, nhwc)
    composite = _scratch("composite", xb.shape, np.int64)
    words = composite.view(np.int32)  # little-endian: the low word first
    words[..., 1::2] = keys
    words[..., 0::2] = first
    has_nan = xb.dtype.kind == "f" and keys.max() == TOP_KEY
    if has_nan:
        nan = np.equal(keys, TOP_KEY, out=_scratch("mask", xb.shape, np.bool_))
        np.copyto(words[..., 0::2], last, where=nan)
    best = _separable_window(composite, spec, np.dtype(np.int64))
    tie = np.bitwise_and(best, LOW_BITS, out=indices)
    if has_nan:
        from_first = np.right_shift(best, 32) != TOP_KEY
        np.subtract(LOW_BITS, tie, out=indices, where=from_first)
    else:
        np.subtract(LOW_BITS, tie, out=indices)
    empty = best == _lowest(np.dtype(np.int64))
    _take_winners(xb, geom, indices, values, empty if empty.any() else None)


def _take_winners(xb, geom, indices, values, empty) -> None:
    """``values`` = the elements of the block ``xb`` at the per-plane flat ``indices``: the
    winning element itself, bit for bit (signed zeros, NaN payloads). ``empty``: a mask of
    the windows with no valid tap (or None), which get index -1 and the dtype's lowest."""
    nhwc = geom.layout == "NHWC"
    plane = math.prod(geom.spatial)
    channels = geom.channels if nhwc else 1
    start = (np.arange(xb.shape[0], dtype=np.int64) * (plane * channels)).reshape(
        (-1,) + (1,) * (indices.ndim - 1))
    where = _scratch("gather", indices.shape, np.int64)
    if nhwc:
        np.multiply(indices, channels, out=where)
        np.add(where, start + np.arange(channels, dtype=np.int64), out=where)
    else:
        np.add(indices, start, out=where)
    # one 1-D take ("raise" would buffer); an empty window's position is clipped, then reset
    np.take(xb.reshape(-1), where, out=values, mode="clip")
    if empty is not None:
        indices[empty] = -1
        values[empty] = _lowest(values.dtype)


@functools.lru_cache(maxsize=256)
def _prepare_window(spec: WindowSpec):
    """The window op of ``spec`` as ``run(x, spec, out, indices)``, every decision that depends
    on the spec alone (the strategy, its plans, the divisor) made once."""
    geom = spec.geom
    dtype = np.dtype(geom.dtype)
    plane_bytes = dtype.itemsize * math.prod(geom.spatial) * geom.channels
    in_shape = (geom.batch,) + geom.shape[len(geom.lead):]
    out_shape = (geom.batch,) + spec.out_shape[len(geom.lead):]
    if (spec.return_indices and dtype in KEYED_INDEX_DTYPES and LITTLE_ENDIAN
            and math.prod(geom.spatial) < 2**31):
        def blocks(xc, oc, ic):
            def block(b0, b1):
                _keyed_max_indices(xc[b0:b1], spec, oc[b0:b1], ic[b0:b1])
            return block
    elif spec.return_indices:  # float64, int64: no room for tie bits beside their keys
        plan = _argmax_plan(spec)

        def blocks(xc, oc, ic):
            def block(b0, b1):
                maxima = _separable_window(xc[b0:b1], spec, _accumulator(dtype))
                _argmax_taps(xc[b0:b1], plan, maxima, ic[b0:b1])
                _take_winners(xc[b0:b1], geom, ic[b0:b1], oc[b0:b1],
                              ic[b0:b1] < 0 if plan.empty else None)
            return block
    elif spec.op == "max" and dtype == np.float16:
        def blocks(xc, oc, ic):
            def block(b0, b1):
                keys = _separable_window(_half_keys(xc[b0:b1]), spec, np.dtype(np.int16))
                _half_from_keys(keys, oc[b0:b1])
            return block
    else:
        acc = _accumulator(dtype)
        direct = dtype == acc
        divisor, empty = _avg_divisor(spec) if spec.op == "avg" else (None, None)
        inverse = acc.type(1.0 / spec.p) if spec.op == "lp" else None
        root = None if spec.op != "lp" or spec.p == 1.0 else (
            np.sqrt if spec.p == 2.0 else lambda res, out: np.power(res, inverse, out=out))

        def blocks(xc, oc, ic):
            def block(b0, b1):
                res = _separable_window(xc[b0:b1], spec, acc, oc[b0:b1] if direct else None)
                if divisor is not None:
                    np.divide(res, divisor, out=res)
                    if empty is not None:
                        np.copyto(res, 0, where=empty)
                elif root is not None:
                    root(res, out=res)
                if not direct:
                    oc[b0:b1] = res
            return block

    def run(x, _spec, out, indices) -> None:
        block = blocks(x.reshape(in_shape), out.reshape(out_shape),
                       None if indices is None else indices.reshape(out_shape))
        _in_blocks(block, geom.batch, plane_bytes)
    return run


@register("window", "numpy")
def window(x, spec: WindowSpec, out, indices) -> None:
    _prepare_window(spec)(x, spec, out, indices)


window.prepare = _prepare_window


@functools.lru_cache(maxsize=64)
def _mean_weights(plane: int, dtype, factor: float = 1.0) -> np.ndarray:
    """``1 / plane`` (divided by ``factor``, a power of two) for each value of a plane."""
    weights = np.full(plane, dtype.type(1.0 / plane) / dtype.type(factor), dtype=dtype)
    weights.flags.writeable = False
    return weights


SHORT_PLANE = 256  # up to this many values a sequential float sum loses less than 1e-5
BLAS_MIN_ELEMENTS = 1 << 16  # from here BLAS's mat-vec beats einsum by more than its set-up


def _global_mean_blas(xc, oc, weights, nhwc: bool) -> None:
    """Global average of short float32/64 planes as one BLAS mat-vec (2.5x faster than
    ``einsum`` on 7x7 planes), in the calling thread on gpupool's thread count
    (:func:`threads.blas_threads`)."""
    channels = oc.shape[-1:] if nhwc else ()
    flat = xc.reshape((xc.shape[0], len(weights)) + channels)
    with threads.blas_threads():
        np.matmul(*((weights, flat) if nhwc else (flat, weights)),
                  out=oc.reshape((xc.shape[0],) + channels))


def _plane_means(flat, weights, nhwc: bool, target, owned: bool) -> None:
    """``target[i(, c)] = sum_j flat[i, j(, c)] * weights[j]``: ``einsum``'s SIMD loops for short
    planes; for longer ones the scaled values are summed pairwise (NumPy's ``add.reduce``
    along contiguous rows, or halves folded onto halves across NHWC rows), so the rounding
    error grows with log(plane), not plane. ``owned``: ``flat`` is scratch and may be
    overwritten."""
    plane = flat.shape[1]
    if plane <= SHORT_PLANE:
        np.einsum("j,ijk->ik" if nhwc else "ij,j->i", *((weights, flat) if nhwc else
                                                        (flat, weights)), out=target)
        return
    scaled = flat if owned else _scratch("scaled", flat.shape, flat.dtype)
    np.multiply(flat, weights[0], out=scaled)
    if not nhwc:
        np.add.reduce(scaled, axis=1, out=target)
        return
    while plane > 1:
        half = plane // 2
        np.add(scaled[:, :half], scaled[:, plane - half:plane], out=scaled[:, :half])
        plane -= half
    np.copyto(target, scaled[:, 0])


HALF_NAN_KEY, HALF_NEG_INF_KEY = np.int16(0x7FFF), np.int16(-0x7C01)


def _half_keys(xb):
    """float16 values as int16 keys in the same order (NumPy has no fast float16 loops; the
    keys cost a quarter of a float32 conversion and int16 maxima are exact): non-negative bit
    patterns as they are, negative ones with the magnitude bits flipped (``key = a ^ (bits >>
    15)``, ``a = bits & 0x7FFF``), every NaN as the top key so it propagates."""
    bits = xb.view(np.int16)
    keys, sign = _scratch("input", xb.shape, np.int16), _scratch("keys", xb.shape, np.int16)
    np.bitwise_and(bits, 0x7FFF, out=keys)
    nan = np.greater(keys, 0x7C00, out=_scratch("mask", xb.shape, np.bool_))
    np.right_shift(bits, 15, out=sign)
    np.bitwise_xor(keys, sign, out=keys)
    np.copyto(keys, HALF_NAN_KEY, where=nan)
    return keys


def _half_from_keys(keys, dest) -> None:
    """Inverse of :func:`_half_keys` into the float16 ``dest``; keys below that of -inf (the
    empty-window fill) become -inf."""
    np.maximum(keys, HALF_NEG_INF_KEY, out=keys)
    sign = _scratch("keys", keys.shape, np.int16)
    np.right_shift(keys, 15, out=sign)
    np.bitwise_and(sign, 0x7FFF, out=sign)
    np.bitwise_xor(keys, sign, out=dest.view(np.int16))


def _adaptive_taps(size: int, out: int):
    """Per tap t: (clipped input positions, valid mask or None when every output has tap t)."""
    bounds = np.array([adaptive_window(i, size, out) for i in range(out)], dtype=np.int64)
    start, end = bounds[:, 0], bounds[:, 1]
    taps = []
    for t in range(int((end - start).max())):
        pos = start + t
        valid = pos < end
        taps.append((np.minimum(pos, end - 1), None if valid.all() else valid))
    return taps, (end - start)


def _shape_mask(mask, ndim, axis):
    shape = [1] * ndim
    shape[axis] = mask.size
    return mask.reshape(shape)


@register("adaptive", "numpy")
def adaptive(x, spec: AdaptiveSpec, out, indices) -> None:
    if spec.uniform_window is not None and not spec.is_global:
        window(x, spec.uniform_window, out, indices)  # the faster separable tap loops
        return
    geom = spec.geom
    xc, oc = _canonical(x, geom), _canonical(out, geom)
    spatial_axes = tuple(range(1, geom.nd + 1))
    plane_bytes = x.itemsize * math.prod(geom.spatial) * geom.channels
    if spec.is_global and indices is None:
        nd, plane = geom.nd, math.prod(geom.spatial)
        acc = _accumulator(x.dtype)
        weights = _mean_weights(plane, acc) if spec.op == "avg" else None
        nhwc = geom.layout == "NHWC"
        if (spec.op == "avg" and plane <= SHORT_PLANE and x.size >= BLAS_MIN_ELEMENTS
                and x.dtype == acc):
            _global_mean_blas(xc, oc, weights, nhwc)
            return

        def block(b0, b1):
            xb = xc[b0:b1]
            if spec.op == "max":
                oc[b0:b1] = np.max(xb, axis=spatial_axes, keepdims=True)
                return
            values, factor = (_half_as_float32(xb) if xb.dtype != acc else (xb, 1.0))
            flat = values.reshape((b1 - b0, plane) + oc.shape[nd + 1:])
            target = oc[b0:b1].reshape((b1 - b0,) + oc.shape[nd + 1:])
            direct = target.dtype == acc
            means = target if direct else _scratch("result", target.shape, acc)
            # unscaled halves times weights scaled by 2**112: the same products, exactly
            _plane_means(flat, weights if factor == 1 else _mean_weights(plane, acc, factor),
                         nhwc, means, owned=xb.dtype != acc)
            if not direct:
                np.copyto(target, means)
        _in_blocks(block, geom.batch, plane_bytes)
        return
    per_dim, counts = _adaptive_plans(spec)
    if indices is not None:
        ic = _canonical(indices, geom)

        def block(b0, b1):
            _adaptive_max_indices(xc[b0:b1], geom, per_dim, oc[b0:b1], ic[b0:b1])
        _in_blocks(block, geom.batch, plane_bytes)
        return
    acc = _accumulator(x.dtype)
    # a tap beyond a window adds -0.0 (no change: the sum of its taps in order, as the
    # window ops and the CUDA kernels sum) or the lowest value (no change to a max)
    fill = np.asarray(_lowest(acc) if spec.op == "max" else -0.0, dtype=acc)

    def block(b0, b1):
        cur = _widened(xc[b0:b1], acc)
        if _direct(cur, geom.nd, math.prod(len(taps) for taps, _ in per_dim),
                   math.prod(spec.out_spatial)):
            cur = _gather_reduce(cur, geom.nd, _adaptive_gather(spec),
                                 np.maximum if spec.op == "max" else np.add, fill,
                                 np.empty((b1 - b0,) + oc.shape[1:], acc))
        else:
            cur = _adaptive_taps_reduce(cur, per_dim, spec.op, fill)
        if spec.op == "avg":
            np.divide(cur, counts, out=cur)
        oc[b0:b1] = cur
    _in_blocks(block, geom.batch, plane_bytes)


def _adaptive_taps_reduce(cur, per_dim, op: str, fill):
    """Adaptive max or sum of a block, one dim at a time, the taps of each in order."""
    for a, (taps, _) in enumerate(per_dim):
        axis = a + 1
        res = None
        for pos, valid in taps:
            v = np.take(cur, pos, axis=axis)
            if valid is not None:
                v = np.where(_shape_mask(valid, v.ndim, axis), v, fill)
            if res is None:
                res = np.array(v, dtype=fill.dtype, copy=True)
            elif op == "max":
                np.maximum(res, v, out=res)
            else:
                res += v
        cur = res
    return cur


@functools.lru_cache(maxsize=256)
def _adaptive_plans(spec: AdaptiveSpec) -> tuple:
    """Per dim :func:`_adaptive_taps`, and the divisor of each output (avg; else None)."""
    geom = spec.geom
    per_dim = [_adaptive_taps(i, o) for i, o in zip(geom.spatial, spec.out_spatial)]
    counts = None
    if spec.op == "avg":
        counts = np.ones(())
        for _, lengths in per_dim:
            counts = np.multiply.outer(counts, lengths.astype(np.float64))
        counts = _expand(counts.astype(_accumulator(np.dtype(geom.dtype))), geom)
        counts.flags.writeable = False
    return per_dim, counts


@functools.lru_cache(maxsize=256)
def _adaptive_gather(spec: AdaptiveSpec) -> tuple:
    """The :func:`_gather_plan` of adaptive windows (built only for small planes)."""
    taps = []
    for size, out in zip(spec.geom.spatial, spec.out_spatial):
        bounds = np.array([adaptive_window(i, size, out) for i in range(out)], np.intp)
        pos = bounds[None, :, 0] + np.arange(int((bounds[:, 1] - bounds[:, 0]).max()))[:, None]
        taps.append((pos, pos < bounds[None, :, 1]))
    return _gather_plan(spec.geom.spatial, taps)


def _adaptive_max_indices(xb, geom, per_dim, values, indices):
    """Adaptive max with indices: every tap combination, masked where outside the window."""
    nd = geom.nd
    plane_strides = [math.prod(geom.spatial[a + 1:]) for a in range(nd)]
    nhwc = geom.layout == "NHWC"
    values[...] = _lowest(values.dtype)
    indices[...] = -1
    is_float = values.dtype.kind == "f"
    for combo in np.ndindex(*[len(taps) for taps, _ in per_dim]):
        grids = []
        valid = np.ones((), dtype=bool)
        pos = np.zeros((), dtype=np.int64)
        for a, t in enumerate(combo):
            p, ok = per_dim[a][0][t]
            grids.append(p)
            valid = np.logical_and.outer(valid, np.ones(p.size, bool) if ok is None else ok)
            pos = np.add.outer(pos, p * plane_strides[a])
        index = (slice(None),) + np.ix_(*grids)
        v = xb[index]
        if nhwc:
            valid, pos = valid[..., None], pos[..., None]
        take = ((v > values) | (indices < 0)) & valid
        if is_float:
            take |= np.isnan(v) & valid
        np.copyto(values, v, where=take)
        np.copyto(indices, np.broadcast_to(pos, indices.shape), where=take)


@register("unpool", "numpy")
def unpool(x, spec: UnpoolSpec, out, indices) -> None:
    geom = spec.geom
    tail = (geom.channels,) if geom.layout == "NHWC" else ()
    src = x.reshape((geom.batch, -1) + tail)
    idx = indices.reshape((geom.batch, -1) + tail)
    dst = out.reshape((geom.batch, spec.plane_size) + tail)
    dst[...] = 0
    idx = idx.astype(np.intp, copy=False)
    written = idx >= 0  # -1, a window with no valid tap, writes nothing
    if written.all():
        np.put_along_axis(dst, idx, src, axis=1)
    else:
        where = np.nonzero(written)
        dst[where[:1] + (idx[where],) + where[2:]] = src[where]
