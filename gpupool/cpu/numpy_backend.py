"""NumPy backend of the float ops: vectorised pooling on the CPU (the entry points ``window``,
``adaptive`` and ``unpool`` of :class:`gpupool.cpu.entry_points.NumpyBackend`).

* ``window`` (max, avg, Lp): every decision that depends on the spec alone is made once per
  spec (:func:`prepare_window`); values-only ops reduce separably (:mod:`gpupool.cpu.reduce`),
  max with indices ranks order-preserving integer keys that carry the tap position or, for
  8-byte dtypes, finds the first tap equal to the max.
* ``adaptive``: uniform windows go to ``window``; global averages are a mat-vec with the
  plane's weights; other adaptive windows run the shared tap loops of :mod:`gpupool.windows`.
* ``unpool``: a scatter into zeros.

Nothing on the thread pool calls BLAS: the global average's mat-vec runs in the calling thread
(:func:`threads.blas_threads`).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from . import bfloat16, float16, threads
from .memo import array_memo
from .reduce import (DIRECT_BYTES, LITTLE_ENDIAN, canonical, expand, fits_one_gather,
                     gather_plan, gather_reduce, half_as_float32, in_blocks, reduce_taps,
                     scratch, separable_window, tap_views, widened, window_taps)
from ..spec import AdaptiveSpec, UnpoolSpec, WindowSpec
from ..windows import (accumulator, adaptive_argmax, adaptive_bounds, adaptive_counts,
                       adaptive_reduce, adaptive_taps, lowest, window_counts,
                       window_counts_per_dim)


@array_memo(256)
def _avg_divisor(spec: WindowSpec):
    """``(divisor, empty)``: the divisor per output position in the working dtype,
    broadcastable against a canonical block (a scalar when every window has the same one),
    and the mask of the windows with no valid tap, which give +0 (None when there are none).
    Sums are divided, not multiplied by a reciprocal: the CUDA kernels' rounding. Built from
    the per-dim counts: a full array only where windows differ."""
    acc = accumulator(np.dtype(spec.geom.dtype))
    valid = window_counts_per_dim(spec, False)
    empty = None
    if any((v == 0).any() for v in valid):
        empty = np.zeros((), bool)
        for v in valid:
            empty = np.logical_or.outer(empty, v == 0)
        empty = expand(empty, spec.geom)
        empty.flags.writeable = False
    if spec.divisor_override:
        return acc.type(spec.divisor_override), empty
    # 1 along a dim where a window has no valid tap: its output is +0, whatever it divides by
    counts = [np.where(v > 0, c, 1) for v, c in zip(valid, window_counts_per_dim(
        spec, spec.count_include_pad))]
    if all((c == c[0]).all() for c in counts):
        return acc.type(math.prod(int(c[0]) for c in counts)), empty
    # the products exact, then rounded once to acc: in acc itself where they are integers
    # it holds exactly (all but windows of more than 2**24 taps in float32)
    exact = math.prod(int(c.max()) for c in counts) <= 2 ** (np.finfo(acc).nmant + 1)
    divisor = np.ones((), acc if exact else np.float64)
    for c in counts:
        divisor = np.multiply.outer(divisor, c.astype(divisor.dtype))
    divisor = divisor.astype(acc, copy=False)
    divisor.flags.writeable = False
    return expand(divisor, spec.geom), empty


# blocks up to this size whose windows hold up to DIRECT_TAPS taps in all reduce through one
# gather (:func:`gather_reduce`)


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


@array_memo(256)
def _argmax_plan(spec: WindowSpec) -> _ArgmaxPlan:
    geom = spec.geom
    plane_strides = [math.prod(geom.spatial[a + 1:]) for a in range(geom.nd)]
    per_dim = [window_taps(size, out, k, s, pb, d) for size, out, k, s, (pb, _), d in zip(
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
    empty = bool((window_counts(spec, False) == 0).any())
    return _ArgmaxPlan(tuple(taps), offsets, starts, empty)


def _argmax_taps(xb, plan: _ArgmaxPlan, maxima, indices):
    """Indices of the window maxima already computed in ``maxima``, PyTorch's rule
    (``v > m || isnan(v)`` scanning taps row-major from the first valid tap): the first tap
    equal to the max, or the last NaN tap where the max is NaN; -1 for an empty window.
    The tap number is found first, in a one-byte (or two-byte) array: taps scanned in reverse
    with unconditional overwrites, so the first match wins; then one gather turns tap numbers
    into flat offsets and one add puts the window starts on them."""
    count = len(plan.taps)
    tap_ids = scratch("tap ids", maxima.shape, np.uint8 if count < 255 else np.int32)
    tap_ids.fill(count)  # "no valid tap": its offset entry is -1
    mask = scratch("mask", maxima.shape, np.bool_)

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
    keys = scratch("keys32", xb.shape, np.int32)
    if xb.dtype.kind in "iu":
        np.copyto(keys, xb)
        return keys
    if xb.dtype == np.float16:
        np.copyto(keys, float16.keys(xb))  # NaN already the top int16 key
        np.copyto(keys, TOP_KEY, where=keys == float16.NAN_KEY)
    else:
        bits = xb.view(np.int32)
        np.right_shift(bits, 31, out=keys)
        np.bitwise_and(keys, 0x7FFFFFFF, out=keys)
        np.bitwise_xor(keys, bits, out=keys)
        if np.isnan(xb.max()):
            np.copyto(keys, TOP_KEY, where=np.isnan(xb))
    np.add(keys, keys == -1, out=keys, casting="unsafe")  # -0's key is -1, +0's is 0
    return keys


@array_memo(64)
def _plane_positions(spatial: tuple, nhwc: bool):
    """The input positions ``p`` of a plane (below 2**31) as ``(row_start, column)``, int32
    arrays whose sum is ``p`` and which broadcast against a canonical block: one start per
    row along the last spatial dim, and that dim's positions (no array of the plane's size)."""
    *rows, width = spatial
    tail = (1,) if nhwc else ()
    row_start = (np.arange(math.prod(rows), dtype=np.int32) * np.int32(width)).reshape(
        tuple(rows) + (1,) + tail)
    column = np.arange(width, dtype=np.int32).reshape((width,) + tail)
    for a in (row_start, column):
        a.flags.writeable = False
    return row_start, column


def _keyed_max_indices(xb, spec: WindowSpec, values, indices) -> None:
    """Max with indices as ONE separable max over int64 composites ``key << 32 | tie bits``:
    the first of tied taps in row-major window order is the one at the smallest input
    position, so the tie bits ``LOW_BITS - position`` (``position`` for NaN, whose last tap
    wins) make the max of the composites pick PyTorch's tap. The values are then gathered at
    the indices: the winning element itself, bit for bit."""
    geom = spec.geom
    keys = _order_keys(xb)
    row_start, column = _plane_positions(geom.spatial, geom.layout == "NHWC")
    composite = scratch("composite", xb.shape, np.int64)
    words = composite.view(np.int32)  # little-endian: the low word first
    words[..., 1::2] = keys
    # LOW_BITS - p as an int32 word is -1 - p
    np.subtract(np.invert(row_start), column, out=words[..., 0::2])
    has_nan = xb.dtype.kind == "f" and keys.max() == TOP_KEY
    if has_nan:
        nan = np.equal(keys, TOP_KEY, out=scratch("mask", xb.shape, np.bool_))
        np.add(row_start, column, out=words[..., 0::2], where=nan)
    best = separable_window(composite, spec, np.dtype(np.int64))
    tie = np.bitwise_and(best, LOW_BITS, out=indices)
    if has_nan:
        from_first = np.right_shift(best, 32) != TOP_KEY
        np.subtract(LOW_BITS, tie, out=indices, where=from_first)
    else:
        np.subtract(LOW_BITS, tie, out=indices)
    empty = best == lowest(np.dtype(np.int64))
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
    where = scratch("gather", indices.shape, np.int64)
    if nhwc:
        np.multiply(indices, channels, out=where)
        np.add(where, start + np.arange(channels, dtype=np.int64), out=where)
    else:
        np.add(indices, start, out=where)
    # one 1-D take ("raise" would buffer); an empty window's position is clipped, then reset
    np.take(xb.reshape(-1), where, out=values, mode="clip")
    if empty is not None:
        indices[empty] = -1
        values[empty] = lowest(values.dtype)


@functools.lru_cache(maxsize=256)
def prepare_window(spec: WindowSpec):
    """The window op of ``spec`` as ``run(x, spec, out, indices)`` (:func:`_prepared_window`);
    a float16 result's NaNs as :func:`.float16.canonical_nans` makes them."""
    run = _prepared_window(spec)
    if np.dtype(spec.geom.dtype) != np.float16 or (spec.op == "max" and not spec.return_indices):
        return run  # (a float16 max of int16 keys gives every NaN as 0x7FFF itself)

    def run_half(x, _spec, out, indices) -> None:
        run(x, _spec, out, indices)
        float16.canonical_nans(out)
    return run_half


