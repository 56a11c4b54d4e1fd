"""The CUDA kernels by name: the C types they take, the name expression of every template
instantiation, the ``.cu`` file each kernel lives in, and :func:`instantiations`, the one list
of every name expression the runtime can ask for (the NVRTC test compiles exactly that list).
"""
from __future__ import annotations

import itertools

from . import planner, row_tiles, tiled_gathers
from ..spec import ACC_DTYPES, FLOAT_DTYPES, INT_DTYPES, window_spec

#: dtype name -> C type of the kernels (the only dtypes the kernels are instantiated for).
CTYPES = {
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "int32": "int",
    "int64": "long long",
}
#: unsigned word moved by max_unpool for each element size.
WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
INDEX_TYPES = ("int", "long long")
#: The code dtypes of quantized pooling and the accumulator dtypes of its averages.
CODE_DTYPES = ("int8", "uint8")
QUANTIZED_ACC_DTYPES = ("int32", "int64")

#: The ``.cu`` file of each kernel template, by its name.
FAMILY_FILES = {
    **dict.fromkeys(("max_pool", "max_pool_indices", "max_pool_rows", "max_pool_depth_rows",
                     "max_pool_indices_rows", "max_pool_indices_depth_rows", "max_pool_packs",
                     "max_unpool", "max_unpool_gather", "max_unpool_tiles", "max_index_check"),
                    "max_pool.cu"),
    **dict.fromkeys(("avg_pool", "avg_pool_rows", "avg_pool_depth_rows", "avg_pool_packs",
                     "lp_pool"), "avg_pool.cu"),
    **dict.fromkeys(("adaptive_max", "adaptive_max_indices", "adaptive_avg",
                     "adaptive_max_lanes", "adaptive_max_indices_lanes", "adaptive_avg_lanes"),
                    "adaptive_pool.cu"),
    **dict.fromkeys(("global_lanes", "global_block", "global_channels"), "global_pool.cu"),
    **dict.fromkeys(("max_window_backward", "max_adaptive_backward", "avg_window_backward",
                     "lp_window_backward", "avg_adaptive_backward", "avg_global_backward",
                     "avg_tiles_backward", "avg_channel_tiles_backward",
                     "max_cells_backward", "max_cells_checked_backward", "avg_cells_backward"),
                    "pool_backward.cu"),
    **dict.fromkeys(("qmax_pool_nhwc4", "qmax_pool_words", "qavg_pool_words", "qmax_pool_pairs",
                     "qavg_pool_pairs", "qavg_pool",
                     "qavg_adaptive", "qavg_global_lanes", "qavg_global_block",
                     "qavg_global_channels"), "quantized_pool.cu"),
}
#: The backward window kernels, which take the bound on covering windows
#: (:func:`gpupool.cuda.planner.gather_covers`).
BACKWARD_WINDOW_KERNELS = ("max_window_backward", "avg_window_backward", "lp_window_backward")
#: The backward kernels of one layout, which take none (NCHW:
#: :func:`gpupool.cuda.tiled_gathers.tiles`, NHWC: :func:`gpupool.cuda.tiled_gathers.channel_tiles`).
BACKWARD_ONE_LAYOUT_KERNELS = ("avg_tiles_backward", "avg_channel_tiles_backward")
#: The backward kernels of NCHW and 32-bit offsets only, which take the element type alone
#: (:func:`gpupool.cuda.tiled_gathers.cells`).
BACKWARD_CELL_KERNELS = ("max_cells_backward", "max_cells_checked_backward",
                         "avg_cells_backward")


def ctype(dtype: str) -> str:
    """C type of a dtype name; ``TypeError`` before anything is compiled if unsupported."""
    try:
        return CTYPES[dtype]
    except KeyError:
        raise TypeError(f"gpupool (cuda): dtype {dtype} has no CUDA kernel "
                        f"(supported: {', '.join(CTYPES)})") from None


def cbool(b) -> str:
    """A C++ bool template argument."""
    return "true" if b else "false"


def source_file(name_expression: str) -> str:
    """The ``.cu`` file that defines the kernel of ``name_expression``."""
    return FAMILY_FILES[name_expression.split("<", 1)[0]]


def acc_dtype(dtype: str) -> str:
    """Accumulator dtype of the float reductions (Num<T>::acc in traits.cuh): ACC_DTYPES for
    floats, the dtype itself for integers."""
    return ACC_DTYPES.get(dtype, dtype)


