"""Independent reference for the pooling semantics of gpupool, used by the tests.

Direct Python loops over the formulas, in float64 (Python ints for integer max), over planes,
output positions and window taps. Deliberately slow and obvious: nothing here imports gpupool,
and every rule (padding forms, output size with ceil mode, divisors, NaN, ties, empty windows,
adaptive bounds) is written out again from the documented semantics.

Shapes: ``nd`` spatial dims; NCHW means ``x.shape == lead + spatial``; NHWC means
``x.shape == lead + spatial + (C,)``. Every other dim is a plane dim.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

__all__ = ["resolve_padding", "output_length", "max_pool", "avg_pool", "lp_pool",
           "adaptive_avg_pool", "adaptive_max_pool", "global_avg_pool", "global_max_pool",
           "max_unpool", "unpool_output_length", "max_pool_backward", "avg_pool_backward",
           "lp_pool_backward", "adaptive_avg_pool_backward", "adaptive_max_pool_backward",
           "global_avg_pool_backward", "global_max_pool_backward"]


# ----------------------------------------------------------------------------- shape rules

def _per_dim(value, nd):
    if isinstance(value, (tuple, list)):
        assert len(value) == nd
        return tuple(int(v) for v in value)
    return (int(value),) * nd


def resolve_padding(padding, spatial, kernel, stride, dilation):
    """(begin, end) per spatial dim for every accepted padding form."""
    nd = len(spatial)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * nd
        assert padding in ("same", "same_lower"), padding
        pads = []
        for size, k, s, d in zip(spatial, kernel, stride, dilation):
            out = math.ceil(Fraction(size, s))          # SAME: output ceil(I / s)
            extent = d * (k - 1) + 1                     # dilated window span
            total = max(0, (out - 1) * s + extent - size)
            smaller, larger = total // 2, total - total // 2
            # SAME_UPPER puts the odd pad at the end, SAME_LOWER at the start
            pads.append((smaller, larger) if padding == "same" else (larger, smaller))
        return tuple(pads)
    pairs = isinstance(padding, (tuple, list)) and len(padding) > 0
    if pairs and isinstance(padding[0], (tuple, list)):
        assert len(padding) == nd
        return tuple((int(b), int(e)) for b, e in padding)
    return tuple((p, p) for p in _per_dim(padding, nd))


def output_length(size, k, s, pad, d, ceil_mode):
    """Documented formula: O = floor((I + pb + pe - d*(k-1) - 1 + (s-1 if ceil)) / s) + 1, then with
    ceil mode drop the last window once if it starts in the end padding."""
    pb, pe = pad
    numerator = size + pb + pe - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = math.floor(Fraction(numerator, s)) + 1
    if ceil_mode and (out - 1) * s >= size + pb:
        out -= 1
    return out


def unpool_output_length(size, k, s, pad):
    pb, pe = pad
    return (size - 1) * s - pb - pe + k


def adaptive_bounds(i, size, out):
    """[floor(i*I/O), ceil((i+1)*I/O))."""
    return math.floor(Fraction(i * size, out)), math.ceil(Fraction((i + 1) * size, out))


# ----------------------------------------------------------------------------- planes

def _planes(x, nd, layout):
    """Return (planes, lead, spatial): planes is a list of flat Python lists (row-major over the
    spatial dims); ``lead`` includes C (moved before the spatial dims) for NHWC."""
    x = np.asarray(x)
    if layout == "NHWC":
        x = np.moveaxis(x, -1, x.ndim - nd - 1)
    lead, spatial = x.shape[:x.ndim - nd], x.shape[x.ndim - nd:]
    wide = np.int64 if x.dtype.kind in "iu" else np.float64
    flat = np.ascontiguousarray(x).astype(wide).reshape((math.prod(lead), math.prod(spatial)))
    return [row.tolist() for row in flat], lead, spatial


def _unplanes(values, lead, out_spatial, layout, dtype):
    arr = np.array(values, dtype=dtype).reshape(tuple(lead) + tuple(out_spatial))
    if layout == "NHWC":
        arr = np.moveaxis(arr, arr.ndim - len(out_spatial) - 1, -1)
    return arr


def _flat(pos, spatial):
    f = 0
    for p, n in zip(pos, spatial):
        f = f * n + p
    return f


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return int(np.iinfo(dtype).min) if dtype.kind in "iu" else -math.inf


def _max_of(taps, lowest):
    """``taps``: (value, flat index) in row-major tap order. The first valid tap starts the scan
    (padded taps never win); then ``v > m or isnan(v)`` replaces, so ties keep the first."""
    m, idx = lowest, -1
    for v, f in taps:
        if idx == -1 or v > m or v != v:
            m, idx = v, f
    return m, idx


# ----------------------------------------------------------------------------- sliding windows

def _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout):
    """Yield the geometry and, per plane and output position, the valid taps and the number of
    taps inside input + explicit padding."""
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    kernel = _per_dim(kernel_size, nd)
    stride = kernel if stride is None else _per_dim(stride, nd)
    dilation = _per_dim(dilation, nd)
    planes, lead, spatial = _planes(x, nd, layout)
    pads = resolve_padding(padding, spatial, kernel, stride, dilation)
    out_spatial = tuple(output_length(i, k, s, p, d, ceil_mode)
                        for i, k, s, p, d in zip(spatial, kernel, stride, pads, dilation))
    assert all(o >= 1 for o in out_spatial), out_spatial

    def gen():
        for plane in planes:
            for opos in itertools.product(*(range(o) for o in out_spatial)):
                taps, in_padded = [], 0
                # taps in row-major order over the kernel
                for t in itertools.product(*(range(k) for k in kernel)):
                    pos = tuple(o * s - p[0] + tt * d
                                for o, s, p, tt, d in zip(opos, stride, pads, t, dilation))
                    if all(-p[0] <= c < n + p[1] for c, n, p in zip(pos, spatial, pads)):
                        in_padded += 1
                    if all(0 <= c < n for c, n in zip(pos, spatial)):
                        f = _flat(pos, spatial)
                        taps.append((plane[f], f))
                yield taps, in_padded
    return gen(), lead, out_spatial


def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
             layout="NCHW"):
    """Return (values, indices): values float64 (int64 for integer input), indices int64."""
    x = np.asarray(x)
    lowest = _lowest(x.dtype)
    gen, lead, out_spatial = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    vals, idxs = [], []
    for taps, _ in gen:
        m, i = _max_of(taps, lowest)
        vals.append(m)
        idxs.append(i)
    kind = np.int64 if x.dtype.kind in "iu" else np.float64
    return (_unplanes(vals, lead, out_spatial, layout, kind),
            _unplanes(idxs, lead, out_spatial, layout, np.int64))


def avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=False,
             divisor_override=None, dilation=1, layout="NCHW"):
    gen, lead, out_spatial = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    vals = []
    for taps, in_padded in gen:
        if not taps:
            vals.append(0.0)
            continue
        total = sum(v for v, _ in taps)
        if divisor_override is not None:
            divisor = divisor_override
        elif count_include_pad:
            divisor = in_padded
        else:
            divisor = len(taps)
        vals.append(total / divisor)
    return _unplanes(vals, lead, out_spatial, layout, np.float64)


def lp_pool(x, p, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
            layout="NCHW"):
    gen, lead, out_spatial = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    vals = []
    for taps, _ in gen:
        total = sum(abs(v) ** p for v, _ in taps)
        vals.append(total ** (1.0 / p) if taps else 0.0)
    return _unplanes(vals, lead, out_spatial, layout, np.float64)


# ----------------------------------------------------------------------------- adaptive, global

def _adaptive(x, output_size, layout, reduce):
    nd = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    out_spatial = _per_dim(output_size, nd)
    planes, lead, spatial = _planes(x, nd, layout)
    results = []
    for plane in planes:
        for opos in itertools.product(*(range(o) for o in out_spatial)):
            ranges = [range(*adaptive_bounds(i, n, o))
                      for i, n, o in zip(opos, spatial, out_spatial)]
            taps = [(plane[_flat(pos, spatial)], _flat(pos, spatial))
                    for pos in itertools.product(*ranges)]
            results.append(reduce(taps))
    return results, lead, out_spatial


def adaptive_avg_pool(x, output_size, layout="NCHW"):
    res, lead, out_spatial = _adaptive(x, output_size, layout,
                                       lambda taps: sum(v for v, _ in taps) / len(taps))
    return _unplanes(res, lead, out_spatial, layout, np.float64)


def adaptive_max_pool(x, output_size, layout="NCHW"):
    x = np.asarray(x)
    lowest = _lowest(x.dtype)
    res, lead, out_spatial = _adaptive(x, output_size, layout, lambda t: _max_of(t, lowest))
    kind = np.int64 if x.dtype.kind in "iu" else np.float64
    return (_unplanes([v for v, _ in res], lead, out_spatial, layout, kind),
            _unplanes([i for _, i in res], lead, out_spatial, layout, np.int64))


def global_avg_pool(x, spatial_dims=2, layout="NCHW"):
    return adaptive_avg_pool(x, (1,) * spatial_dims, layout)


def global_max_pool(x, spatial_dims=2, layout="NCHW"):
    return adaptive_max_pool(x, (1,) * spatial_dims, layout)[0]


# ----------------------------------------------------------------------------- unpool

def max_unpool(x, indices, kernel_size, stride=None, padding=0, output_size=None,
               layout="NCHW"):
    """Scatter into zeros; ``output_size`` here is spatial only (or None)."""
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    kernel = _per_dim(kernel_size, nd)
    stride = kernel if stride is None else _per_dim(stride, nd)
    planes, lead, spatial = _planes(x, nd, layout)
    iplanes, _, _ = _planes(np.asarray(indices), nd, layout)
    if output_size is None:
        pads = resolve_padding(padding, spatial, kernel, stride, (1,) * nd)
        out_spatial = tuple(unpool_output_length(i, k, s, p)
                            for i, k, s, p in zip(spatial, kernel, stride, pads))
    else:
        out_spatial = tuple(output_size)
    size = math.prod(out_spatial)
    zero = 0 if np.asarray(x).dtype.kind in "iu" else 0.0
    result = []
    for plane, iplane in zip(planes, iplanes):
        dest = [zero] * size
        for v, i in zip(plane, iplane):
            assert 0 <= i < size
            dest[i] = v
        result.extend(dest)
    kind = np.int64 if np.asarray(x).dtype.kind in "iu" else np.float64
    return _unplanes(result, lead, out_spatial, layout, kind)


# ----------------------------------------------------------------------------- vectorised check

def vectorised_window(x, op, kernel, stride, pads, dilation, out_spatial, *,
                      count_include_pad=False, divisor_override=None, p=None):
    """A second, vectorised formulation for large NCHW inputs (the loops above are too slow):
    pad to cover every window (``-inf``/0 outside the input), view the windows with
    ``sliding_window_view``, keep every ``dilation``-th tap and every ``stride``-th window, and
    reduce. Masks of ones give the valid and the input+explicit-padding tap counts."""
    x = np.asarray(x, np.float64)
    nd = len(kernel)
    spatial = x.shape[x.ndim - nd:]
    axes = tuple(range(x.ndim - nd, x.ndim))
    widths, mask_widths = [], []
    for i, k, s, (pb, pe), d, o in zip(spatial, kernel, stride, pads, dilation, out_spatial):
        need = (o - 1) * s + d * (k - 1) + 1            # padded length the windows touch
        length = max(need, i + pb + pe)
        widths.append((pb, length - i - pb))
        mask_widths.append(length - i - pb - pe)         # ceil-mode overhang beyond the pad
    fill = -np.inf if op == "max" else 0.0
    values = np.abs(x) ** p if op == "lp" else x
    padded = np.pad(values, [(0, 0)] * (x.ndim - nd) + widths, constant_values=fill)
    valid = np.pad(np.ones(spatial), widths)
    inpad = np.pad(np.pad(np.ones(spatial), [pad for pad in pads], constant_values=1),
                   [(0, extra) for extra in mask_widths])
    extents = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))

    def windows(a, lead_axes):
        w = np.lib.stride_tricks.sliding_window_view(a, extents, axis=tuple(
            range(lead_axes, lead_axes + nd)))
        pick = (slice(None),) * lead_axes
        pick += tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_spatial, stride))
        pick += tuple(slice(None, None, d) for d in dilation)
        return w[pick]

    wx = windows(padded, x.ndim - nd)
    tap_axes = tuple(range(x.ndim, x.ndim + nd))
    n_valid = windows(valid, 0).sum(axis=tuple(range(nd, 2 * nd)))
    if op == "max":
        return wx.max(axis=tap_axes)
    total = wx.sum(axis=tap_axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        if op == "lp":
            return np.where(n_valid > 0, total ** (1.0 / p), 0.0)
        if divisor_override is not None:
            divisor = np.full(n_valid.shape, float(divisor_override))
        elif count_include_pad:
            divisor = windows(inpad, 0).sum(axis=tuple(range(nd, 2 * nd)))
        else:
            divisor = n_valid
        return np.where(n_valid > 0, total / divisor, 0.0)


# ----------------------------------------------------------------------------- backward

def _spread(x, grad, nd, layout, windows, contributions):
    """The input's gradient (float64, shape of ``x``): for each plane and output position, in
    the order of ``windows`` (its taps ``(value, flat)`` and the count of taps inside input +
    explicit padding), ``contributions(g, taps, in_padded)`` gives ``(flat, amount)`` pairs
    added to the input plane."""
    planes, lead, spatial = _planes(x, nd, layout)
    gplanes, _, _ = _planes(grad, nd, layout)
    gflat = [g for plane in gplanes for g in plane]
    size = math.prod(spatial)
    result = [[0.0] * size for _ in planes]
    per_plane = len(gflat) // max(len(planes), 1)
    for n, (taps, in_padded) in enumerate(windows):
        dest = result[n // per_plane]
        for f, amount in contributions(gflat[n], taps, in_padded):
            dest[f] += amount
    return _unplanes([v for plane in result for v in plane], lead, spatial, layout, np.float64)


def _argmax_term(lowest):
    def term(g, taps, _):
        _, f = _max_of(taps, lowest)
        return [(f, g)] if f >= 0 else []
    return term


def max_pool_backward(grad, x, kernel_size, stride=None, padding=0, dilation=1,
                      ceil_mode=False, layout="NCHW"):
    """Each window's gradient to its max (first of ties, last NaN), found again in ``x``."""
    gen, _, _ = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    return _spread(x, grad, nd, layout, gen, _argmax_term(-math.inf))


