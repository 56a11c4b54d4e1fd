"""NumPy backward of the float poolings (the ``backward`` entry point of
:class:`gpupool.cpu.entry_points.NumpyBackend`).

The order of every sum is fixed, so that the CUDA kernels, which gather per input element,
give the same bits:

* averages (window, adaptive, global) and Lp: ``q = grad / divisor`` per output (Lp: ``grad *
  y**(1-p)``) in the working dtype (:func:`gpupool.windows.accumulator`), spread back one
  spatial dim at a time, the last first; along a dim each input position sums, from +0, the
  ``q`` of the windows that cover it in ascending order. Lp then multiplies a nonzero sum
  by ``sign(x) * |x|**(p-1)`` (0 where x is 0); a zero sum gives +0.
* maxima: each output's gradient goes to the input position its index names, summed from +0
  in the outputs' row-major order where several outputs name one position (``np.add.at``).
"""
from __future__ import annotations

import numpy as np

from . import bfloat16, float16
from .memo import array_memo
from .reduce import window_taps
from ..grad_spec import GradSpec
from ..spec import WindowSpec
from ..windows import accumulator, adaptive_bounds, adaptive_counts, window_counts


def _canonical(a, geom, spatial):
    """``a`` viewed as (batch, *spatial, channels), channels 1 for NCHW."""
    return a.reshape((geom.batch,) + tuple(spatial) + (geom.channels,))


@array_memo(256)
def _divisor(forward) -> np.ndarray:
    """Per output position (shape ``out_spatial``, float64, read-only) the divisor of the
    forward average; 0 where a window has no valid tap (its output is 0 and passes no
    gradient)."""
    if not isinstance(forward, WindowSpec):
        divisor = adaptive_counts(forward).astype(np.float64)
    else:
        valid = window_counts(forward, False)
        divisor = np.where(valid > 0, np.full(forward.out_spatial,
                                              float(forward.divisor_override))
                           if forward.divisor_override
                           else window_counts(forward, forward.count_include_pad), 0.0)
    divisor.flags.writeable = False
    return divisor


def _spread_window(q, forward: WindowSpec, acc):
    """Each input position's sum of the ``q`` of the windows that cover it (valid taps only)."""
    cur = q
    for a in reversed(range(forward.geom.nd)):
        size, out = forward.geom.spatial[a], forward.out_spatial[a]
        shape = list(cur.shape)
        shape[1 + a] = size
        res = np.zeros(shape, acc)
        lead = (slice(None),) * (1 + a)
        # tap t of window o is input o*s - pb + t*d: taps descending = windows ascending
        for _, dst, src in reversed(window_taps(size, out, forward.kernel[a], forward.stride[a],
                                                forward.pads[a][0], forward.dilation[a])):
            res[lead + (src,)] += cur[lead + (dst,)]
        cur = res
    return cur


def _spread_adaptive(q, forward, acc):
    """As :func:`_spread_window` for adaptive windows ``[floor(o*I/O), ceil((o+1)*I/O))``:
    input ``i`` is covered by the windows ``o`` in ``[lo(i), hi(i))``, added in that order."""
    cur = q
    for a in reversed(range(forward.geom.nd)):
        size, out = forward.geom.spatial[a], forward.out_spatial[a]
        starts, ends = adaptive_bounds(size, out)
        pos = np.arange(size)
        lo, hi = np.searchsorted(ends, pos, "right"), np.searchsorted(starts, pos, "right")
        shape = list(cur.shape)
        shape[1 + a] = size
        res = np.zeros(shape, acc)
        for t in range(int((hi - lo).max())):
            o = lo + t
            taken = np.take(cur, np.minimum(o, hi - 1), axis=1 + a)
            if not (o < hi).all():  # +0 where input i has fewer windows: changes no sum
                mask = [1] * cur.ndim
                mask[1 + a] = size
                taken = np.where((o < hi).reshape(mask), taken, acc.type(0))
            res += taken
        cur = res
    return cur


