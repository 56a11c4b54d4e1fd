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
as rules 1-2 tile a forward's outputs (:func:`gather_view`); a global average's backward is a
broadcast over groups of whole planes instead (:func:`_broadcast`). Max unpooling gathers the
same way, over the positions of the pooling its indices come from, where windows do not overlap
(:func:`unpool_gathers`), else it zero-fills and scatters.

Global pooling (float, and the quantized averages) is a segmented reduction instead: several
tiny planes per warp (a group of ``L`` lanes per plane, e.g. 16 lanes for 7x7), one block per
large plane, and large planes split in chunks with a second pass over the partials when there
are too few planes to fill the GPU. NHWC launches put threads along the channels (contiguous),
with planes being batch rows.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from .. import spec as S
from ..grad_spec import GradSpec
from .launches import H100, DeviceInfo, Launch, Plan

INT32_LIMIT = 2**31 - 1
GRID_YZ_MAX = 65535
BLOCK_THREADS = 256
MIN_BLOCK_THREADS = 64  # a block smaller than two warps wastes the SM's block slots
BLOCK_Z_MAX = 64  # CUDA's limit on blockDim.z
MAX_ROWS = 4  # outputs per thread along rows (several independent loads in flight)
SPECIALISED_K = (2, 3)  # window sizes compiled as template constants (H and W equal)
ROW_TILE = 4  # outputs per thread of a row tile, along W (the kernels' GP_ROW_TILE)
#: (KH, KW, SW) of the row tiles compiled in: window rows and columns and W stride (KH 1: a
#: 1-D pooling), dilation 1.
ROW_TILE_WINDOWS = ((2, 2, 2), (3, 3, 1), (3, 3, 2), (3, 5, 2), (5, 5, 2), (1, 3, 2),
                    (1, 3, 3), (1, 4, 2), (1, 4, 4), (1, 5, 4))
ROW_TILE_DTYPES = ("float16", "bfloat16", "float32")
LANE_WIDTHS = (4, 8, 16, 32)  # lanes per segment of the small-plane global reduction
SMALL_SEGMENT = 1024  # global: planes up to this many elements use lane groups
MIN_CHUNK = 4096  # global: smallest chunk of a split plane (elements)
MAX_CHUNKS = 1024  # global: most chunks per plane (the second pass is one warp per plane)


def _pow2ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _plane_grid(planes: int) -> tuple[int, int]:
    """Grid (y, z) covering ``planes``: y up to 65535, z for the rest."""
    if planes <= GRID_YZ_MAX:
        return planes, 1
    z = _cdiv(planes, GRID_YZ_MAX)
    if z > GRID_YZ_MAX:
        raise ValueError(f"gpupool: {planes} planes exceed the CUDA grid ({GRID_YZ_MAX}**2)")
    return GRID_YZ_MAX, z


def canonical3(values, fill):
    """A per-dim tuple of 1-3 spatial dims padded to (D, H, W) with ``fill``."""
    values = tuple(values)
    return (fill,) * (3 - len(values)) + values


def static_window(spec: S.WindowSpec) -> int:
    """The window size compiled as a template constant (H and W both equal it), else 0."""
    if spec.geom.nd < 2 or spec.geom.nd > 3:
        return 0
    kh, kw = spec.kernel[-2:]
    return kh if kh == kw and kh in SPECIALISED_K else 0