def partial_dtype(op: str, dtype: str) -> str:
    """Dtype of the per-chunk partials of a split global reduction."""
    return dtype if op == "max" else acc_dtype(dtype)


def global_type_pairs(op: str, dtype: str) -> tuple[tuple[str, str], ...]:
    """(Tin, Tout) of the global kernels: one pass (any kernel), first pass (``global_block``
    or ``global_channels``), second pass (``global_lanes`` with 32 lanes or
    ``global_channels``)."""
    part = partial_dtype(op, dtype)
    return (dtype, dtype), (dtype, part), (part, dtype)


# ----------------------------------------------------------------- float forward kernels
def window_name(kernel_base: str, dtype: str, itype: str, k: int, nhwc: bool) -> str:
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {k}, {cbool(nhwc)}>"


def packs_name(kernel_base: str, dtype: str, itype: str, k: int) -> str:
    """A channel-pack kernel's name expression (NHWC only: no layout parameter), with the
    channels of a pack of ``dtype`` (:func:`gpupool.cuda.planner.channel_pack`)."""
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {k}, {planner.pack_channels(dtype)}>"


def rows_name(kernel_base: str, dtype: str, shape: tuple[int, ...]) -> str:
    """A row-tile kernel's name expression; ``shape``: its (KH, KW, SW, DW, VEC, LEAD)
    (:func:`gpupool.cuda.row_tiles.row_tile`)."""
    return f"{kernel_base}<{ctype(dtype)}, {', '.join(map(str, shape))}>"


