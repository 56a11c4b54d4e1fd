"""Launch steps: a prepared kernel launch (:class:`Step`) with its grid, block and scalar
arguments, the memo of each family's step lists per (spec, device) (:func:`launch_cache`), and
running them on CuPy's current stream. Nothing synchronises and nothing is copied to the host,
but in :func:`on_host`, where the kernels do not reach.

* A warm call only checks contiguity (:func:`contiguous`: the kernels assume C-contiguous
  input; NCHW planes of ``prod(spatial)``, NHWC rows of ``prod(spatial) * C``), allocates
  scratch when a two-pass reduction needs it, and launches (:func:`launch`).
* :func:`geo_args` and :func:`global_passes` are the scalars and passes the window, adaptive
  and global kernels of every family (float, backward, quantized) share.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import cupy
import numpy as np

from . import planner
from ..spec import ACC_DTYPES, WindowSpec


@functools.lru_cache(maxsize=None)
def device_info(device_id: int) -> planner.DeviceInfo:
    p = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return planner.DeviceInfo(
        name=name, sm_count=int(p["multiProcessorCount"]),
        max_threads_per_block=int(p["maxThreadsPerBlock"]),
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
        smem_per_block=int(p.get("sharedMemPerBlockOptin", p["sharedMemPerBlock"])),
        smem_per_sm=int(p.get("sharedMemPerMultiprocessor", p["sharedMemPerBlock"])),
        l2_bytes=int(p.get("l2CacheSize", 0)),
        # double data rate: 2 transfers per clock (kHz) of the bus width (bits)
        dram_gbps=2 * p.get("memoryClockRate", 0) * 1e3 * p.get("memoryBusWidth", 0) / 8 / 1e9)


def itype_scalar(itype: str):
    """The NumPy scalar type of an index type (``int`` or ``long long``)."""
    return np.int32 if itype == "int" else np.int64


def geo_args(spec, it, windowed: bool) -> tuple:
    """Scalars of GP_GEO_PARAMS but the last (rows): planes, chans, in D/H/W, out D/H/W,
    then kernel, stride, pad begin and dilation (zeros for adaptive) for a window or adaptive
    spec."""
    g = spec.geom
    nhwc = g.layout == "NHWC"
    planes = g.batch if nhwc else g.planes
    idd, ih, iw = planner.canonical3(g.spatial, 1)
    od, oh, ow = planner.canonical3(spec.out_spatial, 1)
    sizes = tuple(it(v) for v in (planes, g.channels if nhwc else 1, idd, ih, iw, od, oh, ow))
    if windowed:
        small = (planner.canonical3(spec.kernel, 1) + planner.canonical3(spec.stride, 1)
                 + planner.canonical3(tuple(pb for pb, _ in spec.pads), 0)
                 + planner.canonical3(spec.dilation, 1))
    else:
        small = (0,) * 12
    return sizes + tuple(np.int32(v) for v in small)


def reduction_args(spec: WindowSpec) -> tuple:
    """The scalars a window kernel takes after the geometry for its reduction: an average's pad
    ends (D, H, W), count_include_pad and divisor_override (0: none); Lp's p in the
    accumulator dtype; none for max."""
    if spec.op == "avg":
        ends = planner.canonical3(tuple(e for _, e in spec.pads), 0)
        return tuple(np.int32(v) for v in ends) + (
            np.int32(spec.count_include_pad), np.int32(spec.divisor_override or 0))
    if spec.op == "lp":
        return (np.dtype(ACC_DTYPES[spec.geom.dtype]).type(spec.p),)
    return ()


class GlobalPass(NamedTuple):
    """One launch of a global plan: ``second`` when it reduces the first's partials; ``io``
    the (input, output) array keys ("x", "partial", "out"); ``tin``, ``tout`` their dtypes;
    ``sizes`` the scalars after the two arrays (lanes ``nseg, seglen``; block ``nseg, seglen,
    nchunks, chunklen``; channels ``nbatch, seglen, chans, nchunks, chunklen``); ``lanes``
    those of a ``global_lanes`` launch, else None."""

    launch: planner.Launch
    second: bool
    io: tuple[str, str]
    tin: str
    tout: str
    sizes: tuple
    lanes: int | None


def global_passes(spec, pl: planner.Plan, it, partial: str) -> list[GlobalPass]:
    """The passes of a global plan over ``spec``'s input (dtype ``spec.geom.dtype``): one
    straight to the output, or a first to partials of dtype ``partial`` and a second from
    them. ``it``: the index scalar type."""
    g = spec.geom
    seglen = math.prod(g.spatial)
    first = pl.launches[0]
    lanes = [la.get("lanes") if la.kernel == "global_lanes" else None for la in pl.launches]
    if first.kernel == "global_lanes":
        sizes = (it(g.planes), it(seglen))
    else:
        chunks = (it(first.get("nchunks")), it(first.get("chunklen")))
        sizes = ((it(g.planes), it(seglen)) if first.kernel == "global_block"
                 else (it(g.batch), it(seglen), it(g.channels))) + chunks
    if len(pl.launches) == 1:
        return [GlobalPass(first, False, ("x", "out"), g.dtype, g.dtype, sizes, lanes[0])]
    second = pl.launches[1]
    nchunks = it(first.get("nchunks"))
    sizes2 = ((it(g.planes), nchunks) if second.kernel == "global_lanes"
              else (it(g.batch), nchunks, it(g.channels), it(1), nchunks))
    return [GlobalPass(first, False, ("x", "partial"), g.dtype, partial, sizes, lanes[0]),
            GlobalPass(second, True, ("partial", "out"), partial, g.dtype, sizes2, lanes[1])]


class Step:
    """One prepared launch: kernel, grid, block, and the argument tuple with the arrays
    named by ``io`` ("x", "out", "indices", "partial") put in front of ``scalars``."""

    __slots__ = ("fn", "grid", "block", "io", "scalars", "_pick")

    def __init__(self, fn, grid, block, io, scalars):
        self.fn, self.grid, self.block, self.io, self.scalars = fn, grid, block, io, scalars
        self._pick = operator.itemgetter(*io)  # two or more names: a tuple

    def __call__(self, arrays: dict) -> None:
        self.fn(self.grid, self.block, self._pick(arrays) + self.scalars)


_LAUNCH_CACHES: list = []


def launch_cache(build):
    """Memoize a builder of launch lists (``functools.lru_cache``); :func:`clear_launches`
    forgets every such list at once (the float ops' here, the quantized ops')."""
    cached = functools.lru_cache(maxsize=1024)(build)
    _LAUNCH_CACHES.append(cached)
    return cached


def clear_launches() -> None:
    """Forget every prepared launch list: later calls plan and ask for their kernels again."""
    for cached in _LAUNCH_CACHES:
        cached.cache_clear()


def contiguous(a):
    """``a``, or a C-contiguous copy of it (on the current stream)."""
    return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)


def launch(steps, scratch, arrays: dict) -> None:
    """Run prepared ``steps`` on ``arrays`` (named as their ``io``), with a fresh array of
    partials where ``scratch`` gives its (size, dtype)."""
    if scratch is not None:
        arrays["partial"] = cupy.empty(scratch[0], dtype=scratch[1])
    for step in steps:
        step(arrays)


def alignment(a) -> int:
    """The bytes ``a``'s start is aligned to, up to 16 (the widest load of a thread)."""
    return math.gcd(a.data.ptr, 16)


def on_host(entry, x, spec, out, /, *rest, **operands) -> None:
    """``entry`` of the NumPy backend, through a host round trip (it synchronises), where the
    kernels do not reach (more than 3 spatial dims): ``entry(x, spec, out, *rest,
    **operands)`` on host copies. ``out`` and the CuPy arrays in ``rest`` (a max's indices)
    are written, so copied back to the device; ``operands`` are only read; other values pass
    as they are (a requantization plan)."""
    def to_host(a):
        return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else a
    written = [(a, np.empty(a.shape, dtype=a.dtype)) for a in (out, *rest)
               if isinstance(a, cupy.ndarray)]
    host = dict((id(a), h) for a, h in written)
    entry(to_host(x), spec, *(host.get(id(a), a) for a in (out, *rest)),
          **{k: to_host(v) for k, v in operands.items()})
    for device, copy in written:
        device.set(copy)
