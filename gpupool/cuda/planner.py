"""Launch planner of the CUDA backend: from a spec and the device's properties, how to cut the
work into blocks. Pure Python (no NumPy, no CuPy), so it is unit-tested on the CPU and
:func:`gpupool.explain` (``explain.py``) works on a machine without a GPU.

Rules, in order (the tiling plan this project started from):

1. Split across the ``N*C`` planes only: planes go on the grid's y (and z past 65535), and one
   column of blocks covers a whole plane, each thread computing several outputs.
2. If that cannot fill the GPU (too few planes, or planes too large for one block column),
   split the plane's output rows too, the outermost dim first (D, then H: the rows are
   ``(d, h)`` pairs in row-major order, so chunks cut D before H), keeping W whole (a warp
   spans consecutive ``w``; W is cut only into block-wide pieces when wider than a block).
3. Chunks are *aligned* when windows do not overlap and there is no padding (each chunk reads
   only its own input rows); otherwise each chunk reads a *halo* of input rows shared with its
   neighbour. The chunk's input footprint must fit the block's share of the SM's on-chip memory
   (L1/shared, where the overlapping rows are re-read from); while it does not, the chunk shrinks.

The backward ops (a :class:`~gpupool.grad_spec.GradSpec`) gather: one thread per input element
sums the gradients of the windows that cover it, so the launch tiles the input's positions
as rules 1-2 tile a forward's outputs (:func:`gather_view`), except the gathers that need no
walk over covering windows (``tiled_gathers.py``: windows that tile the input, a max's of
stride 2 and an average's of stride 1 or 2 by cells of rows, a global average's broadcast).
Max unpooling gathers the same way, over the positions of the pooling its indices come from,
where windows do not overlap (:func:`unpool_gathers`), else it zero-fills and scatters.

Global pooling (float, and the quantized averages) is a segmented reduction: several tiny
planes per warp (``L`` lanes per plane), a block per large plane, split in chunks with a second
pass over the partials when too few planes fill the GPU. NHWC launches put threads along the
channels (contiguous), with planes being batch rows.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from .. import spec as S
from ..grad_spec import GradSpec
from .grid import (BLOCK_THREADS, BLOCK_Z_MAX, INT32_LIMIT, MIN_BLOCK_THREADS,
                   block_shape, canonical3, cdiv, fill_target, footprint, index_type,
                   plane_grid, pow2ceil)
from .launches import H100, DeviceInfo, Launch, Plan, gather_traffic, with_traffic
from .row_tiles import plan_row_tiles, row_tile
from .tiled_gathers import (cells, channel_tiles, plan_broadcast, plan_cells, plan_channel_tiles,
                            plan_tiles, tiles)

MAX_ROWS = 4  # outputs per thread along rows (several independent loads in flight)
SPECIALISED_K = (2, 3)  # window sizes compiled as template constants (H and W equal)
LANE_WIDTHS = (4, 8, 16, 32)  # lanes per segment of the small-plane global reduction
MIN_LANES = 4  # adaptive windows this many columns wide and wider: a group of lanes per output
LANE_ROWS = (1, 4, 8, 16)  # rows a lane of those groups loads at a time (lane_rows)
SMALL_SEGMENT = 1024  # global: planes up to this many elements use lane groups
MIN_CHUNK = 4096  # global: smallest chunk of a split plane (elements)
MAX_CHUNKS = 1024  # global: most chunks per plane (the second pass is one warp per plane)


def static_window(spec: S.WindowSpec) -> int:
    """The window size compiled as a template constant (H and W both equal it), else 0."""
    if spec.geom.nd < 2 or spec.geom.nd > 3:
        return 0
    kh, kw = spec.kernel[-2:]
    return kh if kh == kw and kh in SPECIALISED_K else 0


#: Positions per thread of the max unpooling gather with 32-bit offsets, all their windows'
#: loads in one batch (the kernels' GP_NAMED_GROUP; half as many with 64-bit offsets).
NAMED_GROUP = 8
#: Positions along W of one slot of the max gradients' walk when its windows are compiled in
#: (the kernels' GP_MAX_PACK).
MAX_PACK = 4
#: Slots per thread that a window backward kernel takes together, by the compiled-in bound of
#: :func:`gather_covers` (the kernels' GP_GATHER_GROUP_C).
GATHER_GROUP = {0: 4, 1: 8, 2: 4, 3: 2}


def gather_covers(spec: S.WindowSpec, itype: str, op: str) -> int:
    """The bound the window backward kernels compile in on the windows of a slot along H and
    along W; 0 (counted at run time) where none applies, and with 64-bit offsets (``itype`` not
    int). For the sums a slot is a position, covered by ceil(k / (s / gcd(s, d))) windows per
    dim: the bound is that when it is 1 or 2 for both. For the max gradients (``op`` "max") a
    slot is a pack of MAX_PACK positions along W: 3, when at most 3 windows cover a position
    along H and at most 3 reach any position of a pack along W ((MAX_PACK - 1 + (k - 1) * d)
    // s + 1)."""
    if itype != "int":
        return 0
    (kh, kw), (sh, sw), (dh, dw) = (canonical3(v, 1)[1:] for v in (
        spec.kernel, spec.stride, spec.dilation))
    per_position = [-(-k // (s // math.gcd(s, d))) for k, s, d in ((kh, sh, dh), (kw, sw, dw))]
    if op == "max":
        pack = (MAX_PACK - 1 + (kw - 1) * dw) // sw + 1
        return 3 if max(per_position[0], pack) <= 3 else 0
    bound = max(per_position)
    return bound if bound <= 2 else 0


#: The window ops of the channel-pack kernels (``max_pool_packs``: values only;
#: ``avg_pool_packs``), and the bytes of a pack.
CHANNEL_PACK_OPS = ("max", "avg")
PACK_BYTES = 16


def pack_channels(dtype: str) -> int:
    """The channels of ``dtype`` in a pack of PACK_BYTES."""
    return PACK_BYTES // S.ITEMSIZE[dtype]


def channel_pack(spec: S.WindowSpec, align: int = 16) -> int:
    """Channels per thread of the channel-pack kernels (one load of PACK_BYTES per tap, the
    tap's index arithmetic shared by the pack's channels) where they cover ``spec``: an NHWC
    average or values-only max of a float dtype whose channels fill whole packs (C * itemsize
    a multiple of PACK_BYTES) with the input's start on PACK_BYTES (``align``, bytes); else
    0."""
    g = spec.geom
    item = S.ITEMSIZE[g.dtype]
    if (g.layout != "NHWC" or spec.op not in CHANNEL_PACK_OPS or spec.return_indices
            or g.dtype not in S.FLOAT_DTYPES or align % PACK_BYTES
            or g.channels * item % PACK_BYTES):
        return 0
    return pack_channels(g.dtype)


def _tiled(spec, device: DeviceInfo, family: str, kernel: str, words: list,
           itype: str | None = None, max_rows: int = MAX_ROWS,
           extra: tuple[tuple[str, int], ...] = (), pack: int = 1) -> Plan:
    """Window and adaptive launches (rules 1-3 of the module docstring); ``itype``: the index
    type, when not ``spec``'s own (:func:`index_type`); ``max_rows``: the most outputs per
    thread; ``extra``: the launch's kernel-specific integers; ``pack``: the channels of an
    NHWC thread."""
    g = spec.geom
    nd = g.nd
    itemsize = S.ITEMSIZE[g.dtype]
    out_dhw = canonical3(spec.out_spatial, 1)
    in_dhw = canonical3(g.spatial, 1)
    od, oh, ow = out_dhw
    nhwc = g.layout == "NHWC"
    if nhwc:
        planes, units = g.batch, od * oh * ow
        lanes = g.channels // pack
        tx, ty = block_shape(lanes, 64, units)
        if pack > 1 and lanes < tx:  # a lane per pack: no idle lanes in the warps
            tx, ty = lanes, max(1, min(BLOCK_THREADS // lanes, pow2ceil(units)))
        n_x = cdiv(lanes, tx)
        unit_name = "output positions"
    else:
        planes, units = g.planes, od * oh
        tx, ty = block_shape(ow, 128, units)
        n_x = cdiv(ow, tx)
        unit_name = "output rows"
    # planes packed along block z when a plane's outputs leave the block under two warps: as
    # many as make 256 threads, fewer while that leaves too few blocks, never under 64 threads
    tz = 1
    if tx * ty < MIN_BLOCK_THREADS and planes > 1:
        tz = min(BLOCK_Z_MAX, BLOCK_THREADS // (tx * ty), pow2ceil(planes))
        while (tx * ty * (tz // 2) >= MIN_BLOCK_THREADS
               and cdiv(planes, tz) * n_x < fill_target(device, tx * ty * tz)):
            tz //= 2
    groups = cdiv(planes, tz)
    target = fill_target(device, tx * ty * tz)
    overlap = any((k - 1) * d + 1 > s for k, d, s in zip(
        getattr(spec, "kernel", ()), getattr(spec, "dilation", ()), getattr(spec, "stride", ())))
    padded = any(pb or pe for pb, pe in getattr(spec, "pads", ()))

    def fits(rows, ty_):
        if nhwc or family != "window" or not overlap:  # no input is read twice
            return True
        resident = max(1, device.max_threads_per_sm // (tx * ty_ * tz))
        budget = device.smem_per_sm // resident
        return tz * footprint(spec, rows * ty_, tx, itemsize, out_dhw, in_dhw) <= budget

    if tz > 1:
        plane_outputs = units * (g.channels if nhwc else ow)
        words.append(f"packing: {tz} planes per block (a plane has {plane_outputs} outputs; "
                     f"blocks of {tx * ty} threads would leave the SMs' block slots idle)")
    # NHWC window launches with several output rows cut positions in tiles of `rows` rows
    # (d, h) by TY columns (thread_map.cuh outputs_nhwc)
    tiles = family == "window" and nhwc and od * oh > 1

    def nchunks(rows_, ty_):
        return cdiv(od * oh, rows_) * cdiv(ow, ty_) if tiles else cdiv(units, ty_ * rows_)

    rows_whole = od * oh if tiles and ow <= ty else cdiv(units, ty)
    if rows_whole <= max_rows and groups * n_x >= target and fits(rows_whole, ty):
        rows, chunks = rows_whole, 1
        words.append(f"split: across the {planes} planes only (grid y/z); one block column "
                     f"covers a whole plane, {rows} {unit_name.split()[-1]} per thread")
    else:
        rows = 1
        top = min(max_rows, od * oh if tiles else rows_whole)
        for cand in range(top, 0, -1):
            if groups * n_x * nchunks(cand, ty) >= target and fits(cand, ty):
                rows = cand
                break
        while ty > 1 and tx * ty * tz > MIN_BLOCK_THREADS and (
                groups * n_x * nchunks(rows, ty) < target or not fits(rows, ty)):
            ty //= 2
        chunks = nchunks(rows, ty)
        if family != "gather":
            # as few rows per thread as give the same chunks: the chunks' work evens out
            # (the last chunk of a plane is no smaller than the others by a whole row group)
            while rows > 1 and nchunks(rows - 1, ty) == chunks:
                rows -= 1
        per_block = ty * rows
        if tiles:
            cut = (f"{chunks} tiles of {rows} x {ty} {unit_name} (rows (d, h) by columns w, "
                   f"{rows} per thread)")
        elif nhwc:
            cut = f"{chunks} chunks of {per_block} {unit_name} (D, then H, then W order)"
        elif od > 1 and per_block >= oh:
            cut = (f"{chunks} chunks of {per_block} {unit_name} (D cut first: "
                   f"{per_block // oh} D slices each)")
        else:
            dims = "D and H" if od > 1 else ("H" if nd >= 2 else "the single row")
            cut = f"{chunks} chunks of {per_block} {unit_name} (cutting {dims}; W kept whole)"
        why = ("too few planes to fill the GPU" if groups * n_x < target
               else "planes too large for one block column")
        words.append(f"split: {planes} planes (grid y/z) x {cut}: {why}")
        if family == "window" and not nhwc and chunks > 1:
            if overlap or padded:
                kh, dh, sh = canonical3(spec.kernel, 1)[1], canonical3(spec.dilation, 1)[1], \
                    canonical3(spec.stride, 1)[1]
                halo = max(0, (kh - 1) * dh + 1 - sh)
                words.append(f"chunks: with halo ({halo} input rows shared between neighbouring "
                             f"chunks{', padding at the plane edges' if padded else ''})")
            else:
                words.append("chunks: aligned (windows do not overlap and there is no padding)")
    if family == "window" and not nhwc:
        fp = tz * footprint(spec, rows * ty, tx, itemsize, out_dhw, in_dhw)
        words.append(f"block input footprint: {fp} bytes (fits the block's on-chip share)")
    grid_yz = plane_grid(groups)
    grid = (n_x * chunks, grid_yz[0], grid_yz[1])
    if grid[0] > INT32_LIMIT:
        raise ValueError(f"gpupool: grid x {grid[0]} exceeds the CUDA limit")
    if nhwc:
        words.append("threads along channels" + (f", {pack} per thread (a {PACK_BYTES}-byte "
                                                 f"pack per tap)" if pack > 1 else ""))
    elif n_x == 1:
        words.append("threads along the block's outputs in row-major order (a row fits one "
                     "block width, so a warp may cross into the next row)")
    else:
        words.append("threads along W")
    return Plan(family, itype or index_type(spec),
                (Launch(kernel, grid, (tx, ty, tz), rows, extra),), tuple(words))


def adaptive_lanes(spec: S.AdaptiveSpec) -> int:
    """Lanes per output of the adaptive lane-group kernels (``*_lanes``: a max of any dtype, a
    float average; not the quantized average's kernel), 0 where they do not apply: NCHW of
    1 or 2 spatial dims, and a bound on the widest window (ceil(n / m) columns, plus 1 where m
    does not divide n) of MIN_LANES or more; two columns per lane up to that bound, a power of
    two from 2 to 32 (wider windows take several passes)."""
    g = spec.geom
    if (g.layout != "NCHW" or g.nd > 2
            or (spec.op == "avg" and g.dtype not in S.FLOAT_DTYPES)):
        return 0
    widest = _widest(g.spatial[-1], spec.out_spatial[-1])
    return min(32, max(2, pow2ceil(cdiv(widest, 2)))) if widest >= MIN_LANES else 0


def _widest(n: int, m: int) -> int:
    """A bound on the taps of the widest adaptive window of a dim of n pooled to m."""
    return cdiv(n, m) + (1 if n % m else 0)


def lane_rows(spec: S.AdaptiveSpec) -> int:
    """Rows of a column that a lane of the lane-group kernels loads at a time (their R): 1
    for 1-D windows, else the least of LANE_ROWS at or above the tallest window's rows, at
    most the last (a taller window takes several batches). Powers of two: ptxas then issues
    a batch's loads together (with 12 rows it waited between them)."""
    if spec.geom.nd < 2:
        return 1
    tallest = _widest(spec.geom.spatial[-2], spec.out_spatial[-2])
    return next((r for r in LANE_ROWS if r >= tallest), LANE_ROWS[-1])


def _lane_groups(spec: S.AdaptiveSpec, lanes: int, kernel: str, words: list) -> Plan:
    """One output per group of ``lanes`` lanes (adaptive_pool.cu gp::for_lane_groups): lane l
    walks the window columns 2l and 2l + 1, 2l + 2 * lanes, ...; the group combines them with
    shuffles."""
    outputs = math.prod(spec.out_shape)
    per_block = BLOCK_THREADS // lanes
    blocks = cdiv(outputs, per_block)
    if blocks > INT32_LIMIT:
        raise ValueError(f"gpupool: grid x {blocks} exceeds the CUDA limit")
    rows = lane_rows(spec)
    words.append(f"lane groups: {lanes} lanes per output, lane l walking window columns 2l "
                 f"and 2l + 1, 2l + {2 * lanes}, ... ({rows} rows at a time); the group "
                 f"combines them with warp shuffles; {per_block} outputs per block of "
                 f"{BLOCK_THREADS}")
    return Plan("adaptive", index_type(spec),
                (Launch(kernel, (blocks, 1, 1), (lanes, per_block, 1), 1,
                        (("batch_rows", rows),)),), tuple(words))


def _global(spec: S.AdaptiveSpec, device: DeviceInfo, words: list) -> Plan:
    g = spec.geom
    seglen = math.prod(g.spatial)
    launches = []
    if g.layout == "NHWC":
        nb, chans = g.batch, g.channels
        tx, ty = block_shape(chans, 64, seglen)
        n_x = cdiv(chans, tx)
        target = fill_target(device, tx * ty)
        nchunks = 1
        if nb * n_x < target and seglen > ty * 8:
            nchunks = min(MAX_CHUNKS, cdiv(target, nb * n_x), cdiv(seglen, ty * 8))
        chunklen = cdiv(seglen, nchunks)
        nchunks = cdiv(seglen, chunklen)
        yz = plane_grid(nb * nchunks)
        launches.append(Launch("global_channels", (n_x, yz[0], yz[1]), (tx, ty, 1), 1,
                               (("chunklen", chunklen), ("nchunks", nchunks),
                                ("partial", int(nchunks > 1)))))
        words.append(f"segmented reduction over channels-last planes: {nb} batch rows x "
                     f"{chans} channels, threads along channels, {ty} threads per channel "
                     f"over {seglen} positions")
        if nchunks > 1:
            ty2 = max(1, min(BLOCK_THREADS // tx, pow2ceil(nchunks)))
            yz2 = plane_grid(nb)
            launches.append(Launch("global_channels", (n_x, yz2[0], yz2[1]), (tx, ty2, 1), 1,
                                   (("chunklen", nchunks), ("nchunks", 1), ("partial", 0),
                                    ("second", 1))))
            words.append(f"split: positions cut in {nchunks} chunks of {chunklen} (too few "
                         f"batch rows to fill the GPU); a second pass reduces the partials")
    else:
        planes = g.planes
        if seglen <= SMALL_SEGMENT:
            # about 4 loads per lane: 2- and 4-byte elements load in fours (segmented.cuh)
            per_lane = 16 if S.ITEMSIZE.get(g.dtype) in (2, 4) else 4
            lanes = min(32, max(4, pow2ceil(cdiv(seglen, per_lane))))
            per_block = BLOCK_THREADS // lanes
            launches.append(Launch("global_lanes", (cdiv(planes, per_block), 1, 1),
                                   (BLOCK_THREADS, 1, 1), 1, (("lanes", lanes),)))
            words.append(f"segmented reduction: {planes} planes of {seglen} elements, "
                         f"{lanes} lanes per plane ({32 // lanes} planes per warp), warp "
                         f"shuffles")
        else:
            target = fill_target(device, BLOCK_THREADS)
            nchunks = 1
            if planes < target:
                nchunks = min(MAX_CHUNKS, cdiv(target, planes), max(1, seglen // MIN_CHUNK))
            chunklen = cdiv(seglen, nchunks)
            nchunks = cdiv(seglen, chunklen)
            if planes * nchunks > INT32_LIMIT:
                raise ValueError("gpupool: too many planes for one launch")
            launches.append(Launch("global_block", (planes * nchunks, 1, 1),
                                   (BLOCK_THREADS, 1, 1), 1,
                                   (("chunklen", chunklen), ("nchunks", nchunks),
                                    ("partial", int(nchunks > 1)))))
            words.append(f"segmented reduction: {planes} planes of {seglen} elements, one "
                         f"block of {BLOCK_THREADS} threads per plane"
                         + (f" chunk: each plane cut in {nchunks} chunks of {chunklen} (too "
                            f"few planes to fill the GPU), a second pass reduces the partials "
                            f"with 32 lanes per plane" if nchunks > 1 else ""))
            if nchunks > 1:
                launches.append(Launch("global_lanes", (cdiv(planes, BLOCK_THREADS // 32), 1, 1),
                                       (BLOCK_THREADS, 1, 1), 1,
                                       (("lanes", 32), ("second", 1), ("seglen", nchunks))))
    return Plan("global", index_type(spec), tuple(launches), tuple(words))


def unpool_gathers(spec: S.UnpoolSpec) -> bool:
    """Whether an unpool has a gather plan: windows that do not overlap, 1-3 spatial dims."""
    return spec.disjoint and spec.geom.nd <= 3


def unpool_tiles(spec: S.UnpoolSpec) -> bool:
    """Whether an unpool's gather takes tiles (``max_unpool_tiles``, which checks the indices
    as it goes): int64 indices, windows that tile the output
    (:func:`~gpupool.cuda.tiled_gathers.tiles`)."""
    return unpool_gathers(spec) and spec.index_dtype == "int64" and tiles(spec.pooling)


def _unpool(spec: S.UnpoolSpec, device: DeviceInfo, words: list, scatter: bool) -> Plan:
    """The gather where it applies (one thread per output position, as the backward's
    gather of the pooling, or the tiles of :func:`unpool_tiles`, which check the indices as
    they go; the others need every index in its own window, which the host checks first),
    else zero fill + scatter."""
    if unpool_gathers(spec) and not scatter:
        pool = spec.pooling
        if unpool_tiles(spec):
            words.append("gather: each output position takes the value of its window if that "
                         "window's index names it, else 0")
            return plan_tiles(pool, words, "unpool", "max_unpool_tiles", "pooled")
        words.append("gather: windows do not overlap; each output position takes the value of "
                     "the window that covers it if that window's index names it, else 0 (no "
                     "fill; indices outside their windows fall back to the scatter)")
        return dataclasses.replace(_tiled(_Positions(pool.geom, pool.geom.spatial), device,
                                          "gather", "max_unpool_gather", words,
                                          index_type(pool), NAMED_GROUP), family="unpool")
    n = math.prod(spec.geom.shape)
    blocks = max(1, min(cdiv(n, BLOCK_THREADS), device.sm_count * 32))
    words.append(f"scatter: zero-fill the output, then {n} elements in a grid-stride loop "
                 f"over {blocks} blocks of {BLOCK_THREADS}")
    return Plan("unpool", index_type(spec),
                (Launch("max_unpool", (blocks, 1, 1), (BLOCK_THREADS, 1, 1)),), tuple(words))


def index_check_plan(pooling, device: DeviceInfo | None = None) -> Plan:
    """The launch of the check of a max's indices (``max_index_check``) over ``pooling``'s
    outputs (a WindowSpec or AdaptiveSpec): a grid-stride loop over the indices in their order,
    blocks of BLOCK_THREADS, one wave of them at most (built once per spec and device by
    :func:`gpupool.cuda.index_check.check_step`)."""
    device = device or H100
    n = math.prod(pooling.out_shape)
    blocks = max(1, min(cdiv(n, BLOCK_THREADS),
                        device.sm_count * (device.max_threads_per_sm // BLOCK_THREADS)))
    words = [f"check of indices of shape {pooling.out_shape}: each in the input plane, and "
             f"-1 or a tap of its own window; {n} indices in a grid-stride loop over "
             f"{blocks} blocks of {BLOCK_THREADS}"]
    return Plan("index_check", index_type(pooling),
                (Launch("max_index_check", (blocks, 1, 1), (BLOCK_THREADS, 1, 1)),),
                tuple(words))


@functools.lru_cache(maxsize=1024)
def gather_view(spec: GradSpec):
    """The forward spec whose geometry the backward kernels of ``spec`` take: a pooling to
    output size 1 with its planes flattened to one spatial dim (so any number of dims), else
    the forward spec itself."""
    fwd = spec.forward
    if isinstance(fwd, S.AdaptiveSpec) and fwd.whole_plane and fwd.geom.nd > 1:
        g = fwd.geom
        geom = S.Geometry(g.func, g.with_spatial((math.prod(g.spatial),)), g.dtype, g.layout, 1)
        return S.AdaptiveSpec(geom, fwd.op, (1,), global_op=fwd.global_op)
    return fwd


@dataclass(frozen=True)
class _Positions:
    """The input positions of a gather, tiled as :func:`_tiled` tiles a forward's outputs."""

    geom: S.Geometry
    out_spatial: tuple[int, ...]


def _gather(spec: GradSpec, device: DeviceInfo, words: list) -> Plan:
    view = gather_view(spec)
    if view.geom.nd > 3:
        raise ValueError(f"gpupool: the CUDA backward kernels take 1-3 spatial dims, got "
                         f"{view.geom.nd}")
    # each position has one window, whatever order the forward sums in
    if spec.op == "avg" and isinstance(view, S.AdaptiveSpec) and view.whole_plane:
        return plan_broadcast(view, device, words)
    if spec.op == "avg" and isinstance(view, S.WindowSpec) and tiles(view):
        return plan_tiles(view, words)
    if spec.op == "avg" and isinstance(view, S.WindowSpec) and channel_tiles(view):
        return plan_channel_tiles(view, words)
    stride = cells(view, spec.op) if isinstance(view, S.WindowSpec) else 0
    if stride:
        return plan_cells(view, words, spec.op, stride)
    kind = "window" if isinstance(view, S.WindowSpec) else "adaptive"
    words.append(f"gather: one thread per input element sums the gradients of the {kind} "
                 f"windows that cover it (output {view.out_spatial}; no atomics)")
    itype = index_type(view)
    covers = gather_covers(view, itype, spec.op) if kind == "window" else 0
    group = GATHER_GROUP[covers]
    positions = view.geom.spatial
    if covers and spec.op == "max":
        positions = positions[:-1] + (-(-positions[-1] // MAX_PACK),)
        words.append(f"packs of {MAX_PACK} positions along W, each walking the at most 3 x 3 "
                     f"windows that cover any of them (compiled in), {group} packs per thread "
                     f"at once")
    elif covers:
        words.append(f"at most {covers} window{'s' if covers > 1 else ''} cover an input "
                     f"position along H and W (compiled in): {group} positions per thread at "
                     f"once")
    return _tiled(_Positions(view.geom, positions), device, "gather",
                  f"{spec.op}_{kind}_backward", words, itype, group,
                  (("covers", covers),) if kind == "window" else ())


def kernel_spec(spec, align: int = 16):
    """The spec whose kernels run ``spec``: a non-global adaptive pooling of uniform windows
    (:attr:`~gpupool.spec.AdaptiveSpec.uniform_window`) that the row tiles cover in packs runs
    as that window pooling, as the NumPy backend pools it (so the bits agree); a float max
    whose one window per plane covers the plane, as the adaptive max to size 1 (the same taps
    in the same order, each index a position in the plane): values only the global max's
    segmented reduction (the quantized word kernels plan their integer windows as window
    launches); else ``spec``."""
    if isinstance(spec, S.AdaptiveSpec) and not spec.is_global:
        window = spec.uniform_window
        shape = window and row_tile(window, align)
        if shape and shape[-2] > 1:
            return window
    if (isinstance(spec, S.WindowSpec) and spec.op == "max"
            and spec.geom.dtype in S.FLOAT_DTYPES and spec.covers_planes):
        return S.AdaptiveSpec(spec.geom, "max", spec.out_spatial,
                              return_indices=spec.return_indices)
    return spec


@functools.lru_cache(maxsize=1024)
def plan(spec, device: DeviceInfo | None = None, *, scatter: bool = False, align: int = 16) -> Plan:
    """The launch plan of ``spec`` (a WindowSpec, AdaptiveSpec, UnpoolSpec or GradSpec) on
    ``device`` (default: an H100's properties); ``scatter``: an UnpoolSpec's zero fill +
    scatter even where its gather applies; ``align``: the input start's alignment in bytes."""
    device = device or H100
    run = kernel_spec(spec, align)
    g = spec.forward.geom if isinstance(spec, GradSpec) else spec.geom
    words = [f"device: {device.name} ({device.sm_count} SMs)",
             f"input: {g.shape} {g.dtype} {g.layout}, {g.planes} planes of {g.spatial}"
             + (" (channels innermost)" if g.layout == "NHWC" else "")]
    if isinstance(run, S.WindowSpec) and run is not spec:
        words.append(f"adaptive windows all {run.kernel} with stride {run.stride}: pooled as "
                     "that window pooling")
    elif run is not spec:
        words.append("one window covers each whole plane: the adaptive max to size 1")
    spec = run
    if isinstance(spec, GradSpec):
        p = _gather(spec, device, words)
    elif isinstance(spec, S.UnpoolSpec):
        p = _unpool(spec, device, words, scatter)
    elif isinstance(spec, S.AdaptiveSpec) and spec.is_global and not spec.return_indices:
        p = _global(spec, device, words)
    elif g.nd > 3:
        raise ValueError(f"gpupool: the CUDA window kernels take 1-3 spatial dims, got {g.nd}")
    elif isinstance(spec, S.AdaptiveSpec):
        kernel = {"max": "adaptive_max_indices" if spec.return_indices else "adaptive_max",
                  "avg": "adaptive_avg"}[spec.op]
        lanes = adaptive_lanes(spec)
        if lanes:
            p = _lane_groups(spec, lanes, f"{kernel}_lanes", words)
        else:
            p = _tiled(spec, device, "adaptive", kernel, words)
    else:
        shape = row_tile(spec, align)
        if shape:
            p = plan_row_tiles(spec, device, shape, words)
        else:
            kernel = {"max": "max_pool_indices" if spec.return_indices else "max_pool",
                      "avg": "avg_pool", "lp": "lp_pool"}[spec.op]
            pack = channel_pack(spec, align)
            if pack:
                kernel = f"{spec.op}_pool_packs"
            k = static_window(spec)
            if k:
                words.append(f"window {k}x{k} compiled as a template constant")
            p = _tiled(spec, device, "window", kernel, words, pack=max(1, pack))
    launches = (gather_traffic if isinstance(spec, GradSpec) else with_traffic)(
        spec, p.launches)
    words = list(p.words) + [f"index arithmetic: {'32' if p.index_type == 'int' else '64'}-bit"]
    for la in launches:
        floor = la.floor_seconds(device)
        words.append(
            f"launch: {la.kernel} grid {la.grid} block {la.block}: {la.threads} threads, "
            f"{la.outputs / la.threads:.3g} outputs per thread, reads "
            f"{la.bytes_read / 1e6:.3f} MB, writes {la.bytes_written / 1e6:.3f} MB; floor "
            + (f"{floor * 1e6:.2f} us at {device.dram_gbps:.0f} GB/s DRAM" if floor
               else "unknown (DRAM bandwidth unknown)"))
    return Plan(p.family, p.index_type, launches, tuple(words))
