"""Dask graphs of the backward ops (:mod:`gpupool.gradients`): a lazy ``dask.array.Array``
of the input's gradient, equal bit for bit to the in-memory op on the whole arrays, for any
chunking.

* ``grad_output`` and the other array operands (``indices``, ``x``) are Dask arrays (a
  ``TypeError`` otherwise); the arguments are validated by :mod:`gpupool.grad_spec` on the
  full shapes, with the errors of the in-memory op, when the graph is built.
* Each output block is the in-memory backward op on a sub-problem: a run of whole windows
  of the forward pooling (a slice of ``grad_output``, and of ``indices``) over the input
  slice they cover, with the per-block padding of the forward Dask graphs
  (:func:`~gpupool.interop.dask_blocks.window_slice`). The run holds every window that
  meets the block (and one more where the block reaches past its windows), so each input
  position sums all of its windows' gradients in one block, in the in-memory op's order; no
  partial sums are added across blocks. The block is then cut from the sub-problem's input.
* Blocks follow ``x``'s chunks where the op takes ``x`` (``lp_pool_backward``, and
  ``global_max_pool_backward`` after whole planes); otherwise, along a spatial dim, they start
  where the windows of ``grad_output``'s chunks start (for adaptive windows, rounded down to a
  whole period of the window pattern, ``output / gcd(input, output)`` windows, so a block is
  an adaptive pooling of its own slice). Plane dims keep their chunks; the gradient of
  ``global_avg_pool`` comes in whole planes.
* A max's indices are checked when computed (in the input plane, then in the window of their
  position; -1 passes nothing) and converted to positions in the block's slice.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import DataNode, Task, TaskRef

from .. import grad_spec as G
from ..arrays import dtype_name
from ..op_table import BY_NAME
from ..windows import check_indices_in_windows
from .dask_blocks import (adaptive_period, array_module, assemble, check_input, cuts, overlaps,
                          region, window_slice)

@dataclasses.dataclass(frozen=True)
class _Block:
    """One output block along one dim: ``size`` positions, computed from the range
    ``ranges[n]`` of operand ``n`` (in that operand's coordinates); ``param`` is what the
    block function needs about this dim."""

    size: int
    ranges: tuple
    param: object = None


def _operand(func: str, name: str, a):
    if not isinstance(a, da.Array):
        raise TypeError(f"gpupool.{func}: {name} is a {type(a).__module__}."
                        f"{type(a).__name__} but grad_output is a Dask array; pass both as Dask "
                        f"arrays")
    check_input(func, a, name)
    return a


def _plane_blocks(chunks, operands: int) -> list[_Block]:
    """A plane dim: one block per chunk, the same range of every operand."""
    bounds = np.cumsum((0,) + tuple(chunks)).tolist()
    return [_Block(b - a, ((a, b),) * operands) for a, b in zip(bounds, bounds[1:])]


def _run(block_fn, grids, params, extra, *regions):
    return block_fn([assemble(list(p), g) for p, g in zip(regions, grids)], params, *extra)


def _graph(name: str, block_fn, arrays, blocks, meta, *extra):
    """A Dask array whose block at each position of the grid of ``blocks`` (per dim, a list of
    :class:`_Block`) is ``block_fn(regions, params, *extra)``: ``regions[n]`` is the range of
    ``arrays[n]`` the blocks give, ``params`` the blocks' params. One task per output block,
    plus one per piece cut from a chunk; ``extra`` is stored once in the graph."""
    starts = [[np.cumsum((0,) + c).tolist() for c in arr.chunks] for arr in arrays]
    halo, shared = name + "-halo", name + "-args"
    layer = {shared: DataNode(shared, extra)}
    for index in itertools.product(*(range(len(dim)) for dim in blocks)):
        here = [blocks[a][i] for a, i in enumerate(index)]
        regions, grids = [], []
        for n, arr in enumerate(arrays):
            per_dim = [overlaps(starts[n][a], *b.ranges[n]) for a, b in enumerate(here)]
            regions.append(region(layer, halo, n, index, arr, per_dim))
            grids.append(tuple(len(p) for p in per_dim))
        key = (name,) + index
        layer[key] = Task(key, _run, block_fn, tuple(grids), tuple(b.param for b in here),
                          TaskRef(shared), *regions)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=arrays)
    return da.Array(graph, name, tuple(tuple(b.size for b in dim) for dim in blocks), meta=meta)


def _result_meta(grad):
    return meta_from_array(grad._meta, grad.ndim, grad.dtype)


def _local_indices(func: str, indices, spec: G.GradSpec, first_windows, lows, sizes):
    """``indices`` (flat positions in the whole input plane) of the windows from
    ``first_windows`` on (per spatial dim), checked (in the plane, and each in its own
    window), as flat positions in the slice of spatial ``sizes`` starting at ``lows``, which
    holds every tap of those windows; -1 stays -1."""
    xp = array_module(indices)
    flat = indices.astype(np.int64)
    if flat.size:
        G.check_index_range(func, int(flat.min()), int(flat.max()), spec)
        check_indices_in_windows(func, flat, spec.forward, xp, first_windows)
    full = spec.forward.geom.spatial
    local = xp.zeros(flat.shape, np.int64)
    for a, (lo, n) in enumerate(zip(lows, sizes)):
        local = local * n + (flat // math.prod(full[a + 1:]) % full[a] - lo)
    return xp.where(flat >= 0, local, -1)


def _empty(grad, shape):
    """Zeros of ``shape`` for a block with no positions, or None."""
    return array_module(grad).zeros(shape, grad.dtype) if 0 in shape else None


# ----------------------------------------------------------------------------- window ops

def _windows_of(e0, e1, size, out, stride, span, pads):
    """``(o0, o1, lo, hi, pad_begin, pad_end)`` for the output block ``[e0, e1)`` of an input
    dim: the windows ``[o0, o1)`` holding every window that meets the block (all windows
    before it for the first block, after it for the last, so every index is checked), grown
    by one window on a side where their slice ``[lo, hi)`` would not hold the block."""
    begin = pads[0]
    o_lo = 0 if e0 == 0 else max(0, (e0 + begin - span) // stride + 1)  # windows ending <= e0
    o_hi = out if e1 == size else min(out, -(-(e1 + begin) // stride))  # windows starting < e1
    o0, o1 = min(o_lo, o_hi - 1), o_hi
    while True:
        lo, hi, pad_begin, pad_end = window_slice(o0, o1, size, out, stride, span, pads)
        if lo > e0 and o0 > 0:
            o0 -= 1
        elif hi < e1 and o1 < out:
            o1 += 1
        else:
            return o0, o1, lo, hi, pad_begin, pad_end


class _WindowRun(NamedTuple):
    """What a block of a window op's gradient computes along a spatial dim: the windows from
    ``first_window`` on, over the input slice of ``size`` positions from ``lo``, padded by
    ``pad_begin`` and ``pad_end``; the block is ``[start, stop)`` of that slice."""

    first_window: int
    lo: int
    start: int
    stop: int
    pad_begin: int
    pad_end: int
    size: int


def _window_dim(bounds, size, out, stride, span, pads, with_x: bool) -> list[_Block]:
    """The blocks ``bounds`` (``[e0, e1)`` each) of a spatial dim, param a
    :class:`_WindowRun`; ranges: grad_output's (and indices') windows, then x's slice."""
    blocks = []
    for e0, e1 in bounds:
        if e1 <= e0:  # a zero-size chunk of x
            blocks.append(_Block(0, ((0, 0), (e0, e0)), _WindowRun(0, e0, 0, 0, 0, 0, 0)))
            continue
        o0, o1, lo, hi, pad_begin, pad_end = _windows_of(e0, e1, size, out, stride, span, pads)
        ranges = ((o0, o1), (lo, hi)) if with_x else ((o0, o1),) * 2
        blocks.append(_Block(e1 - e0, ranges, _WindowRun(o0, lo, e0 - lo, e1 - lo, pad_begin,
                                                         pad_end, hi - lo)))
    return blocks