def row_tile(spec, align: int = 16) -> tuple[int, ...] | None:
    """(KH, KW, SW, VEC, LEAD) of the row-tile kernels (``max_pool_rows``, ``avg_pool_rows``:
    ROW_TILE outputs side by side along W per thread) when they cover ``spec``: a 1-D or 2-D
    NCHW average or values-only max of ROW_TILE_DTYPES, dilation 1, a window and W stride of
    ROW_TILE_WINDOWS, 32-bit offsets, planes and output rows within a grid dim; else None.
    Input rows load in packs of VEC elements from LEAD = -(W pad) mod VEC columns before a
    tile's first: 16 bytes, or 8 where 16 do not divide ROW_TILE * SW, if VEC divides the row
    length and ``align`` (the input start's alignment, bytes) holds a pack; else VEC 1. A 2-D
    max takes them only in packs (a load per column: L1-bound in the calibrated model)."""
    g = spec.geom
    if (not isinstance(spec, S.WindowSpec) or spec.op not in ("max", "avg")
            or spec.return_indices or g.layout != "NCHW" or g.nd > 2
            or g.dtype not in ROW_TILE_DTYPES or any(d != 1 for d in spec.dilation)):
        return None
    shape = canonical3(spec.kernel, 1)[1:] + (spec.stride[-1],)
    if (shape not in ROW_TILE_WINDOWS or index_type(spec) != "int"
            or max(g.planes, canonical3(spec.out_spatial, 1)[1]) > GRID_YZ_MAX):
        return None
    item = S.ITEMSIZE[g.dtype]
    vec = 16 // item if ROW_TILE * shape[2] % (16 // item) == 0 else 8 // item
    if vec * item > align or g.spatial[-1] % vec:
        vec = 1
    return None if spec.op == "max" and g.nd > 1 and vec == 1 else (
        shape + (vec, -spec.pads[-1][0] % vec))