def avg_pool_backward(grad, input_shape, kernel_size, stride=None, padding=0, ceil_mode=False,
                      count_include_pad=False, divisor_override=None, dilation=1,
                      layout="NCHW"):
    """Each valid tap of a window gets the window's gradient over its divisor."""
    x = np.zeros(input_shape)
    gen, _, _ = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2

    def term(g, taps, in_padded):
        if not taps:
            return []
        divisor = (divisor_override if divisor_override is not None
                   else in_padded if count_include_pad else len(taps))
        return [(f, g / divisor) for _, f in taps]
    return _spread(x, grad, nd, layout, gen, term)


def lp_pool_backward(grad, x, p, kernel_size, stride=None, padding=0, dilation=1,
                     ceil_mode=False, layout="NCHW"):
    """d/dv of (sum |v|**p)**(1/p): sign(v) |v|**(p-1) y**(1-p); 0 where v or y is 0."""
    gen, _, _ = _windows(x, kernel_size, stride, padding, dilation, ceil_mode, layout)
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2

    def term(g, taps, _):
        y = sum(abs(v) ** p for v, _ in taps) ** (1.0 / p)
        if y == 0:
            return []
        return [(f, g * math.copysign(abs(v) ** (p - 1), v) * y ** (1 - p))
                for v, f in taps if v != 0]
    return _spread(x, grad, nd, layout, gen, term)