def _window_block(regions, params, op, kind, first, nd, options, spec):
    """One output block of a window op's gradient: the op on its windows, then cut."""
    grad = regions[0]
    spatial = params[first:first + nd]
    shape = list(grad.shape)
    shape[first:first + nd] = [run.stop - run.start for run in spatial]
    empty = _empty(grad, shape)
    if empty is not None:
        return empty
    pads = tuple((run.pad_begin, run.pad_end) for run in spatial)
    sub = list(grad.shape)
    sub[first:first + nd] = [run.size for run in spatial]
    if kind == "lp":
        result = op(grad, regions[1], padding=pads, **options)
    elif kind == "max":
        local = _local_indices(op.__name__, regions[1], spec,
                               [run.first_window for run in spatial],
                               [run.lo for run in spatial], sub[first:first + nd])
        result = op(grad, local, tuple(sub), padding=pads, **options)
    else:
        result = op(grad, tuple(sub), padding=pads, **options)
    cut = (slice(None),) * first + tuple(slice(run.start, run.stop) for run in spatial)
    return result if shape == sub else result[cut].copy()


def _window(op, params: dict):
    func, grad = op.__name__, params["grad_output"]
    kind = BY_NAME[func].reduction
    dtype = dtype_name(grad.dtype)
    geometry = (params["kernel_size"], params["stride"], params["padding"],
                params["dilation"], params["ceil_mode"], params["layout"])
    operands = [grad]
    if kind == "max":
        indices = _operand(func, "indices", params["indices"])
        spec = G.window_grad_spec(func, "max", grad.shape, dtype, params["input_shape"],
                                  *geometry, index_shape=indices.shape,
                                  index_dtype=dtype_name(indices.dtype))
        operands.append(indices.rechunk(grad.chunks))
    elif kind == "lp":
        x = _operand(func, "x", params["x"])
        spec = G.window_grad_spec(func, "lp", grad.shape, dtype, x.shape, *geometry,
                                  p=params["p"])
        G.check_operand(func, "x", x.shape, dtype_name(x.dtype), spec)
        operands.append(x)
    else:
        spec = G.window_grad_spec(func, "avg", grad.shape, dtype, params["input_shape"],
                                  *geometry, count_include_pad=params["count_include_pad"],
                                  divisor_override=params["divisor_override"])
    f = spec.forward
    geom, first = f.geom, len(f.geom.lead)
    options = dict(kernel_size=f.kernel, stride=f.stride, dilation=f.dilation,
                   ceil_mode=f.ceil_mode, layout=geom.layout)
    options.update({"lp": {"p": f.p}, "max": {}}.get(kind, {
        "count_include_pad": f.count_include_pad, "divisor_override": f.divisor_override}))
    plane = operands[-1] if kind == "lp" else grad  # the chunks the blocks follow
    blocks = []
    for axis, chunks in enumerate(plane.chunks):
        a = axis - first
        if not 0 <= a < geom.nd:
            blocks.append(_plane_blocks(chunks, len(operands)))
            continue
        size, out, stride = geom.spatial[a], f.out_spatial[a], f.stride[a]
        if kind == "lp":
            bounds = np.cumsum((0,) + chunks).tolist()
            bounds = list(zip(bounds, bounds[1:]))
        else:
            bounds = cuts(chunks, size, lambda c: c * stride - f.pads[a][0])
        blocks.append(_window_dim(bounds, size, out, stride, f.dilation[a] * (f.kernel[a] - 1)
                                  + 1, f.pads[a], kind == "lp"))
    name = f"{func}-" + tokenize(*operands, spec)
    return _graph(name, _window_block, operands, blocks, _result_meta(grad), op, kind, first,
                  geom.nd, options, spec)


