"""Pieces shared by the Dask graphs of the forward ops (:mod:`gpupool.interop.dask`) and of
the backward ops (:mod:`gpupool.interop.dask_backward`): input checks, the chunk type's array
module, output cuts along a dim, the chunks meeting a range and their reassembly, the slice
and per-block padding of a run of sliding windows, and the period of adaptive windows."""
from __future__ import annotations

import importlib
import itertools
import math
import operator

import dask.array as da
import numpy as np
from dask.task_spec import List, Task, TaskRef

from ..arrays import is_cupy_array


def array_module(a):
    """The array module of ``a``: NumPy, or CuPy for a CuPy array."""
    return importlib.import_module("cupy") if is_cupy_array(a) else np


def check_input(func: str, a, name: str = "x") -> None:
    """``a`` (the argument ``name``) is a Dask array of known chunk sizes and unmasked chunks."""
    if not isinstance(a, da.Array):
        raise TypeError(f"gpupool.{func}: {name} is a {type(a).__module__}.{type(a).__name__}; "
                        f"of the Dask collections only dask.array.Array is supported")
    if isinstance(a._meta, np.ma.MaskedArray):
        raise TypeError(f"gpupool.{func}: {name} has numpy.ma.MaskedArray chunks; their masks "
                        f"would be ignored: pass da.ma.filled({name}, value) instead")
    if any(math.isnan(c) for dim in a.chunks for c in dim):
        raise ValueError(f"gpupool.{func}: {name} has unknown chunk sizes; call "
                         f"{name}.compute_chunk_sizes() first")


def cuts(chunks, out: int, first_output) -> list[tuple[int, int]]:
    """Output blocks ``[o0, o1)`` of ``[0, out)`` along a dim: the outputs
    ``first_output(c)`` onwards belong to the chunk of ``chunks`` starting at ``c``; empty
    blocks are dropped."""
    starts = np.cumsum((0,) + tuple(chunks))[1:-1]
    points = sorted({0, out} | {min(out, max(0, first_output(int(c)))) for c in starts})
    return [(o0, o1) for o0, o1 in zip(points, points[1:]) if o1 > o0]


def window_slice(o0: int, o1: int, size: int, out: int, stride: int, span: int,
                 pads: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(lo, hi, pad_begin, pad_end)``: the input slice ``[lo, hi)`` holding windows
    ``[o0, o1)`` of a sliding window pooling along a dim (``span``: a window's dilated
    extent, ``pads``: the whole input's), and the padding that makes the pooling of that
    slice give exactly those windows. The run ending at the last window keeps the global end
    pad (its slice runs to the input's end, so ceil mode and the padded divisor follow the
    whole-array rules, shifted by whole strides); any other run's padding ends exactly where
    its last window does."""
    begin, end = pads
    first = o0 * stride - begin
    lo = max(0, first)
    if o1 == out:
        return lo, size, lo - first, end
    last_end = (o1 - 1) * stride - begin + span
    hi = min(size, last_end)
    return lo, hi, lo - first, last_end - hi


def adaptive_period(size: int, out: int) -> tuple[int, int]:
    """``(inputs, windows)`` of one period of the adaptive windows along a dim of ``size``
    pooled to ``out``: window ``o + windows`` is window ``o`` moved by ``inputs``, so a run of
    whole periods, pooled alone to its own number of windows, has the same windows (summed in
    the same order)."""
    g = math.gcd(size, out)
    return size // g, out // g


def overlaps(starts, lo: int, hi: int) -> list[tuple[int, slice]]:
    """``(chunk, local slice)`` of each chunk (``starts``: the chunks' bounds) meeting
    ``[lo, hi)``; for an empty range one chunk sliced empty (a block function still sees the
    chunk type)."""
    n = len(starts) - 1
    if hi <= lo:
        j = next((j for j in range(n) if starts[j + 1] > lo), n - 1)
        return [(j, slice(0, 0))]
    return [(j, slice(max(lo, starts[j]) - starts[j], min(hi, starts[j + 1]) - starts[j]))
            for j in range(n) if starts[j] < hi and starts[j + 1] > lo]


def assemble(pieces: list, grid: tuple[int, ...]):
    """Concatenate C-ordered ``pieces`` of a ``grid`` of blocks into one array."""
    for axis in reversed(range(len(grid))):
        n = grid[axis]
        if n > 1:
            pieces = [array_module(pieces[i]).concatenate(pieces[i:i + n], axis=axis)
                      for i in range(0, len(pieces), n)]
    return pieces[0]


def region(layer: dict, halo: str, n: int, index: tuple, arr, per_dim) -> List:
    """The pieces of ``arr`` (operand ``n`` of the output block at ``index``) that ``per_dim``
    selects (per dim, ``(chunk, slice)`` pairs from :func:`overlaps`), as task references; a
    piece that is not a whole chunk is cut by a task added to ``layer`` under ``halo``."""
    pieces = []
    for combo in itertools.product(*per_dim):
        chunk = tuple(j for j, _ in combo)
        ref = TaskRef((arr.name,) + chunk)
        if any(sl.stop - sl.start != arr.chunks[a][j] for a, (j, sl) in enumerate(combo)):
            key = (halo, n) + index + chunk
            layer[key] = Task(key, operator.getitem, ref, tuple(sl for _, sl in combo))
            ref = TaskRef(key)
        pieces.append(ref)
    return List(*pieces)
