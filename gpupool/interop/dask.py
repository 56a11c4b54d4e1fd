"""Dask arrays: every op returns a lazy ``dask.array.Array`` equal to the op on the whole
array, for any chunking.

* Arguments are validated eagerly by :mod:`gpupool.spec` on the full shape, with the errors
  of the in-memory op, when the graph is built.
* Plane dims (leading dims, NHWC channels) keep their chunks.
* Along a spatial dim, output ``o`` belongs to the input chunk holding the start of its
  window (clamped into the input). Each output block is computed exactly once, by the
  in-memory op on the input slice that holds all of its windows (halo slices of neighbouring
  chunks are cut by separate tasks), with per-block padding: the begin pad is what the block's
  first window reaches before the slice; the end pad is the global one for the last block
  (so ceil mode and the ``count_include_pad`` divisor follow the whole-array rules) and
  exactly the last window's overhang otherwise. Max indices are converted back to flat
  positions in the whole input plane; a block whose windows miss the input gets the
  empty-window value.
* Adaptive pooling cuts each spatial dim into runs of whole periods of its windows
  ``[floor(i*I/O), ceil((i+1)*I/O))`` (:func:`~gpupool.interop.dask_blocks.adaptive_period`),
  each run in the block of the input chunk holding its start: a block is the in-memory op on
  its run's input slice. Global pooling (and adaptive max pooling to size 1) is a tree
  reduction: the in-memory max of each chunk, then of the chunks' maxima; or float64 sums of
  the exact float64 values (int64 for quantized codes), rounded once.
* No float arithmetic on CuPy chunks runs in CuPy's own kernels, which are compiled with
  ``-ftz=true`` and flush float32 subnormals, other than on float64 values: the blocks run
  gpupool's ops, and conversions go through :func:`gpupool.windows.to_float64` and
  :func:`~gpupool.windows.to_float32`.
* ``max_unpool`` takes ``x`` and ``indices`` as Dask arrays; each output block gathers the
  input blocks whose pooling windows reach it and scatters the indices that land in it.
  Every index must lie in its own window, as ``max_pool`` returns them, or be -1 (a window
  with no valid tap: skipped), checked when computed.
* The backward ops' graphs are in :mod:`gpupool.interop.dask_backward`.
* The chunk type picks the backend: NumPy chunks run on the CPU, CuPy chunks on their GPU;
  the result's ``_meta`` has the chunks' type.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import operator

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import DataNode, Task, TaskRef

from .. import quantized_spec as QS
from .. import spec as S
from .. import windows
from ..arrays import dtype_name, is_cupy_array
from ..cpu.quantized import requantize
from ..op_table import BY_NAME
from . import dask_backward
from .dask_blocks import (adaptive_period, array_module, assemble, check_input, cuts, overlaps,
                          region, window_slice)


def _host(a) -> np.ndarray:
    return a.get() if is_cupy_array(a) else a


# ----------------------------------------------------------------------------- entry points

def _bind(op, func: str, first, args, kwargs) -> dict:
    bound = inspect.signature(op).bind(first, *args, **kwargs)
    bound.apply_defaults()
    params = dict(bound.arguments)
    if params.pop("out", None) is not None:
        raise TypeError(f"gpupool.{func}: out cannot be given with a Dask array input: Dask "
                        f"arrays are immutable; use the returned array")
    return params


def call(op, x, *args, **kwargs):
    """Run the public op ``op`` (working on NumPy/CuPy arrays) lazily on the Dask array ``x``:
    each block of the result is ``op`` on a slice of ``x``."""
    func = op.__name__
    params = _bind(op, func, x, args, kwargs)
    check_input(func, x, next(iter(params)))
    for name in ("x", "indices", "grad_output"):  # native byte order, as in-memory ops give
        a = params.get(name)
        if isinstance(a, da.Array) and not a.dtype.isnative:
            params[name] = a.astype(a.dtype.newbyteorder("="))
    row = BY_NAME[func]
    handlers = dask_backward.HANDLERS if row.is_backward else _HANDLERS
    return handlers[row.family](op, params)


def call_quantized(op, q: QS.QArray, *args, **kwargs) -> QS.QArray:
    """Run the quantized op ``op`` lazily on a :class:`~gpupool.quantized.QArray` whose codes
    are a Dask array; the result's codes are a Dask array, bit-identical to the in-memory op."""
    func = op.__name__
    params = _bind(op, func, q, args, kwargs)
    check_input(f"quantized.{func}", q.data)
    return _QUANTIZED_HANDLERS[BY_NAME[func].family](op, params)