# ----------------------------------------------------------------------------- adaptive

class _AdaptiveRun(NamedTuple):
    """What a block of an adaptive op's gradient computes along a spatial dim: ``out``
    windows from ``first_window`` on, exactly the input slice of ``size`` positions from
    ``lo``."""

    first_window: int
    lo: int
    size: int
    out: int


def _adaptive_dim(chunks, size: int, out: int) -> list[_Block]:
    """Blocks of whole periods of the adaptive windows along a dim
    (:func:`~gpupool.interop.dask_blocks.adaptive_period`); param an :class:`_AdaptiveRun`."""
    p_in, p_out = adaptive_period(size, out)
    blocks = []
    for q0, q1 in cuts(chunks, out // p_out, lambda c: c // p_out):
        blocks.append(_Block((q1 - q0) * p_in, ((q0 * p_out, q1 * p_out),) * 2,
                             _AdaptiveRun(q0 * p_out, q0 * p_in, (q1 - q0) * p_in,
                                          (q1 - q0) * p_out)))
    return blocks


def _adaptive_block(regions, params, op, kind, first, nd, layout, spec):
    grad = regions[0]
    spatial = params[first:first + nd]
    shape = list(grad.shape)
    shape[first:first + nd] = [run.size for run in spatial]
    empty = _empty(grad, shape)
    if empty is not None:
        return empty
    output_size = tuple(run.out for run in spatial)
    if kind == "max":
        local = _local_indices(op.__name__, regions[1], spec,
                               [run.first_window for run in spatial],
                               [run.lo for run in spatial], shape[first:first + nd])
        return op(grad, local, tuple(shape), output_size, layout=layout)
    return op(grad, tuple(shape), output_size, layout=layout)


def _adaptive(op, params: dict):
    func, grad = op.__name__, params["grad_output"]
    kind = BY_NAME[func].reduction
    dtype = dtype_name(grad.dtype)
    operands = [grad]
    if kind == "max":
        indices = _operand(func, "indices", params["indices"])
        spec = G.adaptive_grad_spec(func, "max", grad.shape, dtype, params["input_shape"],
                                    params["output_size"], params["layout"],
                                    index_shape=indices.shape,
                                    index_dtype=dtype_name(indices.dtype))
        operands.append(indices.rechunk(grad.chunks))
    else:
        spec = G.adaptive_grad_spec(func, "avg", grad.shape, dtype, params["input_shape"],
                                    params["output_size"], params["layout"])
    f = spec.forward
    first = len(f.geom.lead)
    blocks = [_adaptive_dim(chunks, f.geom.spatial[axis - first], f.out_spatial[axis - first])
              if 0 <= axis - first < f.geom.nd else _plane_blocks(chunks, len(operands))
              for axis, chunks in enumerate(grad.chunks)]
    name = f"{func}-" + tokenize(*operands, spec)
    return _graph(name, _adaptive_block, operands, blocks, _result_meta(grad), op, kind, first,
                  f.geom.nd, f.geom.layout, spec)


# ----------------------------------------------------------------------------- global

def _global_block(regions, params, op, kind, nd, layout, spatial):
    """Whole planes of a global pooling's gradient (``spatial``: axis -> size)."""
    grad = regions[0]
    shape = tuple(spatial.get(axis, n) for axis, n in enumerate(grad.shape))
    empty = _empty(grad, shape)
    if empty is not None:
        return empty
    if kind == "max":
        return op(grad, regions[1], spatial_dims=nd, layout=layout)
    return op(grad, shape, spatial_dims=nd, layout=layout)


def _global(op, params: dict):
    """Whole planes, chunked along the plane dims as ``grad_output`` (the max: as ``x``, whose
    chunks the result then takes)."""
    func, grad = op.__name__, params["grad_output"]
    kind = BY_NAME[func].reduction
    dtype = dtype_name(grad.dtype)
    operands = [grad]
    if kind == "max":
        x = _operand(func, "x", params["x"])
        spec = G.global_grad_spec(func, "max", grad.shape, dtype, x.shape,
                                  params["spatial_dims"], params["layout"],
                                  index_shape=grad.shape, index_dtype="int64")
        G.check_operand(func, "x", x.shape, dtype_name(x.dtype), spec)
        operands.append(x)
    else:
        spec = G.global_grad_spec(func, "avg", grad.shape, dtype, params["input_shape"],
                                  params["spatial_dims"], params["layout"])
    geom = spec.forward.geom
    first = len(geom.lead)
    spatial = {first + a: n for a, n in enumerate(geom.spatial)}
    blocks = [[_Block(spatial[axis], ((0, 1), (0, spatial[axis])))] if axis in spatial
              else _plane_blocks(chunks, len(operands))
              for axis, chunks in enumerate(operands[-1].chunks)]
    name = f"{func}-" + tokenize(*operands, spec)
    result = _graph(name, _global_block, operands, blocks, _result_meta(grad), op, kind, geom.nd,
                    geom.layout, spatial)
    return result.rechunk(operands[1].chunks) if kind == "max" else result


#: the graph builders of the backward ops, by family (:mod:`gpupool.op_table`)
HANDLERS = {"window": _window, "adaptive": _adaptive, "global": _global}
