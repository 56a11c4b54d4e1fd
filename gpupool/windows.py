"""Window arithmetic shared by every backend and adapter: the working dtype, the value of a
window with no valid tap, the divisor counts of averages, the spans of adaptive windows (small
host arrays computed from a spec, :mod:`gpupool.spec`), the adaptive tap loops of the NumPy
backend with their order and NaN rule, conversions to and from float64 that keep float32
subnormals on CuPy arrays too, and the rule that a max's index names a tap of its own window,
which every op and Dask block taking indices checks."""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from . import spec as S
from .spec import ACC_DTYPES, FLOAT_DTYPES, AdaptiveSpec, WindowSpec, adaptive_window


@functools.cache
def accumulator(dtype) -> np.dtype:
    """The dtype sums run in: float32 for float16 and bfloat16
    (:data:`gpupool.spec.ACC_DTYPES`), else ``dtype`` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(ACC_DTYPES.get(dtype.name, dtype.name))


def narrowed(values, dtype, xp=np):
    """The working-dtype ``values`` (NumPy or CuPy, ``xp``) as ``dtype``: a cast, except to
    bfloat16, which rounds each float32 as CUDA's ``__float2bfloat16_rn`` (to nearest, ties to
    even; overflow to inf; every NaN to 0x7FFF), the same bits on every backend."""
    dtype = np.dtype(dtype)
    if dtype.name != "bfloat16":
        return values.astype(dtype, copy=False)
    bits = xp.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = xp.right_shift(bits, 16)
    xp.bitwise_and(rounded, 1, out=rounded)
    rounded += 0x7FFF
    rounded += bits  # wraps only for NaNs (all-ones exponent, sign set), replaced below
    xp.right_shift(rounded, 16, out=rounded)
    rounded = rounded.astype(np.uint16)
    nan = xp.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FFF
    return rounded.view(dtype)


# CuPy compiles its own kernels (astype included) with -ftz=true, which flushes float32
# subnormals in arithmetic and conversions; the two below keep them, in integer and float64
# arithmetic only, so that NumPy and CuPy arrays (and Dask arrays of either) give the same bits.

def to_float64(x, xp=np):
    """``x`` (NumPy, CuPy or Dask, ``xp``) as float64, float32 subnormals kept."""
    if x.dtype != "float32":
        return x.astype("float64")
    bits = x.view("uint32")
    magnitude = bits & 0x7FFFFFFF
    units = magnitude.astype("float64") * 2.0**-149  # exact for a subnormal's 23 bits
    subnormal = xp.where(bits >> 31 == 1, -units, units)
    return xp.where(magnitude < 0x00800000, subnormal, x.astype("float64"))


def to_float32(v, xp=np):
    """The float64 array ``v`` rounded to float32 (to nearest even), subnormal results kept."""
    magnitude = xp.abs(v)
    subnormal = magnitude < 2.0**-126
    # a subnormal float32 is a multiple of 2**-149: round the count of them, then set its bits
    units = xp.rint(xp.where(subnormal, magnitude, 0.0) * 2.0**149).astype("uint32")
    sign = xp.signbit(v).astype("uint32") << 31
    bits = xp.where(subnormal, units | sign, v.astype("float32").view("uint32"))
    return bits.view("float32")


@functools.cache
def lowest(dtype):
    """What a max starts from and never loses to: -inf (every float dtype, bfloat16 too), or
    an integer dtype's minimum; also the value of a max window with no valid tap."""
    dtype = np.dtype(dtype)
    return -np.inf if dtype.name in FLOAT_DTYPES else np.iinfo(dtype).min


def window_counts_per_dim(spec: WindowSpec, include_pad: bool) -> list[np.ndarray]:
    """Per spatial dim, the taps of each output position along it (int64, shape ``(out,)``):
    the valid ones, or with ``include_pad`` those inside input + explicit padding (never the
    ceil-mode overhang). A window's count is the product over dims."""
    per_dim = []
    for size, out, k, s, (pb, pe), d in zip(spec.geom.spatial, spec.out_spatial, spec.kernel,
                                             spec.stride, spec.pads, spec.dilation):
        pos = np.arange(out)[:, None] * s - pb + np.arange(k)[None, :] * d
        low, high = (-pb, size + pe) if include_pad else (0, size)
        per_dim.append(((pos >= low) & (pos < high)).sum(axis=1).astype(np.int64))
    return per_dim


def window_counts(spec: WindowSpec, include_pad: bool) -> np.ndarray:
    """Taps per output position (float64, shape ``out_spatial``): the product of
    :func:`window_counts_per_dim`. The divisor of an average (``count_include_pad``)."""
    counts = np.ones((), dtype=np.float64)
    for per_dim in window_counts_per_dim(spec, include_pad):
        counts = np.multiply.outer(counts, per_dim.astype(np.float64))
    return counts


def adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (int64) of the adaptive windows along a dim of ``size`` pooled to
    ``out`` (:func:`gpupool.spec.adaptive_window`)."""
    bounds = np.array([adaptive_window(i, size, out) for i in range(out)], np.int64)
    return bounds[:, 0], bounds[:, 1]


def adaptive_counts(spec: AdaptiveSpec) -> np.ndarray:
    """Taps per output position of an adaptive (or global) pooling (int64, shape
    ``out_spatial``): the divisor of its average."""
    counts = np.ones((), dtype=np.int64)
    for size, out in zip(spec.geom.spatial, spec.out_spatial):
        starts, ends = adaptive_bounds(size, out)
        counts = np.multiply.outer(counts, ends - starts)
    return counts


def adaptive_taps(starts, ends) -> list:
    """The taps of windows ``[starts, ends)`` along a dim, in order: per tap ``t`` the input
    positions ``min(starts + t, ends - 1)`` and the mask of the windows that have tap ``t``
    (None where all do)."""
    taps = []
    for t in range(int((ends - starts).max())):
        pos = starts + t
        valid = pos < ends
        taps.append((np.minimum(pos, ends - 1), None if valid.all() else valid))
    return taps


def along(mask, ndim: int, axis: int):
    """A 1-D ``mask`` shaped to broadcast along ``axis`` of an ``ndim``-dim array."""
    shape = [1] * ndim
    shape[axis] = mask.size
    return mask.reshape(shape)


def adaptive_reduce(x, first: int, taps_per_dim, op: str, fill):
    """Max or sum (``op`` "max" or "avg") over adaptive windows of the spatial axes ``first``,
    ``first + 1``, ...: one dim at a time, each window's taps in order, a tap beyond a window
    reading ``fill`` (a 0-d array of the working dtype: the lowest value for a max, -0.0 for
    a sum, neither of which changes the result), in the order of the CUDA kernels; returns a
    new array of ``fill``'s dtype."""
    cur = x
    for a, taps in enumerate(taps_per_dim):
        axis = first + a
        res = None
        for pos, valid in taps:
            v = np.take(cur, pos, axis=axis)
            if valid is not None:
                v = np.where(along(valid, v.ndim, axis), v, fill)
            if res is None:
                res = v.astype(fill.dtype, copy=True)
            elif op == "max":
                np.maximum(res, v, out=res)
            else:
                res += v
        cur = res
    return cur


def adaptive_argmax(x, first: int, bounds, plane, values, indices):
    """Adaptive max with indices into ``values``/``indices`` (shape of the output): the first
    tap equal to the max in row-major order, or the last NaN tap. ``bounds``: per spatial dim
    the ``(starts, ends)`` of its windows (:func:`adaptive_bounds`, none empty). Indices are
    flat positions in the spatial plane of ``x``, of shape ``plane``. Loops over the taps of
    the largest window, or over the windows where they are fewer (a global max: one)."""
    strides = [math.prod(plane[a + 1:]) for a in range(len(bounds))]
    windows = math.prod(len(starts) for starts, _ in bounds)
    if windows < math.prod(int((ends - starts).max()) for starts, ends in bounds):
        _argmax_by_windows(x, first, bounds, strides, values, indices)
    else:
        _argmax_by_taps(x, first, [adaptive_taps(starts, ends) for starts, ends in bounds],
                        strides, values, indices)


def _argmax_by_taps(x, first: int, taps_per_dim, strides, values, indices):
    """:func:`adaptive_argmax` a tap of every window at a time, in row-major tap order."""
    trailing = (None,) * (x.ndim - first - len(taps_per_dim))
    values[...] = lowest(values.dtype)
    indices[...] = -1
    for combo in itertools.product(*(range(len(taps)) for taps in taps_per_dim)):
        valid, pos, grids = np.ones((), bool), np.zeros((), np.int64), []
        for a, t in enumerate(combo):
            p, ok = taps_per_dim[a][t]
            grids.append(p)
            valid = np.logical_and.outer(valid, np.ones(p.size, bool) if ok is None else ok)
            pos = np.add.outer(pos, p * strides[a])
        v = x[(slice(None),) * first + np.ix_(*grids)]
        valid = valid[(Ellipsis,) + trailing]
        take = ((v > values) | (indices < 0)) & valid
        if values.dtype.kind == "f":
            take |= np.isnan(v) & valid
        np.copyto(values, v, where=take)
        np.copyto(indices, np.broadcast_to(pos[(Ellipsis,) + trailing], indices.shape),
                  where=take)