def quantize(op, x, scale, zero_point, dtype) -> QS.QArray:
    """:func:`gpupool.quantized.quantize` (``op``) of a Dask array, block by block (NaN raises
    ``ValueError`` when computed)."""
    check_input("quantized.quantize", x)
    probe = op(np.empty((0,), x.dtype), scale, zero_point, dtype)  # eager validation
    name = dtype_name(probe.dtype)
    codes = x.map_blocks(_quantize_block, op, probe.scale, probe.zero_point, name, dtype=name,
                         meta=meta_from_array(x._meta, x.ndim, name))
    return QS.QArray(codes, probe.scale, probe.zero_point)


def _quantize_block(block, op, scale, zero_point, dtype):
    return op(block, scale, zero_point, dtype).data


# ----------------------------------------------------------------------------- block graphs

@dataclasses.dataclass(frozen=True)
class _Span:
    """One output block along one dim: ``size`` outputs computed from the input range
    ``[lo, hi)`` (none of it when ``hi <= lo``); ``param`` is what the block function needs
    about this dim."""

    size: int
    lo: int
    hi: int
    param: object = None


def _plane_spans(chunks) -> list[_Span]:
    """A plane dim: output blocks are the input chunks."""
    starts = np.cumsum((0,) + tuple(chunks))
    return [_Span(c, int(s), int(s) + c) for s, c in zip(starts, chunks)]