def _prepared_window(spec: WindowSpec):
    """The window op of ``spec`` as ``run(x, spec, out, indices)``, every decision that depends
    on the spec alone (the strategy, its plans, the divisor) made once. The strategies:

    * max with indices, dtypes of up to 4 bytes: a separable max of integer keys that carry
      the value's order and the tap's position (:func:`_keyed_max_indices`);
    * max with indices, 8-byte dtypes: the separable max, then the first tap equal to it
      (:func:`_argmax_taps`) and the values gathered at the indices;
    * float16 max: a separable max of order-preserving int16 keys (:func:`.float16.keys`);
    * otherwise a separable max or sum in the working dtype, then the divisor or the root;
    * bfloat16: the float32 op, rounded once (:mod:`gpupool.cpu.bfloat16`)."""
    if bfloat16.is_bfloat16(spec.geom.dtype):
        return bfloat16.through_float32(_prepared_window(bfloat16.as_float32(spec)))
    geom = spec.geom
    dtype = np.dtype(geom.dtype)
    plane_bytes = dtype.itemsize * math.prod(geom.spatial) * geom.channels
    in_shape = (geom.batch,) + geom.shape[len(geom.lead):]
    out_shape = (geom.batch,) + spec.out_shape[len(geom.lead):]
    arithmetic = spec.op != "max"
    # the small paths keep their plans in the closure: only where input and output are small
    small = max(math.prod(geom.shape), math.prod(spec.out_shape)) * dtype.itemsize <= DIRECT_BYTES
    if spec.return_indices and small and _windows_inside(spec):
        return _small_argmax_run(spec, in_shape, out_shape)
    # the other paths look their arrays up per call (memos bounded in bytes), holding none
    if (spec.return_indices and dtype in KEYED_INDEX_DTYPES and LITTLE_ENDIAN
            and math.prod(geom.spatial) < 2**31):
        def blocks(xc, oc, ic):
            def block(b0, b1):
                _keyed_max_indices(xc[b0:b1], spec, oc[b0:b1], ic[b0:b1])
            return block
    elif spec.return_indices:  # float64, int64: no room for tie bits beside their keys
        def blocks(xc, oc, ic):
            plan = _argmax_plan(spec)

            def block(b0, b1):
                maxima = separable_window(xc[b0:b1], spec, accumulator(dtype))
                _argmax_taps(xc[b0:b1], plan, maxima, ic[b0:b1])
                _take_winners(xc[b0:b1], geom, ic[b0:b1], oc[b0:b1],
                              ic[b0:b1] < 0 if plan.empty else None)
            return block
    elif spec.op == "max" and dtype == np.float16:
        def blocks(xc, oc, ic):
            def block(b0, b1):
                keys = separable_window(float16.keys(xc[b0:b1]), spec, np.dtype(np.int16))
                float16.from_keys(keys, oc[b0:b1])
            return block
    elif spec.op != "lp" and accumulator(dtype) == dtype and small:
        return _small_run(spec, in_shape, out_shape)
    else:
        acc = accumulator(dtype)
        direct = dtype == acc
        inverse = acc.type(1.0 / spec.p) if spec.op == "lp" else None
        root = None if spec.op != "lp" or spec.p == 1.0 else (
            np.sqrt if spec.p == 2.0 else lambda res, out: np.power(res, inverse, out=out))

        def blocks(xc, oc, ic):
            divisor, empty = _avg_divisor(spec) if spec.op == "avg" else (None, None)

            def block(b0, b1):
                res = separable_window(xc[b0:b1], spec, acc, oc[b0:b1] if direct else None)
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
        in_blocks(block, geom.batch, plane_bytes, arithmetic)
    return run


