"""Row tiles (the ``*_rows`` kernels, walk.cuh ``RowTaps``): which window poolings they cover
and their launch. A thread computes ROW_TILE outputs side by side along W, loading each input
row of their windows once into registers, in aligned packs where the input allows them.
Pure Python, like the planner that calls it."""
from __future__ import annotations

import math

from .. import spec as S
from .grid import (BLOCK_THREADS, BLOCK_Z_MAX, GRID_YZ_MAX, MIN_BLOCK_THREADS, block_shape,
                   canonical3, cdiv, fill_target, index_type, pow2ceil)
from .launches import DeviceInfo, Launch, Plan

ROW_TILE = 4  # outputs per thread of a row tile, along W (the kernels' GP_ROW_TILE)
#: (KH, KW, SW, DW) of the row tiles compiled in: window rows and columns, W stride and W
#: dilation (KH 1: a 1-D pooling); D and H dilation 1.
ROW_TILE_WINDOWS = ((2, 2, 2, 1), (3, 3, 1, 1), (3, 3, 2, 1), (3, 5, 2, 1), (5, 5, 2, 1),
                    (1, 3, 2, 1), (1, 3, 3, 1), (1, 4, 2, 1), (1, 4, 4, 1), (1, 5, 4, 1),
                    (1, 5, 2, 2))
ROW_TILE_DTYPES = ("float16", "bfloat16", "float32")
#: the launch parameters of a row-tile kernel, its template parameters after the dtype
ROW_TILE_PARAMS = ("kh", "kw", "sw", "dw", "vec", "lead")
MAX_TX = 64  # rows of more tiles than this take blocks of a power-of-two width
WARP = 32

def depth_slices(spec) -> int:
    """The D slices a 3-D window pooling with one D tap per window at its own slice (D window
    1, D stride 1, no D padding) pools as 2-D planes: the input's D size (1 for 1-D and 2-D);
    0 for a 3-D pooling whose windows span or skip slices, and for one with indices (an index
    counts the slices of its plane before the winner's)."""
    if spec.geom.nd < 3:
        return 1
    return spec.geom.spatial[0] if (spec.kernel[0], spec.stride[0], spec.pads[0]) == (
        1, 1, (0, 0)) and not spec.return_indices else 0