def row_tile_shapes(op: str, dtype: str, depth: bool = False) -> list[tuple[int, ...]]:
    """Every (KH, KW, SW, DW, VEC, LEAD) :func:`gpupool.cuda.row_tiles.row_tile` gives ``op``
    ("max" or "avg") on ``dtype``: each window of ROW_TILE_WINDOWS with each W pad up to half
    the window, on rows of 64 elements (packs where the window takes them) and of 37, 8 of
    them (shifted packs) or 7 (none: the input ends off a pack); ``depth``: those of 3-D
    windows of 2 D taps (the ``*_depth_rows`` kernels), windows over 1 high only."""
    shapes = []
    for kh, kw, sw, dw in row_tiles.ROW_TILE_WINDOWS:
        lead, kernel, stride, dilation = (((1, 1), (kh, kw), (1, sw), (1, dw)) if kh > 1
                                          else ((1,), (kw,), (sw,), (dw,)))
        if depth:
            if kh == 1:
                continue
            lead, kernel, stride, dilation = ((1, 1, 2), (2,) + kernel, (1,) + stride,
                                              (1,) + dilation)
        for pad, width, rows in itertools.product(range(kw // 2 + 1), (64, 37), (8, 7)):
            spec = window_spec(f"{op}_pool", op, lead + (rows, width), dtype, kernel,
                               stride, pad, dilation, False, "NCHW")
            shapes.append(row_tiles.row_tile(spec))
    return list(dict.fromkeys(s for s in shapes if s))


def adaptive_name(kernel_base: str, dtype: str, itype: str, nhwc: bool, rows: int = 0) -> str:
    """The lane-group kernels (``*_lanes``) take NCHW only: no layout parameter, their rows
    loaded at a time (``rows``, :func:`gpupool.cuda.planner.lane_rows`) instead."""
    if kernel_base.endswith("_lanes"):
        return f"{kernel_base}<{ctype(dtype)}, {itype}, {rows}>"
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {cbool(nhwc)}>"


def global_name(kernel_base: str, is_max: bool, tin: str, tout: str, itype: str,
                lanes: int | None = None) -> str:
    tail = f", {lanes}" if kernel_base == "global_lanes" else ""
    return f"{kernel_base}<{cbool(is_max)}, {ctype(tin)}, {ctype(tout)}, {itype}{tail}>"


def unpool_name(itemsize: int, indices_dtype: str, itype: str, nhwc: bool | None = None,
                tiles: bool = False) -> str:
    """The scatter's name expression, or with ``nhwc`` (a bool) the gather's, or with
    ``tiles`` the tiles' (int64 indices, NCHW: :func:`gpupool.cuda.tiled_gathers.tiles`)."""
    if tiles:
        return f"max_unpool_tiles<{WORDS[itemsize]}, {itype}>"
    if nhwc is None:
        return f"max_unpool<{WORDS[itemsize]}, {ctype(indices_dtype)}, {itype}>"
    return (f"max_unpool_gather<{WORDS[itemsize]}, {ctype(indices_dtype)}, {itype}, "
            f"{cbool(nhwc)}>")


def index_check_name(indices_dtype: str, itype: str, nhwc: bool, adaptive: bool) -> str:
    """The name expression of the check of a max's indices (``max_index_check``)."""
    return (f"max_index_check<{ctype(indices_dtype)}, {itype}, {cbool(nhwc)}, "
            f"{cbool(adaptive)}>")


# ----------------------------------------------------------------- backward kernels
def backward_name(kernel_base: str, dtype: str, itype: str, nhwc: bool, covers: int = 0,
                  stride: int = 2) -> str:
    """A backward kernel's name expression; ``covers`` the window kernels' bound on covering
    windows, ``stride`` the average's cells' (:func:`gpupool.cuda.tiled_gathers.cells`)."""
    tail = f", {covers}" if kernel_base in BACKWARD_WINDOW_KERNELS else ""
    if kernel_base == "avg_cells_backward":
        return f"{kernel_base}<{ctype(dtype)}, {stride}>"
    if kernel_base in BACKWARD_CELL_KERNELS:
        return f"{kernel_base}<{ctype(dtype)}>"
    if kernel_base in BACKWARD_ONE_LAYOUT_KERNELS:
        return f"{kernel_base}<{ctype(dtype)}, {itype}>"
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {cbool(nhwc)}{tail}>"


def backward_covers(kernel_base: str, itype: str) -> tuple[int, ...]:
    """The covering-window bounds a backward kernel is compiled with (planner.gather_covers)."""
    if kernel_base not in BACKWARD_WINDOW_KERNELS or itype != "int":
        return (0,)
    return (0, 3) if kernel_base == "max_window_backward" else (0, 1, 2)


# ----------------------------------------------------------------- quantized kernels
def qavg_pool_name(dtype, acc, itype, k, nhwc):
    return f"qavg_pool<{ctype(dtype)}, {ctype(acc)}, {itype}, {k}, {cbool(nhwc)}>"


def qavg_adaptive_name(dtype, acc, itype, nhwc):
    return f"qavg_adaptive<{ctype(dtype)}, {ctype(acc)}, {itype}, {cbool(nhwc)}>"


def qavg_global_name(kernel_base, tin, acc, tout, itype, lanes=None):
    """The quantized average of a float global kernel (``kernel_base``: ``global_lanes``,
    ``global_block`` or ``global_channels``): reads ``tin``, sums in ``acc``, writes ``tout``
    (a code dtype, or ``acc`` for partial sums)."""
    tail = f", {lanes}" if kernel_base == "global_lanes" else ""
    return (f"q{kernel_base.replace('global', 'avg_global')}<{ctype(tin)}, {ctype(acc)}, "
            f"{ctype(tout)}, {itype}{tail}>")


def qmax_nhwc4_name(dtype, itype, k):
    return f"qmax_pool_nhwc4<{ctype(dtype)}, {itype}, {k}>"


def qmax_words_name(dtype, itype, k):
    return f"qmax_pool_words<{ctype(dtype)}, {itype}, {k}>"


def qavg_words_name(dtype, acc, itype, k):
    return f"qavg_pool_words<{ctype(dtype)}, {ctype(acc)}, {itype}, {k}>"


def qmax_pairs_name(dtype):
    return f"qmax_pool_pairs<{ctype(dtype)}>"


def qavg_pairs_name(dtype):
    return f"qavg_pool_pairs<{ctype(dtype)}>"


# ----------------------------------------------------------------- every instantiation
def _forward_names(itype: str) -> list[str]:
    """The float forward kernels' name expressions with index type ``itype``."""
    out = []
    ks = (0,) + planner.SPECIALISED_K
    for nhwc in (False, True):
        for dtype in CTYPES:
            for base in ("max_pool", "max_pool_indices"):
                out += [window_name(base, dtype, itype, k, nhwc) for k in ks]
            for base in ("adaptive_max", "adaptive_max_indices"):
                out.append(adaptive_name(base, dtype, itype, nhwc))
            if not nhwc:
                out += [adaptive_name(base, dtype, itype, nhwc, rows) for rows in planner.LANE_ROWS
                        for base in ("adaptive_max_lanes", "adaptive_max_indices_lanes")]
        for dtype in FLOAT_DTYPES:
            for base in ("avg_pool", "lp_pool"):
                out += [window_name(base, dtype, itype, k, nhwc) for k in ks]
            if nhwc:
                out += [packs_name(f"{op}_pool_packs", dtype, itype, k)
                        for op in planner.CHANNEL_PACK_OPS for k in ks]
            out.append(adaptive_name("adaptive_avg", dtype, itype, nhwc))
            if not nhwc:
                out += [adaptive_name("adaptive_avg_lanes", dtype, itype, nhwc, rows)
                        for rows in planner.LANE_ROWS]
    for op in ("max", "avg"):
        if itype == "int":
            for base in (f"{op}_pool",) + (("max_pool_indices",) if op == "max" else ()):
                out += [rows_name(f"{base}_rows", dtype, shape)
                        for dtype in row_tiles.ROW_TILE_DTYPES
                        for shape in row_tile_shapes(op, dtype)]
                # 3-D windows: H windows over 1, in packs only
                out += [rows_name(f"{base}_depth_rows", dtype, shape)
                        for dtype in row_tiles.ROW_TILE_DTYPES
                        for shape in row_tile_shapes(op, dtype, depth=True)]
        for dtype in (CTYPES if op == "max" else FLOAT_DTYPES):
            one, first, second = global_type_pairs(op, dtype)
            pairs = {"global_block": (one, first), "global_channels": (one, first, second)}
            for base, types in pairs.items():
                out += [global_name(base, op == "max", tin, tout, itype)
                        for tin, tout in dict.fromkeys(types)]
            out += [global_name("global_lanes", op == "max", *one, itype, lanes)
                    for lanes in planner.LANE_WIDTHS]
            out.append(global_name("global_lanes", op == "max", *second, itype, 32))
    for size in WORDS:
        for idt in INT_DTYPES:
            out += [unpool_name(size, idt, itype, nhwc) for nhwc in (None, False, True)]
        out.append(unpool_name(size, "int64", itype, tiles=True))
    out += [index_check_name(idt, itype, nhwc, adaptive) for idt in INT_DTYPES
            for nhwc in (False, True) for adaptive in (False, True)]
    return out


def _backward_names(itype: str) -> list[str]:
    """The backward kernels' name expressions with index type ``itype``."""
    return [backward_name(base, dtype, itype, nhwc, covers, stride)
            for base, file in FAMILY_FILES.items() if file == "pool_backward.cu"
            if itype == "int" or base not in BACKWARD_CELL_KERNELS
            for dtype in FLOAT_DTYPES
            for nhwc in ((False,) if base in BACKWARD_ONE_LAYOUT_KERNELS + BACKWARD_CELL_KERNELS
                         else (False, True))
            for covers in backward_covers(base, itype)
            for stride in (tiled_gathers.CELL_STRIDES["avg"] if base == "avg_cells_backward"
                           else (2,))]


def _quantized_names(itype: str) -> list[str]:
    """The quantized kernels' name expressions with index type ``itype``."""
    out = []
    ks = (0,) + planner.SPECIALISED_K
    for dtype in CODE_DTYPES:
        out += [qmax_nhwc4_name(dtype, itype, k) for k in ks]
        out += [qmax_words_name(dtype, itype, k) for k in ks]
        if itype == "int":  # 32-bit offsets only
            out += [qmax_pairs_name(dtype), qavg_pairs_name(dtype)]
        for acc in QUANTIZED_ACC_DTYPES:
            out += [qavg_words_name(dtype, acc, itype, k) for k in ks]
            for nhwc in (False, True):
                out += [qavg_pool_name(dtype, acc, itype, k, nhwc) for k in ks]
                out.append(qavg_adaptive_name(dtype, acc, itype, nhwc))
            # one pass, the first of two (to partial sums), the second
            passes = {"global_lanes": [(dtype, dtype, n) for n in planner.LANE_WIDTHS]
                      + [(acc, dtype, 32)],
                      "global_block": [(dtype, dtype, None), (dtype, acc, None)],
                      "global_channels": [(dtype, dtype, None), (dtype, acc, None),
                                          (acc, dtype, None)]}
            out += [qavg_global_name(base, tin, acc, tout, itype, lanes)
                    for base, types in passes.items() for tin, tout, lanes in types]
    return out


def instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) the runtime can ask for: the float forward, the
    backward and the quantized kernels, for each index type."""
    names = [n for itype in INDEX_TYPES
             for family in (_forward_names, _backward_names, _quantized_names)
             for n in family(itype)]
    return [(source_file(n), n) for n in dict.fromkeys(names)]