def _windows_inside(spec: WindowSpec) -> bool:
    """Whether every window lies inside the input: no tap in the padding or past the end."""
    return all(pb == 0 and (o - 1) * s + (k - 1) * d < size for size, o, k, s, (pb, _), d in zip(
        spec.geom.spatial, spec.out_spatial, spec.kernel, spec.stride, spec.pads, spec.dilation))


def _small_argmax_run(spec: WindowSpec, in_shape, out_shape):
    """Max with indices of an input of at most DIRECT_BYTES whose windows all lie inside it:
    every tap's view stacked in row-major window order, ``argmax`` over them (the first
    maximum; where the maximum is NaN, ``argmax`` over the taps reversed: the last NaN), tap
    numbers to flat positions, then the winning elements themselves."""
    plan = _argmax_plan(spec)
    sources = tuple((slice(None),) + tuple(src for _, src in tap) for tap in plan.taps)
    count = len(sources)
    nan_possible = np.dtype(spec.geom.dtype).kind == "f"

    def run(x, _spec, out, indices) -> None:
        xb, values, where = x.reshape(in_shape), out.reshape(out_shape), indices.reshape(out_shape)
        taps = np.stack([xb[src] for src in sources])
        tap = taps.argmax(axis=0)
        np.add(plan.offsets[tap], plan.starts, out=where)
        _take_winners(xb, spec.geom, where, values, None)
        if nan_possible:
            nan = np.isnan(values)
            if nan.any():
                last = (count - 1) - taps[::-1].argmax(axis=0)
                np.add(plan.offsets[last], plan.starts, out=where, where=nan)
                _take_winners(xb, spec.geom, where, values, None)
    return run


