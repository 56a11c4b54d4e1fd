"""Gathers without a covering-window walk: the backward launches (and max unpooling's) whose
windows tile the input (``tiles``: NCHW rows as 16-byte packs; ``channel_tiles``: NHWC packs
of channels), the max gradients by cells of stride-2 windows, and a global average's backward
as a broadcast. Pure Python, like the planner that calls it."""
from __future__ import annotations

import math

from .. import spec as S
from .grid import BLOCK_THREADS, BLOCK_Z_MAX, GRID_YZ_MAX, cdiv, index_type, plane_grid
from .launches import DeviceInfo, Launch, Plan

#: Columns (an even number) of the 2 input rows a thread of the gradients by cells of stride 2
#: takes (:func:`cells`; the kernels' GP_CELL_COLUMNS).
CELL_COLUMNS = 4
#: Rows and columns of a thread's cell of stride 1 (the kernels' GP_CELL1_ROWS,
#: GP_CELL1_COLUMNS): each window row's sums along W serve every row of the cell it covers.
CELL1_ROWS, CELL1_COLUMNS = 8, 4
#: The strides of the cells that take each op's gradients (the instantiations of their kernels).
CELL_STRIDES = {"max": (2,), "avg": (2, 1)}
#: Threads along W of a block of the gradients by cells, at most.
CELLS_TX = 64
#: 16-byte packs per thread of a global average's backward (the kernels' GP_BROADCAST_PACKS).
BROADCAST_PACKS = 4

def _tile_exactly(spec: S.WindowSpec) -> bool:
    """Whether the windows of ``spec`` tile its input exactly: stride == kernel, no dilation,
    no padding, each input dim the kernel times the output dim; each input element is then
    covered by one window."""
    return all(s == k and d == 1 and not any(pads) and i == k * o for k, s, d, pads, i, o
               in zip(spec.kernel, spec.stride, spec.dilation, spec.pads, spec.geom.spatial,
                      spec.out_spatial))


def tiles(spec: S.WindowSpec) -> bool:
    """Whether the windows of ``spec`` tile its input exactly (:func:`_tile_exactly`), 2 wide
    along W, NCHW."""
    return spec.geom.layout == "NCHW" and spec.kernel[-1] == 2 and _tile_exactly(spec)