def _adaptive_windows(x, output_size, layout):
    nd = len(output_size)
    planes, _, spatial = _planes(x, nd, layout)
    for plane in planes:
        for opos in itertools.product(*(range(o) for o in output_size)):
            ranges = [range(*adaptive_bounds(i, n, o))
                      for i, n, o in zip(opos, spatial, output_size)]
            yield [(plane[_flat(pos, spatial)], _flat(pos, spatial))
                   for pos in itertools.product(*ranges)], 0


def adaptive_avg_pool_backward(grad, input_shape, output_size, layout="NCHW"):
    x = np.zeros(input_shape)
    return _spread(x, grad, len(output_size), layout,
                   _adaptive_windows(x, output_size, layout),
                   lambda g, taps, _: [(f, g / len(taps)) for _, f in taps])


def adaptive_max_pool_backward(grad, x, output_size, layout="NCHW"):
    return _spread(x, grad, len(output_size), layout, _adaptive_windows(x, output_size, layout),
                   _argmax_term(-math.inf))


def global_avg_pool_backward(grad, input_shape, spatial_dims=2, layout="NCHW"):
    return adaptive_avg_pool_backward(grad, input_shape, (1,) * spatial_dims, layout)


def global_max_pool_backward(grad, x, spatial_dims=2, layout="NCHW"):
    return adaptive_max_pool_backward(grad, x, (1,) * spatial_dims, layout)