def _small_run(spec: WindowSpec, in_shape, out_shape):
    """The max or average of an input of at most DIRECT_BYTES, values only, in the working
    dtype: :func:`reduce_taps`, then the divisor, with nothing around them."""
    views = tap_views(spec, in_shape)
    if spec.op == "max":
        init = lowest(np.dtype(spec.geom.dtype))

        def run(x, _spec, out, indices) -> None:
            reduce_taps(x.reshape(in_shape), views, np.maximum, init, out.reshape(out_shape))
        return run
    divisor, empty = _avg_divisor(spec)
    init = np.dtype(spec.geom.dtype).type(-0.0)

    def run(x, _spec, out, indices) -> None:
        res = out.reshape(out_shape)
        with np.errstate(all="ignore"):  # inf - inf gives NaN, as on the GPU
            reduce_taps(x.reshape(in_shape), views, np.add, init, res)
            np.divide(res, divisor, out=res)
        if empty is not None:
            np.copyto(res, 0, where=empty)
    return run


def window(x, spec: WindowSpec, out, indices) -> None:
    """Max, average or Lp pooling over sliding windows (``spec``) of ``x`` into ``out`` (and
    the max's flat indices into ``indices``), through :func:`prepare_window`."""
    prepare_window(spec)(x, spec, out, indices)



@functools.lru_cache(maxsize=64)
def _mean_weights(plane: int, dtype, factor: float = 1.0) -> np.ndarray:
    """``1 / plane`` (divided by ``factor``, a power of two) for each value of a short plane
    (:data:`SHORT_PLANE` values at most), or once for all the values of a longer one."""
    weights = np.full(plane if plane <= SHORT_PLANE else 1,
                      dtype.type(1.0 / plane) / dtype.type(factor), dtype=dtype)
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
    scaled = flat if owned else scratch("scaled", flat.shape, flat.dtype)
    np.multiply(flat, weights[0], out=scaled)
    if not nhwc:
        np.add.reduce(scaled, axis=1, out=target)
        return
    while plane > 1:
        half = plane // 2
        np.add(scaled[:, :half], scaled[:, plane - half:plane], out=scaled[:, :half])
        plane -= half
    np.copyto(target, scaled[:, 0])


def adaptive(x, spec: AdaptiveSpec, out, indices) -> None:
    """Adaptive and global pooling (:func:`_adaptive`); a float16 result's NaNs as
    :func:`.float16.canonical_nans` makes them."""
    _adaptive(x, spec, out, indices)
    if out.dtype == np.float16:
        float16.canonical_nans(out)