def _window_spans(chunks, size, out, kernel, stride, dilation, pads) -> list[_Span]:
    """A spatial dim of a window pooling: each block's input slice and per-block pads
    (:func:`~gpupool.interop.dask_blocks.window_slice`), param ``(lo, pad_begin, pad_end,
    outputs)``."""
    span = dilation * (kernel - 1) + 1
    spans = []
    for o0, o1 in cuts(chunks, out, lambda c: -(-(c + pads[0]) // stride)):
        lo, hi, pad_begin, pad_end = window_slice(o0, o1, size, out, stride, span, pads)
        spans.append(_Span(o1 - o0, lo, hi, (lo, pad_begin, pad_end, o1 - o0)))
    return spans


def _adaptive_spans(chunks, size, out) -> list[_Span]:
    """A spatial dim of an adaptive pooling: runs of whole periods
    (:func:`~gpupool.interop.dask_blocks.adaptive_period`), each in the block of the input
    chunk holding its start; param ``(lo, windows)``."""
    p_in, p_out = adaptive_period(size, out)
    return [_Span((q1 - q0) * p_out, q0 * p_in, q1 * p_in, (q0 * p_in, (q1 - q0) * p_out))
            for q0, q1 in cuts(chunks, size // p_in, lambda c: -(-c // p_in))]


def _run_block(block_fn, grid, params, extra, *regions):
    return block_fn(*[assemble(pieces, grid) for pieces in regions], params, *extra)


def _block_graph(name: str, block_fn, arrays, spans, metas, *extra):
    """Dask arrays (one per entry of ``metas``) whose block at each position of the grid of
    ``spans`` is ``block_fn(*regions, params, *extra)``: ``regions`` are the input ranges
    ``[lo, hi)`` of ``arrays`` (same chunks), ``params`` the spans' params; with several metas
    ``block_fn`` returns a tuple. One task per output block, plus one per halo piece; ``extra``
    is stored once in the graph."""
    starts = [np.cumsum((0,) + c).tolist() for c in arrays[0].chunks]
    halo, shared = name + "-halo", name + "-args"
    layer = {shared: DataNode(shared, extra)}
    blocks = []
    for index in itertools.product(*(range(len(dim)) for dim in spans)):
        here = [spans[a][i] for a, i in enumerate(index)]
        per_dim = [overlaps(starts[a], b.lo, b.hi) for a, b in enumerate(here)]
        regions = [region(layer, halo, n, index, arr, per_dim) for n, arr in enumerate(arrays)]
        blocks.append((name,) + index)
        layer[blocks[-1]] = Task(blocks[-1], _run_block, block_fn,
                                 tuple(len(p) for p in per_dim), tuple(b.param for b in here),
                                 TaskRef(shared), *regions)
    chunks = tuple(tuple(b.size for b in dim) for dim in spans)
    if len(metas) == 1:
        graph = HighLevelGraph.from_collections(name, layer, dependencies=arrays)
        return da.Array(graph, name, chunks, meta=metas[0])
    results = []
    for n, meta in enumerate(metas):
        part = f"{name}-{n}"
        parts = {(part,) + key[1:]: Task((part,) + key[1:], operator.getitem, TaskRef(key), n)
                 for key in blocks}
        graph = HighLevelGraph.from_collections(part, {**layer, **parts}, dependencies=arrays)
        results.append(da.Array(graph, part, chunks, meta=meta))
    return tuple(results)


def _spatial_spans(x, geom, spatial_spans) -> list[list[_Span]]:
    """Spans of every dim of ``x``: the plane dims' chunks, then ``spatial_spans(a)``."""
    first = len(geom.lead)
    return [spatial_spans(a - first) if first <= a < first + geom.nd else _plane_spans(c)
            for a, c in enumerate(x.chunks)]


# ----------------------------------------------------------------------------- window ops


def _global_indices(local, shape, offsets, full_shape):
    """Flat positions in a plane of ``full_shape`` of the flat positions ``local`` in a slice
    of ``shape`` starting at ``offsets``; -1 stays -1."""
    xp = array_module(local)
    flat = xp.zeros_like(local)
    for a, (n, offset, full) in enumerate(zip(shape, offsets, full_shape)):
        coord = local // math.prod(shape[a + 1:]) % n + offset
        flat = flat * full + coord
    return xp.where(local < 0, -1, flat)


def _pool_slice(x, op, options, quant):
    """The in-memory op on ``x`` (the codes of a QArray with ``quant``'s scale and zero point,
    when given)."""
    if quant is None:
        return op(x, **options)
    scale, zero_point = quant
    return op(QS.QArray(x, scale, zero_point), **options).data


def _window_block(x, params, op, first, nd, options, quant, fills, full_spatial):
    """One output block of a window pooling from its input slice ``x``."""
    spatial = params[first:first + nd]
    shape = list(x.shape)
    shape[first:first + nd] = [outputs for *_, outputs in spatial]
    if x.size == 0:  # every window misses the input (or no planes)
        xp = array_module(x)
        values = xp.full(shape, fills[0], x.dtype)
        return values if len(fills) == 1 else (values, xp.full(shape, -1, np.int64))
    pads = tuple((begin, end) for _, begin, end, _ in spatial)
    result = _pool_slice(x, op, dict(options, padding=pads), quant)
    if len(fills) == 1:
        return result
    values, local = result
    offsets = [lo for lo, *_ in spatial]
    return values, _global_indices(local, x.shape[first:first + nd], offsets, full_spatial)


def _window_graph(op, x, spec: S.WindowSpec, options: dict, quant, fill):
    geom = spec.geom
    spans = _spatial_spans(x, geom, lambda a: _window_spans(
        x.chunks[len(geom.lead) + a], geom.spatial[a], spec.out_spatial[a], spec.kernel[a],
        spec.stride[a], spec.dilation[a], spec.pads[a]))
    options = dict(options, kernel_size=spec.kernel, stride=spec.stride,
                   ceil_mode=spec.ceil_mode, layout=geom.layout)
    if quant is None or spec.op == "max":
        options["dilation"] = spec.dilation
    metas = [meta_from_array(x._meta, x.ndim, x.dtype)]
    fills = (fill,)
    if spec.return_indices:
        metas.append(meta_from_array(x._meta, x.ndim, np.int64))
        fills = (fill, -1)
    name = f"{'quantized-' if quant else ''}{op.__name__}-" + tokenize(x, spec, options, quant)
    return _block_graph(name, _window_block, [x], spans, metas, op, len(geom.lead), geom.nd,
                        options, quant, fills, geom.spatial)


def _window(op, params: dict):
    func, x = op.__name__, params["x"]
    row = BY_NAME[func]
    options = {name: params[name] for name in row.options}
    spec = S.window_spec(func, row.reduction, x.shape, dtype_name(x.dtype),
                         params["kernel_size"], params["stride"], params["padding"],
                         params["dilation"], params["ceil_mode"], params["layout"], **options)
    fill = windows.lowest(x.dtype) if spec.op == "max" else 0
    return _window_graph(op, x, spec, options, None, fill)


# ----------------------------------------------------------------------------- global and adaptive

def _spatial_axes(geom) -> tuple[int, ...]:
    return tuple(range(len(geom.lead), len(geom.lead) + geom.nd))


def _without_empty_chunks(x):
    """``x`` with its zero-size chunks merged away (Dask's reductions mishandle them)."""
    if not any(0 in dim for dim in x.chunks if len(dim) > 1):
        return x
    return x.rechunk(tuple(tuple(c for c in dim if c) or (0,) for dim in x.chunks))


def _whole_planes(reduce, block, axis=None, keepdims=None):
    """``reduce`` (an in-memory op over whole planes that keeps their dims) of a chunk, or of
    chunks' results put together: a step of :func:`dask.array.reduction`."""
    return reduce(block)


def _exact_float64(block):
    return windows.to_float64(block, array_module(block))


def _rounded(block, dtype):
    """Float64 ``block`` as ``dtype``, rounded once (float32 subnormals kept); bfloat16 through
    float32, as the in-memory ops round."""
    xp = array_module(block)
    if np.dtype(dtype).name in ("float32", "bfloat16"):
        block = windows.to_float32(block, xp)
    return windows.narrowed(block, dtype, xp)


def _global_reduce(x, spec: S.AdaptiveSpec, reduce):
    """Tree reduction over the spatial dims: the max of ``reduce`` (the in-memory global max,
    keeping the spatial dims) of each chunk, then of their maxima; or the float64 sum over
    the plane size, in the input dtype."""
    axes = _spatial_axes(spec.geom)
    x = _without_empty_chunks(x)
    if spec.op == "max":
        step = functools.partial(_whole_planes, reduce)
        return da.reduction(x, step, step, axis=axes, keepdims=True, dtype=x.dtype,
                            combine=step, concatenate=True,
                            meta=meta_from_array(x._meta, x.ndim, x.dtype))
    wide = x.map_blocks(_exact_float64, dtype=np.float64,
                        meta=meta_from_array(x._meta, x.ndim, np.float64))
    mean = da.sum(wide, axis=axes, keepdims=True) / math.prod(spec.geom.spatial)
    return mean.map_blocks(_rounded, x.dtype, dtype=x.dtype,
                           meta=meta_from_array(x._meta, x.ndim, x.dtype))


def _global(op, params: dict):
    func, x = op.__name__, params["x"]
    spec = S.global_spec(func, BY_NAME[func].reduction, x.shape,
                         dtype_name(x.dtype), params["spatial_dims"], params["layout"])
    return _global_reduce(x, spec, functools.partial(op, spatial_dims=spec.geom.nd,
                                                     layout=spec.geom.layout))


def _adaptive_block(x, params, op, first, nd, options, quant, full_spatial):
    """One output block of an adaptive pooling: the in-memory op on the input slice of a run
    of whole periods, pooled to the run's windows."""
    spatial = params[first:first + nd]
    result = _pool_slice(x, op, dict(options, output_size=tuple(n for _, n in spatial)), quant)
    if not options.get("return_indices"):
        return result
    values, local = result
    return values, _global_indices(local, x.shape[first:first + nd], [lo for lo, _ in spatial],
                                   full_spatial)


def _adaptive_graph(op, x, spec: S.AdaptiveSpec, options: dict, quant):
    geom = spec.geom
    first = len(geom.lead)
    spans = _spatial_spans(x, geom, lambda a: _adaptive_spans(
        x.chunks[first + a], geom.spatial[a], spec.out_spatial[a]))
    metas = [meta_from_array(x._meta, x.ndim, x.dtype)]
    if spec.return_indices:
        metas.append(meta_from_array(x._meta, x.ndim, np.int64))
    name = f"{'quantized-' if quant else ''}{op.__name__}-" + tokenize(x, spec, options, quant)
    return _block_graph(name, _adaptive_block, [x], spans, metas, op, first, geom.nd,
                        dict(options, layout=geom.layout), quant, geom.spatial)


def _adaptive(op, params: dict):
    func, x = op.__name__, params["x"]
    reduction = BY_NAME[func].reduction
    spec = S.adaptive_spec(func, reduction, x.shape, dtype_name(x.dtype), params["output_size"],
                           params["layout"], return_indices=params.get("return_indices", False))
    if spec.is_global and not spec.return_indices:
        return _global_reduce(x, spec, functools.partial(op, output_size=spec.out_spatial,
                                                         layout=spec.geom.layout))
    options = {"return_indices": spec.return_indices} if reduction == "max" else {}
    return _adaptive_graph(op, x, spec, options, None)


# ----------------------------------------------------------------------------- max_unpool

def _unpool_spans(chunks, size, out, kernel, stride, dilation, begin) -> list[_Span]:
    """A spatial dim of max_unpool: output blocks start where the pooled chunks' windows do;
    each gathers the pooled positions whose windows reach it; param ``(start, size)``."""
    span = dilation * (kernel - 1) + 1
    spans = []
    blocks = cuts(chunks, out, lambda c: c * stride - begin)
    for n, (e0, e1) in enumerate(blocks):
        lo = max(0, -(-(e0 + begin - span + 1) // stride))
        hi = min(size, (e1 - 1 + begin) // stride + 1)
        # the first and last blocks also take the positions whose windows reach no output
        # (windows in the padding): their indices are checked too, as the in-memory op does
        lo, hi = (0 if n == 0 else lo), (size if n == len(blocks) - 1 else hi)
        spans.append(_Span(e1 - e0, lo, hi, (e0, e1 - e0)))
    return spans


def _checked_indices(indices, spec, spatial_axes, block_info=None):
    """``indices`` after checking that each lies in the output plane
    (:func:`gpupool.spec.check_unpool_indices`: -1 is skipped) and in the pooling window of
    its position (:func:`gpupool.windows.check_indices_in_windows`)."""
    if indices.size == 0:
        return indices
    S.check_unpool_indices("max_unpool", int(indices.min()), int(indices.max()), spec)
    location = block_info[0]["array-location"]
    windows.check_indices_in_windows("max_unpool", indices, spec.pooling,
                                     array_module(indices),
                                     tuple(location[a][0] for a in spatial_axes))
    return indices


def _unpool_block(values, indices, params, first, nd, full_spatial):
    """One output block of max_unpool: zeros, then the gathered values whose indices land in
    it."""
    spatial = params[first:first + nd]
    shape = list(values.shape)
    shape[first:first + nd] = [n for _, n in spatial]
    xp = array_module(values)
    out = xp.zeros(shape, values.dtype)
    if values.size == 0:
        return out
    flat = indices.astype(np.int64)
    inside = flat >= 0  # -1: a window with no valid tap, writes nothing
    local = []
    for a, ((start, n), full) in enumerate(zip(spatial, full_spatial)):
        coord = flat // math.prod(full_spatial[a + 1:]) % full - start
        inside &= (coord >= 0) & (coord < n)
        local.append(coord)
    where = xp.nonzero(inside)
    out[where[:first] + tuple(c[where] for c in local) + where[first + nd:]] = values[where]
    return out


def _unpool(op, params: dict):
    func, x, indices = op.__name__, params["x"], params["indices"]
    if not isinstance(indices, da.Array):
        raise TypeError(f"gpupool.{func}: indices is a {type(indices).__module__}."
                        f"{type(indices).__name__} but x is a Dask array; pass both as Dask "
                        f"arrays")
    check_input(func, indices)
    spec = S.unpool_spec(func, x.shape, dtype_name(x.dtype), indices.shape,
                         dtype_name(indices.dtype), params["kernel_size"], params["stride"],
                         params["padding"], params["output_size"], params["layout"],
                         dilation=params["dilation"])
    geom, nd = spec.geom, spec.geom.nd
    kernel, stride, dilation, pads = spec.kernel, spec.stride, spec.dilation, spec.pads
    first = len(geom.lead)
    begin = tuple(b for b, _ in pads)
    checked = indices.rechunk(x.chunks).map_blocks(
        _checked_indices, spec, tuple(range(first, first + nd)),
        dtype=indices.dtype, meta=indices._meta)
    spans = _spatial_spans(x, geom, lambda a: _unpool_spans(
        x.chunks[first + a], geom.spatial[a], spec.out_spatial[a], kernel[a], stride[a],
        dilation[a], begin[a]))
    name = f"{func}-" + tokenize(x, indices, spec, pads, stride)
    return _block_graph(name, _unpool_block, [x, checked], spans,
                        [meta_from_array(x._meta, x.ndim, x.dtype)], first, nd,
                        spec.out_spatial)


#: the graph builders of the forward ops, by family (:mod:`gpupool.op_table`)
_HANDLERS = {"window": _window, "global": _global, "adaptive": _adaptive, "unpool": _unpool}


# ----------------------------------------------------------------------------- quantized

def _qwindow(op, params: dict) -> QS.QArray:
    func, q = op.__name__, params["q"]
    data = q.data
    dtype = dtype_name(data.dtype)
    if BY_NAME[func].reduction == "max":
        spec = QS.window_spec(func, "max", data.shape, dtype, params["kernel_size"],
                              params["stride"], params["padding"], params["dilation"],
                              params["ceil_mode"], params["layout"])
        options, out_scale, zp_out = {}, q.scale, q.zero_point
        fill = np.iinfo(data.dtype).min
    else:
        spec = QS.window_spec(func, "avg", data.shape, dtype, params["kernel_size"],
                              params["stride"], params["padding"], 1, params["ceil_mode"],
                              params["layout"], params["count_include_pad"])
        _, out_scale, zp_out, rounding = QS.out_params(func, q, params["out_scale"],
                                                       params["out_zero_point"],
                                                       params["rounding"])
        options = {"count_include_pad": spec.count_include_pad, "out_scale": out_scale,
                   "out_zero_point": zp_out, "rounding": rounding}
        fill = zp_out  # an empty window gives the output zero point
    codes = _window_graph(op, data, spec, options, (q.scale, q.zero_point), fill)
    return QS.QArray(codes, out_scale, zp_out)


def _requantize_sums(sums, plan, zp_counts, rows, dtype):
    """Codes of ``dtype`` for the integer sums of codes ``sums``, through the in-memory op's
    exact requantization (on the host: the pooled accumulators are small)."""
    acc = _host(sums).astype(np.int64) - zp_counts
    out = np.empty(acc.shape, dtype)
    requantize(acc, rows, plan, out)
    return array_module(sums).asarray(out)


def _qaverage(op, params: dict, spec: S.AdaptiveSpec) -> QS.QArray:
    func, q = op.__name__, params["q"]
    data = q.data
    dtype, out_scale, zp_out, rounding = QS.out_params(func, q, params["out_scale"],
                                                       params["out_zero_point"],
                                                       params["rounding"])
    if not spec.is_global:
        options = {"out_scale": out_scale, "out_zero_point": zp_out, "rounding": rounding}
        return QS.QArray(_adaptive_graph(op, data, spec, options, (q.scale, q.zero_point)),
                         out_scale, zp_out)
    plan = QS.avg_plan(spec, dtype, q.scale, q.zero_point, out_scale, zp_out, rounding)
    trailing = (None,) * (spec.geom.layout == "NHWC")
    sums = da.sum(_without_empty_chunks(data), axis=_spatial_axes(spec.geom), dtype=np.int64,
                  keepdims=True)
    rows, counts = plan.rows_and_counts()
    zp_counts = counts.astype(np.int64)[(Ellipsis,) + trailing] * q.zero_point
    codes = sums.map_blocks(_requantize_sums, plan, zp_counts,
                            rows[(Ellipsis,) + trailing], data.dtype, dtype=data.dtype,
                            meta=meta_from_array(data._meta, data.ndim, data.dtype))
    return QS.QArray(codes, out_scale, zp_out)


def _qglobal(op, params: dict) -> QS.QArray:
    func, data = op.__name__, params["q"].data
    return _qaverage(op, params, QS.global_spec(func, data.shape, dtype_name(data.dtype),
                                                params["spatial_dims"], params["layout"]))


def _qadaptive(op, params: dict) -> QS.QArray:
    func, data = op.__name__, params["q"].data
    return _qaverage(op, params, QS.adaptive_spec(func, data.shape, dtype_name(data.dtype),
                                                  params["output_size"], params["layout"]))


#: the graph builders of the quantized ops, by the family of the float op of the same name
_QUANTIZED_HANDLERS = {"window": _qwindow, "global": _qglobal, "adaptive": _qadaptive}