def row_tile(spec, align: int = 16) -> tuple[int, ...] | None:
    """(KH, KW, SW, DW, VEC, LEAD) of the row-tile kernels (``max_pool_rows``,
    ``max_pool_indices_rows``, ``avg_pool_rows``: ROW_TILE outputs side by side along W per
    thread) when they cover ``spec``: an NCHW average or max (values, or values and indices)
    of ROW_TILE_DTYPES (3-D: its :func:`depth_slices` as 2-D planes, else the ``*_depth_rows``
    kernels, the D taps at run time, H windows over 1), an (H, W) window, W stride and W
    dilation of ROW_TILE_WINDOWS (D and H dilation 1), 32-bit offsets, plane (slice) groups and
    output rows within a grid dim; else None.
    Input rows load in packs of VEC elements from LEAD = -(W pad) mod VEC columns before a
    tile's first: 16 bytes, or 8 where 16 do not divide ROW_TILE * SW, if VEC divides the row
    length and ``align`` (the input start's alignment, bytes) holds a pack; else in shifted
    packs of 16 bytes (LEAD -1: each row moved into place at run time) where the input's end
    lies on one too; else VEC 1, a load per column. A 2-D or 3-D max and the ``*_depth_rows``
    kernels take them only in packs (a load per column: L1-bound in the calibrated model)."""
    g = spec.geom
    if (not isinstance(spec, S.WindowSpec) or spec.op not in ("max", "avg")
            or g.layout != "NCHW"
            or g.dtype not in ROW_TILE_DTYPES
            or any(d != 1 for d in spec.dilation[:-1])):
        return None
    shape = canonical3(spec.kernel, 1)[1:] + (spec.stride[-1], spec.dilation[-1])
    if (shape not in ROW_TILE_WINDOWS or index_type(spec) != "int"
            or (shape[0] == 1 and not depth_slices(spec))):
        return None
    planes, rows = _grid(spec)
    if max(cdiv(planes, min(_block(spec, e)[2] for e in (True, False))), rows) > GRID_YZ_MAX:
        return None
    item = S.ITEMSIZE[g.dtype]
    vec = 16 // item if ROW_TILE * shape[2] % (16 // item) == 0 else 8 // item
    lead = -spec.pads[-1][0] % vec
    per_column = spec.op == "max" and g.nd > 1 or not depth_slices(spec)
    if g.spatial[-1] % vec:
        # rows off the packs: shifted packs where the input ends on one, but for windows that
        # may load a column at a time where the shift's selects cost more than the loads they
        # save (modeled): of W stride 1 (a narrow span), and 1-D ones of 2-byte elements
        shift_pays = per_column or shape[2] > 1 and (shape[0] > 1 or item == 4)
        ends_on_pack = g.planes * math.prod(g.spatial) * item % 16 == 0
        vec, lead = (16 // item, -1) if shift_pays and ends_on_pack else (1, 0)
    if vec * item > align:
        vec, lead = 1, 0
    return None if per_column and vec == 1 else shape + (vec, lead)


def _grid(spec: S.WindowSpec) -> tuple[int, int]:
    """(planes, output rows) of a row-tile launch: a 3-D max's slices as planes
    (:func:`depth_slices`), else its planes with the (d, h) pairs as rows."""
    od, oh, _ = canonical3(spec.out_spatial, 1)
    slices = depth_slices(spec)
    return (spec.geom.planes * slices, oh) if slices else (spec.geom.planes, od * oh)


def _block(spec: S.WindowSpec, exact: bool, tile: int = ROW_TILE) -> tuple[int, int, int]:
    """(TX, TY, TZ) of a row-tile block before TY halves to fill the GPU. ``exact``: TX one
    thread per tile of a row up to MAX_TX tiles (so that a warp's lanes run on into the next
    row rather than idle past the row's end) and TY the number of output rows, of those that
    make at most BLOCK_THREADS threads, that runs a plane's rows in the fewest warps (ties: the
    larger); else TX and TY powers of two. TZ > 1 planes when a plane's tiles leave a block
    under MIN_BLOCK_THREADS. ``tile``: the outputs of a thread along W."""
    planes, rows = _grid(spec)
    tiles = cdiv(spec.out_spatial[-1], tile)
    if exact and tiles <= MAX_TX:
        tx = tiles

        def warps(ty_):
            whole, last = divmod(rows, ty_)
            return whole * cdiv(tx * ty_, WARP) + cdiv(tx * last, WARP)

        ty = min(range(1, min(BLOCK_THREADS // tx, rows) + 1), key=lambda t: (warps(t), -t))
    else:
        tx, ty = block_shape(tiles, BLOCK_THREADS, rows)
    tz = 1
    if tx * ty < MIN_BLOCK_THREADS and planes > 1:
        tz = min(BLOCK_Z_MAX, BLOCK_THREADS // (tx * ty),
                 max(pow2ceil(planes), cdiv(MIN_BLOCK_THREADS, tx * ty)))
    return tx, ty, tz


def _filled(spec: S.WindowSpec, device: DeviceInfo, block: tuple[int, int, int],
            tile: int = ROW_TILE):
    """``block`` with TY halved while the grid leaves the GPU short of a wave of blocks (down to
    MIN_BLOCK_THREADS), and whether the grid then makes a wave."""
    tx, ty, tz = block
    planes, rows = _grid(spec)

    def blocks(ty_):
        return cdiv(spec.out_spatial[-1], tx * tile) * cdiv(rows, ty_) * cdiv(planes, tz)

    while ty > 1 and tx * (ty // 2) * tz >= MIN_BLOCK_THREADS and (
            blocks(ty) < fill_target(device, tx * ty * tz)):
        ty //= 2
    return (tx, ty, tz), blocks(ty) >= fill_target(device, tx * ty * tz)


def plan_row_tiles(spec: S.WindowSpec, device: DeviceInfo, shape: tuple[int, ...],
                   words: list) -> Plan:
    """The row-tile launch (thread_map.cuh outputs_rows): ROW_TILE outputs along W per thread,
    blocks of :func:`_block` (exact where the grid then makes a wave of blocks, and values
    only: a max with indices stores them by lane pairs or warps of tiles side by side),
    halved by :func:`_filled`, plane groups on grid z (the ``*_depth_rows`` kernels: on y, the
    W chunks and row groups on x). Planes and rows: :func:`_grid`."""
    kh, kw, sw, dw, vec, lead = shape
    planes, rows = _grid(spec)
    ow = spec.out_spatial[-1]
    depth = not depth_slices(spec)
    if spec.geom.nd == 3:
        words.append("3-D windows of one D tap at their own slice: each plane's D slices pooled "
                     "as 2-D planes" if not depth else "3-D windows: the row tiles of each D "
                     "tap in turn (D taps at run time), output rows (d, h)")
    (tx, ty, tz), wave = _filled(spec, device, _block(spec, not spec.return_indices))
    if not wave:  # under a wave idle lanes cost nothing, and smaller blocks are more of them
        (tx, ty, tz), _ = _filled(spec, device, _block(spec, False))
    if tz > 1:
        words.append(f"packing: {tz} planes per block (a plane has {cdiv(ow, ROW_TILE) * rows} "
                     f"row tiles; blocks of {tx * ty} threads would leave the SMs' block slots "
                     f"idle)")
    grid = ((cdiv(ow, tx * ROW_TILE) * cdiv(rows, ty), cdiv(planes, tz), 1) if depth
            else (cdiv(ow, tx * ROW_TILE), cdiv(rows, ty), cdiv(planes, tz)))
    kernel = ("max_pool_indices" if spec.return_indices else f"{spec.op}_pool") + (
        "_depth_rows" if depth else "_rows")
    packs = (f" ({'shifted' if lead < 0 else 'aligned'} packs of "
             f"{vec * S.ITEMSIZE[spec.geom.dtype]} bytes)" if vec > 1 else "")
    windows = f"{kh}x{kw} windows of W stride {sw}" + (f" and W dilation {dw}" if dw > 1 else "")
    words.append(f"row tiles: {ROW_TILE} outputs per thread side by side along W, their "
                 f"{windows} compiled in; each input row of a tile loaded once into "
                 f"registers{packs} and shared by the windows that overlap")
    words.append(f"split: {planes} planes ({cdiv(planes, tz)} groups on grid "
                 f"{'y' if depth else 'z'}) x {cdiv(rows, ty)} groups of {ty} output rows x "
                 f"{cdiv(ow, tx * ROW_TILE)} chunks of {tx * ROW_TILE} outputs along W")
    return Plan("window", "int", (Launch(kernel, grid, (tx, ty, tz), 1, tuple(sorted(zip(
        ROW_TILE_PARAMS, shape)))),), tuple(words))


#: outputs per thread of the quantized pair kernels (quantized_pool.cu, gpq::pair_tiles)
PAIR_TILE = 8


def pair_tiles(spec: S.WindowSpec) -> bool:
    """Whether the quantized pair kernels (``qmax_pool_pairs``, ``qavg_pool_pairs``: PAIR_TILE
    outputs side by side along W per thread, from one 16-byte pack of each of their two input
    rows) cover ``spec``: a 2-D NCHW pooling of 2 x 2 windows of stride 2 with no padding or
    dilation, input rows of whole 16-byte packs (then OW = IW / 2, whole tiles), the last
    window inside the input's rows (2 * OH <= IH), 32-bit offsets and grid dims within
    reach. The host checks the input's start."""
    g = spec.geom
    if (g.layout != "NCHW" or g.nd != 2 or tuple(spec.kernel) != (2, 2)
            or tuple(spec.stride) != (2, 2) or any(p != (0, 0) for p in spec.pads)
            or tuple(spec.dilation) != (1, 1) or g.spatial[1] % 16
            or 2 * spec.out_spatial[0] > g.spatial[0] or index_type(spec) != "int"):
        return False
    planes, rows = _grid(spec)
    return max(cdiv(planes, _block(spec, True, PAIR_TILE)[2]), rows) <= GRID_YZ_MAX


def plan_pair_tiles(spec: S.WindowSpec, device: DeviceInfo, kernel: str) -> Plan:
    """The launch of pair kernel ``kernel`` (gp::outputs_rows with PAIR_TILE outputs a thread):
    blocks of :func:`_block`, exact where the grid then makes a wave, halved by
    :func:`_filled`; grid x = W chunks, y = row groups, z = plane groups."""
    planes, rows = _grid(spec)
    ow = spec.out_spatial[-1]
    (tx, ty, tz), wave = _filled(spec, device, _block(spec, True, PAIR_TILE), PAIR_TILE)
    if not wave:
        (tx, ty, tz), _ = _filled(spec, device, _block(spec, False, PAIR_TILE), PAIR_TILE)
    grid = (cdiv(ow, tx * PAIR_TILE), cdiv(rows, ty), cdiv(planes, tz))
    words = (f"pair tiles: {PAIR_TILE} outputs per thread side by side along W, from one "
             f"16-byte load of each of their 2 input rows",
             f"split: {planes} planes ({grid[2]} groups of {tz}) x {grid[1]} groups of {ty} "
             f"output rows x {grid[0]} chunks of {tx * PAIR_TILE} outputs along W")
    return Plan("window", "int", (Launch(kernel, grid, (tx, ty, tz), 1),), words)