def _adaptive(x, spec: AdaptiveSpec, out, indices) -> None:
    """Adaptive and global pooling: uniform windows as ``window`` (an average to size 1 with
    a dim longer than :data:`TAP_CALLS_MAX` through ``add.accumulate``, in the same order);
    a global max a reduction, a global average a sum of values times weights; other windows
    through the gather of a small block or the shared tap loops, dividing by each window's
    count; bfloat16 through float32 (:mod:`gpupool.cpu.bfloat16`)."""
    if bfloat16.is_bfloat16(x.dtype):
        bfloat16.through_float32(_adaptive)(x, spec, out, indices)
        return
    geom = spec.geom
    xc, oc = canonical(x, geom), canonical(out, geom)
    plane_bytes = x.itemsize * math.prod(geom.spatial) * geom.channels
    if (spec.op == "avg" and spec.whole_plane and not spec.is_global
            and max(geom.spatial) > TAP_CALLS_MAX):
        in_blocks(functools.partial(_window_order_means, xc, oc, geom), geom.batch, plane_bytes)
        return
    if spec.uniform_window is not None and not spec.is_global:
        window(x, spec.uniform_window, out, indices)  # the faster separable tap loops
        return
    spatial_axes = tuple(range(1, geom.nd + 1))
    if spec.is_global and indices is None:
        nd, plane = geom.nd, math.prod(geom.spatial)
        acc = accumulator(x.dtype)
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
            values, factor = (half_as_float32(xb) if xb.dtype != acc else (xb, 1.0))
            flat = values.reshape((b1 - b0, plane) + oc.shape[nd + 1:])
            target = oc[b0:b1].reshape((b1 - b0,) + oc.shape[nd + 1:])
            direct = target.dtype == acc
            means = target if direct else scratch("result", target.shape, acc)
            # unscaled halves times weights scaled by 2**112: the same products, exactly
            _plane_means(flat, weights if factor == 1 else _mean_weights(plane, acc, factor),
                         nhwc, means, owned=xb.dtype != acc)
            if not direct:
                np.copyto(target, means)
        in_blocks(block, geom.batch, plane_bytes, spec.op != "max")
        return
    if indices is not None:
        ic = canonical(indices, geom)
        bounds = [adaptive_bounds(i, o) for i, o in zip(geom.spatial, spec.out_spatial)]

        def block(b0, b1):
            adaptive_argmax(xc[b0:b1], 1, bounds, geom.spatial, oc[b0:b1], ic[b0:b1])
        in_blocks(block, geom.batch, plane_bytes, spec.op != "max")
        return
    per_dim, counts = _adaptive_plans(spec)
    acc = accumulator(x.dtype)
    # a tap beyond a window adds -0.0 (no change: the sum of its taps in order, as the
    # window ops and the CUDA kernels sum) or the lowest value (no change to a max)
    fill = np.asarray(lowest(acc) if spec.op == "max" else -0.0, dtype=acc)

    def block(b0, b1):
        cur = widened(xc[b0:b1], acc)
        if fits_one_gather(cur, geom.nd, math.prod(len(taps) for taps in per_dim),
                           math.prod(spec.out_spatial)):
            cur = gather_reduce(cur, geom.nd, _adaptive_gather(spec),
                                np.maximum if spec.op == "max" else np.add, fill,
                                np.empty((b1 - b0,) + oc.shape[1:], acc))
        else:
            cur = adaptive_reduce(cur, 1, per_dim, spec.op, fill)
        if spec.op == "avg":
            np.divide(cur, counts, out=cur)
        oc[b0:b1] = cur
    in_blocks(block, geom.batch, plane_bytes, spec.op != "max")


TAP_CALLS_MAX = 1024  # taps along a dim that the separable loops take one ufunc call each


def _window_order_means(xc, oc, geom, b0: int, b1: int) -> None:
    """Planes ``[b0, b1)`` of an average over the whole plane in window order, the order of
    the separable tap loops: along the first spatial dim, tap after tap, then the next dim,
    as ``add.accumulate`` adds (strictly in sequence, in one call per dim instead of one per
    tap; slower than the tap loops but on long dims); then divided by the count."""
    acc = accumulator(xc.dtype)
    cur = widened(xc[b0:b1], acc)
    for axis in range(1, geom.nd + 1):
        cur = np.add.accumulate(cur, axis=axis).take([-1], axis=axis)
    np.divide(cur, acc.type(math.prod(geom.spatial)), out=cur)
    oc[b0:b1] = cur


@array_memo(256)
def _adaptive_plans(spec: AdaptiveSpec) -> tuple:
    """Per dim the taps of its windows (:func:`gpupool.windows.adaptive_taps`), and the
    divisor of each output in the working dtype (avg; else None)."""
    geom = spec.geom
    per_dim = [adaptive_taps(*adaptive_bounds(i, o))
               for i, o in zip(geom.spatial, spec.out_spatial)]
    counts = None
    if spec.op == "avg":
        counts = expand(adaptive_counts(spec).astype(accumulator(geom.dtype)), geom)
        counts.flags.writeable = False
    return per_dim, counts


@array_memo(256)
def _adaptive_gather(spec: AdaptiveSpec) -> tuple:
    """The :func:`gather_plan` of adaptive windows (built only for small planes)."""
    taps = []
    for size, out in zip(spec.geom.spatial, spec.out_spatial):
        starts, ends = adaptive_bounds(size, out)
        pos = starts[None, :] + np.arange(int((ends - starts).max()))[:, None]
        taps.append((pos, pos < ends[None, :]))
    return gather_plan(spec.geom.spatial, taps)


def unpool(x, spec: UnpoolSpec, out, indices) -> None:
    """Zeros, then each value written at its index in its plane (index -1 skipped, the others
    checked to lie in it), one scatter."""
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
