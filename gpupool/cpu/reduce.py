"""Separable window reductions of canonical blocks on the CPU, the NumPy backend's engine.

A canonical block is ``(B, *spatial)`` (NCHW) or ``(B, *spatial, C)`` (NHWC), so spatial axes
are always ``1..nd``. Python loops run over window taps only, never over output elements: a
max or sum reduces one spatial axis at a time (:func:`separable_window`), each tap one ufunc
call over the outputs it reaches inside the input, so no padded copy is made. A small block
instead gathers every tap of every window at once and combines them in the same order
(:func:`gather_reduce`): fewer NumPy calls, the same bits. Blocks of planes sized to stay in
cache run on the thread pool of :mod:`gpupool.cpu.threads` (:func:`in_blocks`); temporaries
come from per-thread buffers (:func:`scratch`).
"""
from __future__ import annotations

import functools
import math
import sys
import threading
from dataclasses import dataclass

import numpy as np

from . import threads
from .memo import array_memo
from ..spec import WindowSpec
from ..windows import lowest


BLOCK_BYTES = 1 << 21  # input bytes per work item (best measured on 2 cores); 2+ blocks: threads
SCRATCH_BYTES = 1 << 22  # temporaries up to this size reuse a per-thread buffer
_workspace = threading.local()


def canonical(a, geom):
    """Reshape to ``(B, *spatial)`` or ``(B, *spatial, C)``; a view whenever possible."""
    return a.reshape((geom.batch,) + a.shape[len(geom.lead):])


def in_blocks(func, n_items: int, item_bytes: int, arithmetic: bool = True) -> None:
    """Call ``func(start, stop)`` over ``[0, n_items)`` in cache-sized blocks, on the thread
    pool of :mod:`gpupool.cpu.threads`. With ``arithmetic`` (sums, divisions, powers),
    floating-point warnings are silenced: inf - inf gives NaN, as on the GPU; maxima and
    integer work raise none and skip the (microseconds of) ``np.errstate``."""
    if arithmetic:
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


def scratch(slot, shape, dtype) -> np.ndarray:
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


def widened(xb, dtype):
    """``xb`` itself when already ``dtype``, else a copy widened to ``dtype`` in this thread's
    scratch (float16 -> float32 by :func:`half_as_float32`, then scaled)."""
    if xb.dtype == dtype:
        return xb
    if not (xb.dtype == np.float16 and dtype == np.float32):
        cur = scratch("input", xb.shape, dtype)
        np.copyto(cur, xb)
        return cur
    cur, factor = half_as_float32(xb)
    if factor != 1:
        np.multiply(cur, np.float32(1 / factor), out=cur)
    return cur


UNSCALED_HALF = 2.0 ** -112  # a half's bits moved into float32 fields: value * 2**-112
SMALLEST_SUBNORMAL = np.float32(2.0 ** -149)


def _reads_subnormals_as_zero() -> bool:
    """Whether this thread's floating-point unit reads float32 subnormals as zero
    (denormals-are-zero, which ``torch.set_flush_denormal(True)`` sets on x86; the mode is
    per thread): the smallest subnormal times 2**24, a normal, then comes out 0."""
    return SMALLEST_SUBNORMAL * np.float32(2.0 ** 24) == 0


def half_as_float32(xb):
    """``(cur, factor)``: float32 scratch holding the float16 ``xb`` times ``factor``, exactly,
    through integer passes (several times faster than NumPy's cast): the half's bits,
    sign-extended to int32 and shifted left by 13, hold exponent and mantissa in the float32
    fields and the sign in bits 31..28; clearing bits 30..28 leaves a float32 equal to the
    value times 2**-112 (the bias difference), for normals and subnormals alike. Where the
    block holds an inf or NaN (two int16 maxima tell), those get the all-ones exponent and
    the block is scaled to the values themselves (``factor`` 1). A subnormal half becomes a
    float32 subnormal there, so a thread that reads those as zero
    (:func:`_reads_subnormals_as_zero`) takes NumPy's cast (exact, ``factor`` 1) instead."""
    cur = scratch("input", xb.shape, np.float32)
    if _reads_subnormals_as_zero():
        np.copyto(cur, xb)
        return cur, 1.0
    half, bits = xb.view(np.int16), cur.view(np.int32)
    np.copyto(bits, half)
    np.left_shift(bits, 13, out=bits)
    np.bitwise_and(bits, np.int32(-0x70000001), out=bits)  # 0x8FFFFFFF
    # inf/NaN: bit patterns 0x7C00..0x7FFF (positive) and 0xFC00..0xFFFF (negative)
    if half.size and (half.max() >= 0x7C00 or half.view(np.uint16).max() >= 0xFC00):
        magnitude = np.bitwise_and(half, 0x7FFF, out=scratch("keys", xb.shape, np.int16))
        special = np.greater_equal(magnitude, 0x7C00, out=scratch("mask", xb.shape, np.bool_))
        np.bitwise_or(bits, 0x70000000, out=bits, where=special)
        np.multiply(cur, np.float32(2.0 ** 112), out=cur)
        return cur, 1.0
    return cur, UNSCALED_HALF