def _argmax_by_windows(x, first: int, bounds, strides, values, indices):
    """:func:`adaptive_argmax` a window at a time: its taps flattened in row-major order, the
    first maximum (``argmax``) unless a NaN is among them, then the last NaN."""
    lead, nd = (slice(None),) * first, len(bounds)
    for window in itertools.product(*(range(len(starts)) for starts, _ in bounds)):
        spans = [(int(bounds[a][0][o]), int(bounds[a][1][o])) for a, o in enumerate(window)]
        box = x[lead + tuple(slice(lo, hi) for lo, hi in spans)]
        taps = box.reshape(box.shape[:first] + (-1,) + box.shape[first + nd:])
        k = np.argmax(taps, axis=first)
        if taps.dtype.kind == "f":
            nan = np.isnan(taps)
            last_nan = taps.shape[first] - 1 - np.argmax(np.flip(nan, axis=first), axis=first)
            k = np.where(nan.any(axis=first), last_nan, k)
        values[lead + window] = np.take_along_axis(taps, k[(*lead, None)], first)[
            (*lead, 0)]
        coords = np.unravel_index(k, [hi - lo for lo, hi in spans])
        indices[lead + window] = sum((lo + c) * stride for (lo, _), c, stride
                                     in zip(spans, coords, strides))


def fail_outside_windows(func: str) -> None:
    """The ``ValueError`` of an index that breaks the rule of
    :func:`check_indices_in_windows`."""
    S.fail(func, "an index lies outside the pooling window of its position (on none of its "
                 "window's taps): indices must be those the max pooling returned with the "
                 "same parameters")


def check_indices_in_windows(func: str, indices, pooling, xp=np, first_outputs=None) -> None:
    """The rule of a max's indices: each (a flat position in an input plane of ``pooling``, a
    WindowSpec or AdaptiveSpec, already checked to lie in ``[-1, plane)``) names a tap of the
    window of its own position, or is -1 (a window with no valid tap); ``ValueError``
    otherwise. A position along a dilated dim between two taps is in no window. ``indices``
    (NumPy or CuPy, ``xp``; one host sync on CuPy) holds the outputs from ``first_outputs``
    on (per spatial dim; the whole output when None), as a block of a Dask array does."""
    if not bool(_in_windows(indices, pooling, xp, first_outputs).all()):
        fail_outside_windows(func)


def index_rule(indices, pooling, windows: bool, xp=np) -> tuple[bool, bool | None]:
    """``(in_plane, in_windows)`` of a max's non-empty ``indices`` (NumPy or CuPy, ``xp``; of
    ``pooling``'s output shape), in one host transfer: whether every index lies in
    ``[-1, plane)`` of ``pooling``'s input plane and, where ``windows`` (else None), whether
    every index in that range also follows the rule of :func:`check_indices_in_windows`."""
    parts = [indices.min(), indices.max()]
    if windows:
        parts.append(_in_windows(indices, pooling, xp).all())
    if xp is not np:  # one transfer for all three
        parts = xp.stack([v.astype(np.int64) for v in parts]).tolist()
    low, high, *inside = (int(v) for v in parts)
    in_plane = low >= -1 and high < math.prod(pooling.geom.spatial)
    return in_plane, bool(inside[0]) if inside else None


def _in_windows(indices, spec, xp, first_outputs=None):
    """Per index, whether it is -1 or names a tap of its own window (the rule of
    :func:`check_indices_in_windows`). Runs in int32 where every position and window start
    fits."""
    geom = spec.geom
    first, nd = len(geom.lead), geom.nd
    first_outputs = first_outputs or (0,) * nd
    bounds = []  # per dim: the windows' first position, and their end (adaptive) or None
    for a in range(nd):
        size, out = geom.spatial[a], spec.out_spatial[a]
        outputs = slice(first_outputs[a], first_outputs[a] + indices.shape[first + a])
        if isinstance(spec, WindowSpec):
            bounds.append((np.arange(out, dtype=np.int64)[outputs] * spec.stride[a]
                           - spec.pads[a][0], None))
        else:
            bounds.append(tuple(b[outputs] for b in adaptive_bounds(size, out)))
    fits = (math.prod(geom.spatial) < 2**31
            and all(b[0].size == 0 or (abs(int(b[0].min())) < 2**31
                                       and abs(int(b[0].max())) < 2**31) for b in bounds))
    narrow = np.int32 if fits else np.int64
    rest = indices.astype(narrow)
    inside = None
    for a in reversed(range(nd)):
        rest, coord = xp.divmod(rest, narrow(geom.spatial[a])) if a else (None, rest)
        starts, ends = (None if b is None else along(xp.asarray(b.astype(narrow)), coord.ndim,
                                                     first + a) for b in bounds[a])
        if ends is None:  # a sliding window: tap t at start + t * dilation, t < kernel
            k, d = spec.kernel[a], spec.dilation[a]
            offset = coord - starts
            if d > 1:
                offset, skew = xp.divmod(offset, narrow(d))
                ok = (skew == 0) & (offset >= 0) & (offset < k)
            else:
                ok = (offset >= 0) & (offset < k)
        else:
            ok = (coord >= starts) & (coord < ends)
        inside = ok if inside is None else inside & ok
    return inside | (indices < 0)