def _average(spec: GradSpec, grad, result, x=None, y=None):
    forward = spec.forward
    geom = forward.geom
    acc = accumulator(grad.dtype)
    g = _canonical(grad, geom, forward.out_spatial).astype(acc)
    if forward.op == "lp":
        q = _lp_outer(g, _canonical(y, geom, forward.out_spatial).astype(acc), forward.p, acc)
    else:
        divisor = _divisor(forward)[None, ..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(divisor > 0, g / divisor.astype(acc), acc.type(0))
    spread = (_spread_window(q, forward, acc) if isinstance(forward, WindowSpec)
              else _spread_adaptive(q, forward, acc))
    if forward.op == "lp":  # +0 where the windows' sum is 0: no 0 * inf, no -0
        inner = _lp_inner(_canonical(x, geom, geom.spatial).astype(acc), forward.p, acc)
        with np.errstate(invalid="ignore", over="ignore"):
            spread = np.where(spread == 0, acc.type(0), spread * inner)
    result[...] = spread.reshape(result.shape)


def _lp_outer(g, y, p: float, acc):
    """``g * y**(1-p)`` per output, 0 where ``y`` is 0."""
    p = acc.type(p)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if p == 1:
            return g.copy()
        scaled = g / y if p == 2 else g * np.power(y, acc.type(1) - p)
        return np.where(y == 0, acc.type(0), scaled)


def _lp_inner(x, p: float, acc):
    """``sign(x) * |x|**(p-1)``, 0 where ``x`` is 0."""
    p = acc.type(p)
    if p == 1:
        return np.sign(x)
    if p == 2:
        return x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(x == 0, acc.type(0), np.sign(x) * np.power(np.abs(x), p - acc.type(1)))


def _disjoint(forward) -> bool:
    """Whether no two windows share an input position (then no position receives two
    gradients, and the sums are plain stores)."""
    if isinstance(forward, WindowSpec):
        return all(o == 1 or s >= d * (k - 1) + 1 for o, s, k, d in zip(
            forward.out_spatial, forward.stride, forward.kernel, forward.dilation))
    return all(o == 1 or i % o == 0 for i, o in zip(forward.geom.spatial, forward.out_spatial))


def _max(spec: GradSpec, grad, result, indices):
    forward = spec.forward
    geom = forward.geom
    g = _canonical(grad, geom, forward.out_spatial)
    target = _canonical(indices, geom, forward.out_spatial).astype(np.int64)
    taken = target >= 0
    target += np.arange(0, geom.batch * spec.plane_size, spec.plane_size).reshape(
        (-1,) + (1,) * (g.ndim - 1))
    if geom.channels > 1:
        target *= geom.channels
        target += np.arange(geom.channels)
    if not taken.all():
        target, g = target[taken], g[taken]
    acc = accumulator(grad.dtype)
    if _disjoint(forward):
        flat = result.reshape(-1)
        flat[...] = 0
        flat[target.reshape(-1)] = g.reshape(-1) + acc.type(0)  # +0 + g, as the sums: -0 -> +0
        return
    sums = result.reshape(-1) if acc == result.dtype else np.empty(result.size, acc)
    sums[...] = 0
    np.add.at(sums, target.reshape(-1), g.reshape(-1).astype(acc, copy=False))
    if acc != result.dtype:
        result[...] = sums.reshape(result.shape)


def backward(grad, spec: GradSpec, out, indices=None, x=None, y=None) -> None:
    """Write the gradient of the input into ``out`` (shape of the forward input, dtype of
    ``grad``): from ``indices`` for a max, from ``x`` and the forward output ``y`` for Lp.
    bfloat16: the float32 gradient of the widened operands, rounded once
    (:mod:`gpupool.cpu.bfloat16`); float16: every NaN as 0x7FFF
    (:func:`.float16.canonical_nans`)."""
    if bfloat16.is_bfloat16(grad.dtype):
        gradient = np.empty(out.shape, np.float32)
        backward(bfloat16.widened(grad), bfloat16.as_float32(spec), gradient, indices,
                 *(None if a is None else bfloat16.widened(a) for a in (x, y)))
        bfloat16.round_into(out, gradient)
        return
    if spec.op == "max":
        _max(spec, grad, out, indices)
    else:
        _average(spec, grad, out, x, y)
    if out.dtype == np.float16:
        float16.canonical_nans(out)