def _tap_range(size: int, out: int, stride: int, offset: int) -> tuple[int, int]:
    """Outputs ``o`` in [lo, hi) whose tap ``o*stride + offset`` lies in [0, size)."""
    lo = max(0, -(offset // stride))
    hi = min(out, (size - 1 - offset) // stride + 1)
    return lo, max(lo, hi)


def _slice_along(axis: int, sl: slice) -> tuple:
    return (slice(None),) * axis + (sl,)


def window_taps(size, out, kernel, stride, pad_begin, dilation):
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
    taps = tuple(window_taps(size, out, kernel, stride, pad_begin, dilation))
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
    res = scratch(axis % 2, shape, dtype) if dest is None else dest
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
    buf = scratch("dense", (max(n, hi) + 1,), res.dtype)  # + 1: see _copy_every
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


DIRECT_BYTES, DIRECT_TAPS = 1 << 15, 1 << 16


def fits_one_gather(cur, nd: int, taps: int, outputs: int) -> bool:
    """Whether the block ``cur`` reduces through :func:`gather_reduce`: it is small, and so
    is its gather (``taps`` taps per window, ``outputs`` windows per plane)."""
    return (cur.nbytes <= DIRECT_BYTES and cur.size // math.prod(cur.shape[1:nd + 1])
            * taps * outputs <= DIRECT_TAPS)


@array_memo(256)
def _window_gather(spec: WindowSpec) -> tuple:
    """The :func:`gather_plan` of a window op (built only for planes small enough for it)."""
    taps = []
    for size, out, k, s, (pb, _), d in zip(spec.geom.spatial, spec.out_spatial, spec.kernel,
                                           spec.stride, spec.pads, spec.dilation):
        pos = np.arange(k)[:, None] * d + (np.arange(out) * s - pb)[None, :]
        taps.append((pos, (pos >= 0) & (pos < size)))
    return gather_plan(spec.geom.spatial, taps)


def gather_plan(spatial, taps):
    """``(index, padded)`` for :func:`gather_reduce`: ``index[k_nd, ..., k_1, q]`` is the flat
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


def gather_reduce(cur, nd: int, gather, combine, sentinel, dest):
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


@functools.lru_cache(maxsize=256)
def tap_views(spec: WindowSpec, in_shape: tuple) -> tuple:
    """For :func:`reduce_taps` on a canonical block of ``in_shape``: per spatial dim, the shape
    of its result and per tap that hits the input, in window order, ``(dst, src)``: the index
    of the outputs it reaches (None: all of them) and of its input positions."""
    shape = list(in_shape)
    per_axis = []
    for a, (size, out, k, s, (pb, _), d) in enumerate(zip(
            spec.geom.spatial, spec.out_spatial, spec.kernel, spec.stride, spec.pads,
            spec.dilation)):
        shape[a + 1] = out
        taps = tuple((None if dst.stop - dst.start == out else _slice_along(a + 1, dst),
                      _slice_along(a + 1, src))
                     for _, dst, src in window_taps(size, out, k, s, pb, d))
        per_axis.append((tuple(shape), taps))
    return tuple(per_axis)


def reduce_taps(cur, views: tuple, combine, init, dest):
    """:func:`separable_window` of a small block into ``dest`` with nothing else around it
    (no scratch, blocks or threads): per spatial dim, first dim first, the taps of
    :func:`tap_views` combined in window order, started as :func:`_reduce_axis` starts them,
    so the same bits."""
    last = len(views) - 1
    for a, (shape, taps) in enumerate(views):
        res = dest if a == last else np.empty(shape, cur.dtype)
        full = 0
        while full < min(2, len(taps)) and taps[full][0] is None:
            full += 1
        if full == 2:
            combine(cur[taps[0][1]], cur[taps[1][1]], out=res)
        elif full == 1:
            np.copyto(res, cur[taps[0][1]])
        else:
            res.fill(init)
        for dst, src in taps[full:]:
            view = res if dst is None else res[dst]
            combine(view, cur[src], out=view)
        cur = res
    return dest


def separable_window(xb, spec: WindowSpec, dtype, dest=None):
    """Values-only window reduction of a block, one spatial axis at a time; the last axis is
    written into ``dest`` when given, else into scratch (consume it before the next call)."""
    # sums start from their first tap (-0.0 + x is x), or from +0 for Lp's terms, which are
    # never negative, so that an empty window sums to +0
    combine, init = ((np.maximum, lowest(dtype)) if spec.op == "max" else
                     (np.add, dtype.type(-0.0 if spec.op == "avg" else 0.0)))
    cur = widened(xb, dtype)
    if spec.op == "lp":  # |x| ** p, never in place on the input
        powers = cur if cur is not xb else scratch("input", xb.shape, dtype)
        np.abs(cur, out=powers)
        cur = powers
        if spec.p == 2.0:
            np.square(cur, out=cur)
        elif spec.p != 1.0:
            np.power(cur, dtype.type(spec.p), out=cur)
    nd = spec.geom.nd
    if fits_one_gather(cur, nd, math.prod(spec.kernel), math.prod(spec.out_spatial)):
        shape = cur.shape[:1] + spec.out_spatial + cur.shape[nd + 1:]
        return gather_reduce(cur, nd, _window_gather(spec), combine, init,
                              scratch(nd % 2, shape, dtype) if dest is None else dest)
    for a in range(nd):
        plan = _axis_plan(spec.geom.spatial[a], spec.out_spatial[a], spec.kernel[a],
                          spec.stride[a], spec.pads[a][0], spec.dilation[a])
        cur = _reduce_axis(cur, a + 1, plan, combine, init, dtype, dest if a == nd - 1 else None)
    return cur


def expand(per_plane, geom):
    """Broadcast an ``out_spatial`` array against a canonical block."""
    return per_plane[..., None] if geom.layout == "NHWC" else per_plane