def cells(spec: S.WindowSpec, op: str) -> int:
    """The stride of the cells that take the gradients of ``op`` over ``spec``
    (``max_cells_backward``, ``avg_cells_backward``), 0 where none do: 2-D NCHW with 32-bit
    offsets, the same stride along H and W, 2 (max and avg) or 1 (avg), 2 or 3 taps, no
    dilation and pad 0 or 1 before (stride 2: planes and row-pair groups within the grid); at
    most 2 (stride 1: 3) windows then cover a position per dim, known from the pad and the
    taps."""
    g = spec.geom
    strides = set(spec.stride)
    if (g.nd != 2 or g.layout != "NCHW" or index_type(spec) != "int" or len(strides) != 1
            or not all(k in (2, 3) and d == 1 and pb in (0, 1) for k, d, (pb, _)
                       in zip(spec.kernel, spec.dilation, spec.pads))):
        return 0
    (stride,) = strides
    if stride not in CELL_STRIDES.get(op, ()):
        return 0
    groups = cdiv(g.spatial[0], 2 * (BLOCK_THREADS // CELLS_TX))  # of row pairs, at most
    return stride if stride == 1 or max(g.planes, groups) <= GRID_YZ_MAX else 0


def plan_cells(view: S.WindowSpec, words: list, op: str, stride: int) -> Plan:
    """The gradients of ``op`` ("max" or "avg") by cells of ``stride`` (:func:`cells`): a
    thread per cell of input rows by columns loads each window that may cover it once.
    Stride 2: cells of 2 rows by CELL_COLUMNS; blocks of up to BLOCK_THREADS threads, TX along
    W (a row's cells, or CELLS_TX of them) by TY row pairs; row-pair groups on grid y, planes
    on z. Stride 1: cells of CELL1_ROWS by CELL1_COLUMNS, numbered across the planes, blocks of
    BLOCK_THREADS of them (fewer, in whole warps, where the cells are fewer) on grid x."""
    ih, iw = view.geom.spatial
    planes = view.geom.planes
    if stride == 1:
        cells_ = planes * cdiv(ih, CELL1_ROWS) * cdiv(iw, CELL1_COLUMNS)
        tx = min(BLOCK_THREADS, cdiv(cells_, 32) * 32)
        words.append(f"cells: stride 1, 2 or 3 taps; a thread per {CELL1_ROWS} rows by "
                     f"{CELL1_COLUMNS} columns loads each window that may cover them once; "
                     f"{cells_} cells numbered across the planes, blocks of {tx}")
        grid, block = (cdiv(cells_, tx), 1, 1), (tx, 1, 1)
    else:
        across = cdiv(iw, CELL_COLUMNS)
        pairs = cdiv(ih, 2)
        tx = min(across, CELLS_TX)
        ty = min(BLOCK_THREADS // tx, pairs)
        groups = cdiv(pairs, ty)
        ty = cdiv(pairs, groups)
        words.append(f"cells: stride 2, 2 or 3 taps; a thread per 2 rows by {CELL_COLUMNS} "
                     f"columns loads each window that may cover them once; blocks of {tx} by "
                     f"{ty} row pairs, {groups} groups of row pairs per plane")
        grid, block = (cdiv(across, tx), groups, planes), (tx, ty, 1)
    return Plan("gather", "int", (Launch(f"{op}_cells_backward", grid, block, 1,
                                         (("stride", stride),)),), tuple(words))


def channel_tiles(spec: S.WindowSpec) -> bool:
    """Whether the windows of ``spec`` tile its input exactly (:func:`_tile_exactly`), NHWC."""
    return spec.geom.layout == "NHWC" and _tile_exactly(spec)


def plan_channel_tiles(view: S.WindowSpec, words: list) -> Plan:
    """An average's backward whose windows tile an NHWC input (:func:`channel_tiles`): a thread
    per 16-byte pack of a grad position's channels stores it at its window's input positions.
    Blocks of up to BLOCK_THREADS threads: TX packs of a grad row by TY grad rows; row groups
    on grid y (and z)."""
    ow = view.out_spatial[-1]
    rows = math.prod(view.out_shape) // (ow * view.geom.channels)
    packs = ow * cdiv(view.geom.channels, 16 // S.ITEMSIZE[view.geom.dtype])
    tx = min(packs, BLOCK_THREADS)
    ty = min(BLOCK_THREADS // tx, rows)
    y, z = plane_grid(cdiv(rows, ty))
    words.append(f"channel tiles: the windows tile the input; a thread per 16-byte pack of a "
                 f"gradient position's channels stores it at its window's positions; blocks of "
                 f"{tx} packs by {ty} of the {rows} gradient rows")
    return Plan("gather", index_type(view), (Launch("avg_channel_tiles_backward", (
        cdiv(packs, tx), y, z), (tx, ty, 1), 1, (("rows", rows),)),), tuple(words))


def plan_tiles(view: S.WindowSpec, words: list, family: str = "gather",
           kernel: str = "avg_tiles_backward", what: str = "gradient") -> Plan:
    """An average's backward (or an unpool) whose windows tile the input (:func:`tiles`): a
    thread per pack of 8 bytes of a grad (pooled) row stores its windows' input rows as
    16-byte packs. Blocks of up to BLOCK_THREADS threads: TX packs along W (a row's packs, or
    a block's width of them) by TY grad rows; row groups on grid y (and z)."""
    ow = view.out_spatial[-1]
    rows = math.prod(view.out_shape) // ow
    pack = 8 // S.ITEMSIZE[view.geom.dtype]
    tx = min(cdiv(ow, pack), BLOCK_THREADS)
    ty = min(BLOCK_THREADS // tx, rows)
    y, z = plane_grid(cdiv(rows, ty))
    words.append(f"tiles: the windows tile the input; a thread per {pack} {what} elements "
                 f"of a row stores its windows' input rows as 16-byte packs; blocks of {tx} "
                 f"packs by {ty} of the {rows} {what} rows")
    return Plan(family, index_type(view), (Launch(kernel, (cdiv(
        cdiv(ow, pack), tx), y, z), (tx, ty, 1), 1, (("rows", rows),)),), tuple(words))


def plan_broadcast(view: S.AdaptiveSpec, device: DeviceInfo, words: list) -> Plan:
    """A global average's backward: every element of a plane takes the plane's gradient over
    its size. BROADCAST_PACKS packs of 16 bytes per thread over groups of whole planes
    (contiguous): a group of up to BLOCK_Z_MAX small planes fills about one block, a large plane
    is cut in block-sized chunks on grid x; groups go on grid y (and z)."""
    g = view.geom
    nhwc = g.layout == "NHWC"
    planes = g.batch if nhwc else g.planes
    length = math.prod(g.spatial) * (g.channels if nhwc else 1)
    vec = 16 // S.ITEMSIZE[g.dtype]
    per_thread = BROADCAST_PACKS * vec
    group = max(1, min(planes, BLOCK_Z_MAX, BLOCK_THREADS * per_thread // max(1, length)))
    if group > vec and length % vec:
        group -= group % vec  # each group starts on a 16-byte boundary
    threads = cdiv(group * length + vec - 1, per_thread)
    tx = min(BLOCK_THREADS, max(32, cdiv(threads, 32) * 32))
    y, z = plane_grid(cdiv(planes, group))
    words.append(f"broadcast: each of {planes} planes of {length} elements takes its gradient "
                 f"over {math.prod(g.spatial)}; {group} planes per group, threads store "
                 f"{per_thread} elements each ({BROADCAST_PACKS} packs of 16 bytes)")
    return Plan("gather", index_type(view), (Launch("avg_global_backward", (cdiv(threads, tx),
                                                    y, z), (tx, 1, 1), 1,
                                                    (("group", group),)),), tuple(words))