def _row_tiles(spec: S.WindowSpec, device: DeviceInfo, shape: tuple[int, int, int],
               words: list) -> Plan:
    """The row-tile launch (thread_map.cuh outputs_rows): ROW_TILE outputs along W per thread,
    TX threads along W, TY output rows and TZ planes per block (TZ > 1 when a plane's tiles
    leave a block under MIN_BLOCK_THREADS), plane groups on grid z; TY halves while the grid
    leaves the GPU short of a wave of blocks (down to MIN_BLOCK_THREADS)."""
    kh, kw, sw, vec, lead = shape
    planes = spec.geom.planes
    oh, ow = canonical3(spec.out_spatial, 1)[1:]
    tx, ty = block_shape(_cdiv(ow, ROW_TILE), BLOCK_THREADS, oh)
    tz = 1
    if tx * ty < MIN_BLOCK_THREADS and planes > 1:
        tz = min(BLOCK_Z_MAX, BLOCK_THREADS // (tx * ty), _pow2ceil(planes))
        words.append(f"packing: {tz} planes per block (a plane has {_cdiv(ow, ROW_TILE) * oh} "
                     f"row tiles; blocks of {tx * ty} threads would leave the SMs' block slots "
                     f"idle)")

    def blocks(ty_):
        return _cdiv(ow, tx * ROW_TILE) * _cdiv(oh, ty_) * _cdiv(planes, tz)

    while ty > 1 and tx * ty * tz > MIN_BLOCK_THREADS and (
            blocks(ty) < _fill_target(device, tx * ty * tz)):
        ty //= 2
    grid = (_cdiv(ow, tx * ROW_TILE), _cdiv(oh, ty), _cdiv(planes, tz))
    kernel = {"max": "max_pool_rows", "avg": "avg_pool_rows"}[spec.op]
    packs = f" (aligned packs of {vec * S.ITEMSIZE[spec.geom.dtype]} bytes)" if vec > 1 else ""
    words.append(f"row tiles: {ROW_TILE} outputs per thread side by side along W, their "
                 f"{kh}x{kw} windows of W stride {sw} compiled in; each input row of a tile "
                 f"loaded once into registers{packs} and shared by the windows that overlap")
    words.append(f"split: {planes} planes ({grid[2]} groups on grid z) x {grid[1]} groups of "
                 f"{ty} output rows x {grid[0]} chunks of {tx * ROW_TILE} outputs along W")
    return Plan("window", "int", (Launch(kernel, grid, (tx, ty, tz), 1, tuple(sorted(zip(
        ("kh", "kw", "sw", "vec", "lead"), shape)))),), tuple(words))


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


def index_type(spec) -> str:
    """``int`` when every offset the kernels form fits in int32, else ``long long``."""
    g = spec.geom
    x_elems = math.prod(g.shape)
    out_elems = math.prod(spec.out_shape)
    span = max(x_elems, out_elems)
    if isinstance(spec, S.WindowSpec):
        span += max(o * s + (k - 1) * d + pb + pe + 1 for o, s, k, d, (pb, pe) in zip(
            spec.out_spatial, spec.stride, spec.kernel, spec.dilation, spec.pads))
    elif isinstance(spec, S.AdaptiveSpec):
        span = max([span] + [(o + 1) * i + o for i, o in zip(g.spatial, spec.out_spatial)])
        # global reductions: a chunk end may reach twice a plane's length, and lane-group
        # thread ids reach 32 per plane
        span = max(span, 2 * x_elems, 32 * g.planes + BLOCK_THREADS)
    else:  # unpool: the grid-stride loop may step past n once
        span += BLOCK_THREADS * 32 * 1024
    return "int" if span <= INT32_LIMIT else "long long"


def block_shape(inner: int, inner_cap: int, outer: int) -> tuple[int, int]:
    """(TX, TY) of a 2-D block: TX threads along the contiguous dim of ``inner`` elements (a
    power of two up to ``inner_cap``), TY along ``outer``, at most BLOCK_THREADS in all."""
    tx = min(_pow2ceil(inner), inner_cap)
    return tx, max(1, min(BLOCK_THREADS // tx, _pow2ceil(outer)))


def _fill_target(device: DeviceInfo, threads: int) -> int:
    """Blocks for one full wave of resident blocks on every SM."""
    return device.sm_count * max(1, device.max_threads_per_sm // threads)


def _footprint(spec, rows_per_block: int, tx: int, itemsize: int, out_dhw, in_dhw) -> int:
    """Input bytes one block of a window launch reads (its rows plus halo; NCHW)."""
    kd, kh, kw = canonical3(spec.kernel, 1)
    sd, sh, sw = canonical3(spec.stride, 1)
    dd, dh, dw = canonical3(spec.dilation, 1)
    od, oh, ow = out_dhw
    idd, ih, iw = in_dhw
    cols = min(iw, (tx - 1) * sw + (kw - 1) * dw + 1)
    if rows_per_block <= oh:
        in_rows = min(ih, (rows_per_block - 1) * sh + (kh - 1) * dh + 1) * kd
    else:
        slices = _cdiv(rows_per_block, oh)
        in_rows = min(idd, (slices - 1) * sd + (kd - 1) * dd + 1) * ih
    return in_rows * cols * itemsize


def _tiled(spec, device: DeviceInfo, family: str, kernel: str, words: list,
           itype: str | None = None, max_rows: int = MAX_ROWS,
           extra: tuple[tuple[str, int], ...] = ()) -> Plan:
    """Window and adaptive launches (rules 1-3 of the module docstring); ``itype``: the index
    type, when not ``spec``'s own (:func:`index_type`); ``max_rows``: the most outputs per
    thread; ``extra``: the launch's kernel-specific integers."""
    g = spec.geom
    nd = g.nd
    itemsize = S.ITEMSIZE[g.dtype]
    out_dhw = canonical3(spec.out_spatial, 1)
    in_dhw = canonical3(g.spatial, 1)
    od, oh, ow = out_dhw
    nhwc = g.layout == "NHWC"
    if nhwc:
        planes, units = g.batch, od * oh * ow
        tx, ty = block_shape(g.channels, 64, units)
        n_x = _cdiv(g.channels, tx)
        unit_name = "output positions"
    else:
        planes, units = g.planes, od * oh
        tx, ty = block_shape(ow, 128, units)
        n_x = _cdiv(ow, tx)
        unit_name = "output rows"
    # planes packed along block z when a plane's outputs leave the block under two warps: as
    # many as make 256 threads, fewer while that leaves too few blocks, never under 64 threads
    tz = 1
    if tx * ty < MIN_BLOCK_THREADS and planes > 1:
        tz = min(BLOCK_Z_MAX, BLOCK_THREADS // (tx * ty), _pow2ceil(planes))
        while (tx * ty * (tz // 2) >= MIN_BLOCK_THREADS
               and _cdiv(planes, tz) * n_x < _fill_target(device, tx * ty * tz)):
            tz //= 2
    groups = _cdiv(planes, tz)
    target = _fill_target(device, tx * ty * tz)
    overlap = any((k - 1) * d + 1 > s for k, d, s in zip(
        getattr(spec, "kernel", ()), getattr(spec, "dilation", ()), getattr(spec, "stride", ())))
    padded = any(pb or pe for pb, pe in getattr(spec, "pads", ()))

    def fits(rows, ty_):
        if nhwc or family != "window" or not overlap:  # no input is read twice
            return True
        resident = max(1, device.max_threads_per_sm // (tx * ty_ * tz))
        budget = device.smem_per_sm // resident
        return tz * _footprint(spec, rows * ty_, tx, itemsize, out_dhw, in_dhw) <= budget

    if tz > 1:
        plane_outputs = units * (g.channels if nhwc else ow)
        words.append(f"packing: {tz} planes per block (a plane has {plane_outputs} outputs; "
                     f"blocks of {tx * ty} threads would leave the SMs' block slots idle)")
    # NHWC window launches with several output rows cut positions in tiles of `rows` rows
    # (d, h) by TY columns (thread_map.cuh outputs_nhwc)
    tiles = family == "window" and nhwc and od * oh > 1

    def nchunks(rows_, ty_):
        return _cdiv(od * oh, rows_) * _cdiv(ow, ty_) if tiles else _cdiv(units, ty_ * rows_)

    rows_whole = od * oh if tiles and ow <= ty else _cdiv(units, ty)
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
            cut = f"{chunks} chunks of {per_block} {unit_name} (D cut first: {per_block // oh} D slices each)"
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
        fp = tz * _footprint(spec, rows * ty, tx, itemsize, out_dhw, in_dhw)
        words.append(f"block input footprint: {fp} bytes (fits the block's on-chip share)")
    grid_yz = _plane_grid(groups)
    grid = (n_x * chunks, grid_yz[0], grid_yz[1])
    if grid[0] > INT32_LIMIT:
        raise ValueError(f"gpupool: grid x {grid[0]} exceeds the CUDA limit")
    if nhwc:
        words.append("threads along channels")
    elif n_x == 1:
        words.append("threads along the block's outputs in row-major order (a row fits one "
                     "block width, so a warp may cross into the next row)")
    else:
        words.append("threads along W")
    return Plan(family, itype or index_type(spec),
                (Launch(kernel, grid, (tx, ty, tz), rows, extra),), tuple(words))


def _global(spec: S.AdaptiveSpec, device: DeviceInfo, words: list) -> Plan:
    g = spec.geom
    seglen = math.prod(g.spatial)
    launches = []
    if g.layout == "NHWC":
        nb, chans = g.batch, g.channels
        tx, ty = block_shape(chans, 64, seglen)
        n_x = _cdiv(chans, tx)
        target = _fill_target(device, tx * ty)
        nchunks = 1
        if nb * n_x < target and seglen > ty * 8:
            nchunks = min(MAX_CHUNKS, _cdiv(target, nb * n_x), _cdiv(seglen, ty * 8))
        chunklen = _cdiv(seglen, nchunks)
        nchunks = _cdiv(seglen, chunklen)
        yz = _plane_grid(nb * nchunks)
        launches.append(Launch("global_channels", (n_x, yz[0], yz[1]), (tx, ty, 1), 1,
                               (("chunklen", chunklen), ("nchunks", nchunks),
                                ("partial", int(nchunks > 1)))))
        words.append(f"segmented reduction over channels-last planes: {nb} batch rows x "
                     f"{chans} channels, threads along channels, {ty} threads per channel "
                     f"over {seglen} positions")
        if nchunks > 1:
            ty2 = max(1, min(BLOCK_THREADS // tx, _pow2ceil(nchunks)))
            yz2 = _plane_grid(nb)
            launches.append(Launch("global_channels", (n_x, yz2[0], yz2[1]), (tx, ty2, 1), 1,
                                   (("chunklen", nchunks), ("nchunks", 1), ("partial", 0),
                                    ("second", 1))))
            words.append(f"split: positions cut in {nchunks} chunks of {chunklen} (too few "
                         f"batch rows to fill the GPU); a second pass reduces the partials")
    else:
        planes = g.planes
        if seglen <= SMALL_SEGMENT:
            # about 4 loads per lane: 2-byte elements load in fours (segmented.cuh)
            per_lane = 16 if S.ITEMSIZE.get(g.dtype) == 2 else 4
            lanes = min(32, max(4, _pow2ceil(_cdiv(seglen, per_lane))))
            per_block = BLOCK_THREADS // lanes
            launches.append(Launch("global_lanes", (_cdiv(planes, per_block), 1, 1),
                                   (BLOCK_THREADS, 1, 1), 1, (("lanes", lanes),)))
            words.append(f"segmented reduction: {planes} planes of {seglen} elements, "
                         f"{lanes} lanes per plane ({32 // lanes} planes per warp), warp "
                         f"shuffles")
        else:
            target = _fill_target(device, BLOCK_THREADS)
            nchunks = 1
            if planes < target:
                nchunks = min(MAX_CHUNKS, _cdiv(target, planes), max(1, seglen // MIN_CHUNK))
            chunklen = _cdiv(seglen, nchunks)
            nchunks = _cdiv(seglen, chunklen)
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
                launches.append(Launch("global_lanes", (_cdiv(planes, BLOCK_THREADS // 32), 1, 1),
                                       (BLOCK_THREADS, 1, 1), 1,
                                       (("lanes", 32), ("second", 1), ("seglen", nchunks))))
    return Plan("global", index_type(spec), tuple(launches), tuple(words))


def unpool_gathers(spec: S.UnpoolSpec) -> bool:
    """Whether an unpool has a gather plan: windows that do not overlap, 1-3 spatial dims."""
    return spec.disjoint and spec.geom.nd <= 3


def _unpool(spec: S.UnpoolSpec, device: DeviceInfo, words: list, scatter: bool) -> Plan:
    """The gather where it applies (one thread per output position, as the backward's
    gather of the pooling; it needs every index in its own window, which the host checks),
    else zero fill + scatter."""
    if unpool_gathers(spec) and not scatter:
        pool = spec.pooling
        words.append("gather: windows do not overlap; each output position takes the value of "
                     "the window that covers it if that window's index names it, else 0 (no "
                     "fill; indices outside their windows fall back to the scatter)")
        return dataclasses.replace(_tiled(_Positions(pool.geom, pool.geom.spatial), device,
                                          "gather", "max_unpool_gather", words,
                                          index_type(pool), NAMED_GROUP), family="unpool")
    n = math.prod(spec.geom.shape)
    blocks = max(1, min(_cdiv(n, BLOCK_THREADS), device.sm_count * 32))
    words.append(f"scatter: zero-fill the output, then {n} elements in a grid-stride loop "
                 f"over {blocks} blocks of {BLOCK_THREADS}")
    return Plan("unpool", index_type(spec),
                (Launch("max_unpool", (blocks, 1, 1), (BLOCK_THREADS, 1, 1)),), tuple(words))


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
        return _broadcast(view, device, words)
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


def _broadcast(view: S.AdaptiveSpec, device: DeviceInfo, words: list) -> Plan:
    """A global average's backward: every element of a plane takes the plane's gradient over
    its size. Packs of 16 bytes per thread over groups of whole planes (contiguous): a group of
    up to BLOCK_Z_MAX small planes fills about one block, a large plane is cut in block-sized
    chunks on grid x; groups go on grid y (and z)."""
    g = view.geom
    nhwc = g.layout == "NHWC"
    planes = g.batch if nhwc else g.planes
    length = math.prod(g.spatial) * (g.channels if nhwc else 1)
    vec = 16 // S.ITEMSIZE[g.dtype]
    per_block = BLOCK_THREADS * vec
    group = max(1, min(planes, BLOCK_Z_MAX, per_block // max(1, length)))
    if group > vec and length % vec:
        group -= group % vec  # each group starts on a 16-byte boundary
    packs = _cdiv(group * length + vec - 1, vec)
    tx = min(BLOCK_THREADS, max(32, _cdiv(packs, 32) * 32))
    y, z = _plane_grid(_cdiv(planes, group))
    words.append(f"broadcast: each of {planes} planes of {length} elements takes its gradient "
                 f"over {math.prod(g.spatial)}; {group} planes per group, threads store "
                 f"{vec} elements each (16 bytes)")
    return Plan("gather", index_type(view), (Launch("avg_global_backward", (_cdiv(packs, tx),
                                                    y, z), (tx, 1, 1), 1,
                                                    (("group", group),)),), tuple(words))


@functools.lru_cache(maxsize=1024)
def plan(spec, device: DeviceInfo | None = None, *, scatter: bool = False, align: int = 16) -> Plan:
    """The launch plan of ``spec`` (a WindowSpec, AdaptiveSpec, UnpoolSpec or GradSpec) on
    ``device`` (default: an H100's properties); ``scatter``: an UnpoolSpec's zero fill +
    scatter even where its gather applies; ``align``: the input start's alignment in bytes."""
    device = device or H100
    g = spec.forward.geom if isinstance(spec, GradSpec) else spec.geom
    words = [f"device: {device.name} ({device.sm_count} SMs)",
             f"input: {g.shape} {g.dtype} {g.layout}, {g.planes} planes of {g.spatial}"
             + (" (channels innermost)" if g.layout == "NHWC" else "")]
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
        p = _tiled(spec, device, "adaptive", kernel, words)
    else:
        shape = row_tile(spec, align)
        if shape:
            p = _row_tiles(spec, device, shape, words)
        else:
            kernel = {"max": "max_pool_indices" if spec.return_indices else "max_pool",
                      "avg": "avg_pool", "lp": "lp_pool"}[spec.op]
            k = static_window(spec)
            if k:
                words.append(f"window {k}x{k} compiled as a template constant")
            p = _tiled(spec, device, "window", kernel, words)
    launches = (_gather_traffic if isinstance(spec, GradSpec) else _with_traffic)(
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


def _with_traffic(spec, launches: tuple[Launch, ...]) -> tuple[Launch, ...]:
    """The launches with the bytes each must move: its input once, its output once (with
    int64 indices; unpool reads its indices, and its scatter zero-fills the output first)."""
    g = spec.geom
    item = S.ITEMSIZE[g.dtype]
    x_bytes = math.prod(g.shape) * item
    out_elems = math.prod(spec.out_shape)
    if isinstance(spec, S.UnpoolSpec):  # the scatter also zero-fills, the gather does not
        (la,) = launches
        n = math.prod(g.shape)
        fills = la.kernel == "max_unpool"
        return (dataclasses.replace(
            la, outputs=n if fills else out_elems, bytes_written=(1 + fills) * out_elems * item,
            bytes_read=x_bytes + S.ITEMSIZE[spec.index_dtype] * n),)
    indices = 8 * out_elems if getattr(spec, "return_indices", False) else 0
    if len(launches) == 1:
        return (dataclasses.replace(launches[0], outputs=out_elems, bytes_read=x_bytes,
                                    bytes_written=out_elems * item + indices),)
    first, second = launches
    part = 4 if (spec.op == "avg" and S.ACC_DTYPES.get(g.dtype) == "float32") else item
    partials = out_elems * first.get("nchunks")
    return (dataclasses.replace(first, outputs=partials, bytes_read=x_bytes,
                                bytes_written=partials * part),
            dataclasses.replace(second, outputs=out_elems, bytes_read=partials * part,
                                bytes_written=out_elems * item))


def _gather_traffic(spec: GradSpec, launches: tuple[Launch, ...]) -> tuple[Launch, ...]:
    """The gather with the bytes it must move: the output gradient (and a max's int64
    indices; Lp's input and forward output) read once, the input gradient written once."""
    fwd = spec.forward
    item = S.ITEMSIZE[fwd.geom.dtype]
    x_elems = math.prod(fwd.geom.shape)
    out_elems = math.prod(fwd.out_shape)
    read = out_elems * item + {"max": 8 * out_elems, "lp": (x_elems + out_elems) * item}.get(
        spec.op, 0)
    (la,) = launches
    return (dataclasses.replace(la, outputs=x_elems, bytes_read=read,
                                bytes_written=x_elems * item),)
