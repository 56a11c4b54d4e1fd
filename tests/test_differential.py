"""Differential test: every CUDA kernel family (CuPy arrays) against the NumPy backend.

Each case builds NumPy inputs, runs one gpupool op on them and on ``cupy.asarray`` copies, and
compares bit for bit (any NaN for a NaN): max values and indices, integer and quantized
results, and the float sums both backends add in the same order (average, adaptive average,
Lp with p = 1 or 2; see docs/semantics.md); global averages and Lp with another p (``pow`` differs
between libms) within a per-dtype tolerance. CuPy in must give CuPy out.
``test_max_returns_the_winning_element_bit_for_bit`` adds what random inputs never hold: tied
zeros of both signs and NaNs of several payloads.

While a case runs on CuPy, every ``planner.plan`` call and every kernel the CUDA backend asks
for are recorded, so a case can assert the path it means to take (global single or two-pass
kernels, template window size, grid z, 64-bit indices, several outputs per thread).
``test_every_instantiation_is_requested`` replays all cases with no-op kernels and checks that
together they request every name of ``gpupool.cuda.names.instantiations()`` that the float
and quantized ops can ask for.

Test hooks (monkeypatched, memoized plans cleared on both sides):
  * ``idx64``: ``INT32_LIMIT = 100`` (gpupool.cuda.grid and .planner) forces the ``long long`` index variants;
  * ``acc64``: ``quantized_spec.accumulator_dtype`` picks int64 accumulators (naturally only past 8.4M taps);
  * ``small-device``: a 1-SM device, so tiny inputs fill it and threads compute several rows;
  * ``grid64``: grid y and z hold 64 blocks each, so planes spill onto grid z.
"""
from __future__ import annotations

import dataclasses
import itertools
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import gpupool
from gpupool.cuda import planner, row_tiles
from gpupool import quantized as Q
from gpupool import quantized_spec as QS
from dtypes import numpy_dtype

pytestmark = pytest.mark.gpu

FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "int32", "int64")
QDTYPES = ("int8", "uint8")
TOL = {"float16": dict(rtol=1e-3, atol=1e-3), "bfloat16": dict(rtol=8e-3, atol=8e-3),
       "float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12)}
QPARAMS = {"int8": (0.05, -3), "uint8": (0.05, 120)}  # scale, zero point of the input codes
PLAN = planner.plan  # the memoized planner itself (the recorder replaces the module attribute)


# ----------------------------------------------------------------------------- inputs

def make_input(rng, shape, dtype, values):
    """``max``: few distinct values (ties) plus NaN/+-inf; ``sum``: normal plus NaN/+inf
    (never both infinities: NumPy warns about inf - inf); ``plain``: normal only. Integers:
    full range, half of them small (ties)."""
    dt = numpy_dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        wide = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
        small = rng.integers(max(info.min, -2), 3, shape, dtype=dt)
        return np.where(rng.random(shape) < 0.5, small, wide)
    if values == "max":
        x = (rng.integers(-6, 7, shape) / 2).astype(dt)
        specials = (np.nan, np.inf, -np.inf)
    else:
        x = (rng.standard_normal(shape) * 3).astype(dt)
        specials = (np.nan, np.inf) if values == "sum" else ()
    u = rng.random(shape)
    for i, special in enumerate(specials):
        x[(u >= 0.02 * i) & (u < 0.02 * (i + 1))] = special
    return x


def codes(rng, shape, dtype):
    """Random int8/uint8 codes: full range, with runs of the extremes (saturation)."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    u = rng.random(shape)
    x[u < 0.05] = info.max
    x[(u >= 0.05) & (u < 0.1)] = info.min
    return x


@dataclass(frozen=True)
class Case:
    """One op on one input. ``inputs(rng)`` gives the NumPy arguments, ``run(*arrays)`` calls
    gpupool (arrays are NumPy or CuPy), ``view`` makes the first argument non-contiguous on
    both sides. Expectations on the CUDA run: ``launches``: kernels of the recorded plans, in
    order; ``requests``: base names of the kernels asked for, in order; ``static_k``: the
    template window size; ``paths``: see :func:`check_paths`. ``tags``: the hooked runs the
    case also takes part in."""

    id: str
    inputs: Callable
    run: Callable
    exact: bool
    view: Callable | None = None
    launches: tuple | None = None
    requests: tuple | None = None
    static_k: int | None = None
    paths: frozenset = field(default=frozenset())
    tags: frozenset = field(default=frozenset())


def shaped(lead, spatial, layout):
    """NCHW: ``lead + spatial``; NHWC: the same planes with the last lead dim moved last."""
    lead, spatial = tuple(lead), tuple(spatial)
    return lead + spatial if layout == "NCHW" else lead[:-1] + spatial + lead[-1:]


def random_input(shape, dtype, values):
    return lambda rng: (make_input(rng, shape, dtype, values),)


# ----------------------------------------------------------------------------- window pooling

@dataclass(frozen=True)
class Window:
    id: str
    lead: tuple
    spatial: tuple
    kernel: object
    stride: object = None
    padding: object = 0
    dilation: object = 1
    ceil: bool = False
    static_k: int = 0


WINDOWS = [
    Window("1d-k3-s2-p1-ceil", (2, 5), (13,), (3,), (2,), 1, 1, True),
    Window("1d-k4-same-d2", (3,), (11,), (4,), (1,), "same", (2,)),
    Window("1d-k2-s3-same_lower", (2, 3), (10,), (2,), 3, "same_lower"),
    Window("1d-k3-s3", (2, 5), (40,), (3,), (3,)),
    Window("1d-k5-s4-p2", (2, 3), (37,), (5,), (4,), 2),
    Window("1d-k4-s2-p1-ceil", (2, 3), (21,), (4,), (2,), 1, 1, True),
    Window("1d-k5-s2-p2-d2-ceil", (2, 3), (64,), (5,), (2,), 2, (2,), True),
    Window("2d-k2", (2, 3), (8, 9), 2, static_k=2),
    Window("2d-k2-s1-p1-ceil", (2, 3), (7, 6), 2, 1, 1, 1, True, 2),
    Window("2d-k3-s2-p1", (2, 3), (9, 10), 3, 2, 1, static_k=3),
    Window("2d-k3-s2-d2-SAME", (2, 3), (9, 8), 3, 2, "SAME", 2, static_k=3),
    Window("2d-k23-s12-pairs", (2, 3), (7, 9), (2, 3), (1, 2), ((1, 0), (0, 2))),
    Window("2d-k5-s2-d2-perdim-ceil", (2, 3), (12, 11), 5, 2, (2, 1), 2, True),
    Window("2d-k32-valid-d12-lists", (2, 3), (6, 7), [3, 2], [2, 1], "valid", [1, 2]),
    Window("2d-empty-windows-d5-p4", (2, 3), (3, 4), 2, 1, 4, 5, static_k=2),
    Window("2d-empty-windows-ceil", (2, 3), (4, 5), 3, 3, ((4, 0), (0, 1)), 1, True, 3),
    Window("2d-wide-k3-s1-p1", (1, 2), (5, 300), 3, 1, 1, static_k=3),
    Window("2d-C70-k3-s2", (1, 70), (5, 5), 3, 2, static_k=3),
    Window("3d-k2", (1, 3), (4, 6, 5), (2, 2, 2), static_k=2),
    Window("3d-k133-s122-p011", (1, 3), (3, 7, 8), (1, 3, 3), (1, 2, 2), (0, 1, 1), static_k=3),
    Window("3d-k323-pairs-d121-ceil", (2,), (5, 6, 7), (3, 2, 3), (2, 1, 2),
           [[1, 0], [0, 1], [1, 1]], (1, 2, 1), True),
    Window("4d-host-fallback", (2,), (3, 3, 4, 4), (2, 2, 2, 2)),
]
WIDE_WINDOWS = ("1d-k3-s2-p1-ceil", "2d-k2-s1-p1-ceil", "2d-k3-s2-p1", "2d-k5-s2-d2-perdim-ceil",
                "3d-k133-s122-p011")


def _max(idx):
    return lambda x, w, L: gpupool.max_pool(x, w.kernel, w.stride, w.padding, w.dilation, w.ceil,
                                            return_indices=idx, layout=L)


def _avg(cip=False, div=None):
    return lambda x, w, L: gpupool.avg_pool(x, w.kernel, w.stride, w.padding, w.ceil, cip, div,
                                            dilation=w.dilation, layout=L)


def _lp(p):
    return lambda x, w, L: gpupool.lp_pool(x, p, w.kernel, w.stride, w.padding, w.dilation,
                                           w.ceil, layout=L)


# op id -> (dtypes, input values, exact, call(x, window, layout))
WINDOW_OPS = {
    "max": (FLOATS + INTS, "max", True, _max(False)),
    "max-idx": (FLOATS + INTS, "max", True, _max(True)),
    "avg": (FLOATS, "sum", True, _avg()),
    "avg-cip": (FLOATS, "sum", True, _avg(cip=True)),
    "avg-div3": (FLOATS, "sum", True, _avg(div=3)),
    "lp1": (FLOATS, "sum", True, _lp(1)),
    "lp2": (FLOATS, "sum", True, _lp(2)),
    "lp3.5": (FLOATS, "sum", False, _lp(3.5)),
}


def window_cases():
    for w, layout, (op, (dtypes, values, exact, call)) in itertools.product(
            WINDOWS, ("NCHW", "NHWC"), WINDOW_OPS.items()):
        for dtype in dtypes:
            shape = shaped(w.lead, w.spatial, layout)
            yield Case(f"{op}-{dtype}-{layout}-{w.id}", random_input(shape, dtype, values),
                       lambda x, w=w, L=layout, f=call: f(x, w, L), exact,
                       static_k=None if len(w.spatial) > 3 else w.static_k,
                       tags=frozenset({"idx64"} if w.id in WIDE_WINDOWS else ()))


# NHWC windows whose channels fill 16-byte packs take the channel-pack kernels (values-only
# max, averages): 8 channels are one to four packs of each float dtype, 24 three to twelve
# (a block's last lanes idle); the cases above, with 3 or 5 channels, the general walk.
PACK_WINDOWS = {"1d-k3-s2-p1-ceil": 8, "1d-k4-same-d2": 24, "2d-k2-s1-p1-ceil": 8,
                "2d-k3-s2-p1": 8, "2d-k5-s2-d2-perdim-ceil": 8, "2d-empty-windows-d5-p4": 8,
                "2d-empty-windows-ceil": 24, "2d-k23-s12-pairs": 8, "3d-k2": 8,
                "3d-k323-pairs-d121-ceil": 8}
PACK_OPS = ("max", "avg", "avg-cip", "avg-div3")


def pack_cases():
    for w, op in itertools.product(WINDOWS, PACK_OPS):
        if w.id not in PACK_WINDOWS:
            continue
        _, values, exact, call = WINDOW_OPS[op]
        shape = shaped(w.lead[:-1] + (PACK_WINDOWS[w.id],), w.spatial, "NHWC")
        for dtype in FLOATS:
            yield Case(f"{op}-{dtype}-NHWC-C{shape[-1]}-{w.id}", random_input(shape, dtype, values),
                       lambda x, w=w, f=call: f(x, w, "NHWC"), exact,
                       requests=(f"{op.split('-')[0]}_pool_packs",), static_k=w.static_k,
                       tags=frozenset({"idx64"} if w.id in WIDE_WINDOWS else ()))


# One window per plane covering it (its taps reach past the plane, padding included): a max
# runs as the adaptive max to size 1, values only the global max's reduction.
PLANE_WINDOWS = [Window("1d-k40-s40-p2-plane", (2, 5), (37,), (40,), (40,), 2),
                 Window("2d-k5x6-plane", (2, 3), (5, 6), (5, 6))]


def whole_plane_cases():
    for w, layout, idx, dtype in itertools.product(PLANE_WINDOWS, ("NCHW", "NHWC"),
                                                   (False, True), FLOATS):
        kernel = ({"NCHW": "adaptive_max_indices_lanes", "NHWC": "adaptive_max_indices"}
                  if idx else {"NCHW": "global_lanes", "NHWC": "global_channels"})[layout]
        yield Case(f"max{'-idx' if idx else ''}-{dtype}-{layout}-{w.id}",
                   random_input(shaped(w.lead, w.spatial, layout), dtype, "max"),
                   lambda x, w=w, L=layout, f=_max(idx): f(x, w, L), True, launches=(kernel,))


# ----------------------------------------------------------------------------- max_unpool

@dataclass(frozen=True)
class Unpool:
    """A max_unpool of max_pool's indices. ``gather``: the kernel expected where every index
    lies in its own window (windows that do not overlap); ``stray``: one in-plane index
    moved outside its window (the scatter then runs instead of the gather)."""

    id: str
    lead: tuple
    spatial: tuple
    kernel: object
    stride: object = None
    padding: object = 0
    output_size: object = None  # "spatial" | "full": the input's size in that form
    dilation: object = 1
    ceil: bool = False
    gather: bool = False
    stray: bool = False
    tags: frozenset = frozenset({"idx64"})
    tiles: bool = False  # windows tile the output, 2 wide along W: int64 NCHW takes the tiles
    # (where an index is stray, then the check and the scatter)


UNPOOLS = [
    Unpool("2d-k2", (2, 3), (6, 8), 2, gather=True, tiles=True),
    Unpool("2d-k3-s2-p1-outsize", (2, 3), (9, 10), 3, 2, 1, "spatial"),
    Unpool("2d-k23-pairs-fullsize", (2, 3), (7, 9), (2, 3), 2, ((1, 0), (0, 1)), "full"),
    Unpool("1d-k3-s1-overlap", (2, 3), (12,), (3,), (1,)),
    Unpool("3d-k2", (1, 2), (4, 6, 6), (2, 2, 2), gather=True, tiles=True),
    # windows that do not overlap: padding, ceil mode, dilation, strides past the window,
    # positions no window covers (output_size above the default), empty windows (-1)
    Unpool("1d-k3-s3-p1-ceil", (2, 5), (13,), (3,), (3,), 1, "spatial", ceil=True, gather=True),
    Unpool("2d-k2-d2-s3-outsize", (2, 3), (10, 11), 2, 3, 0, "spatial", 2, gather=True),
    Unpool("2d-k2-s3-p1-ceil", (2, 3), (8, 10), 2, 3, 1, "full", ceil=True, gather=True),
    Unpool("2d-k2-empty-windows", (2, 3), (6, 8), 2, 2, ((2, 0), (0, 3)), "spatial",
           gather=True),
    Unpool("3d-k122-p011-ceil", (1, 2), (3, 5, 7), (1, 2, 2), (1, 2, 2), (0, 1, 1), "spatial",
           ceil=True, gather=True),
    Unpool("2d-k2-stray", (2, 3), (6, 8), 2, stray=True, tiles=True),
    Unpool("3d-k2-stray", (1, 2), (4, 6, 6), (2, 2, 2), output_size="spatial", stray=True,
           tiles=True),
    # small planes packed in blocks, more plane groups than the hooked grid y holds
    Unpool("2d-k2-many-planes", (1, 40000), (2, 2), 2, gather=True,
           tags=frozenset({"grid64"}), tiles=True),
]


def unpool_case(u: Unpool, layout: str, dtype: str, idt: str, paths=frozenset()) -> Case:
    shape = shaped(u.lead, u.spatial, layout)

    def make(rng):
        x = make_input(rng, shape, dtype, "max")
        y, idx = gpupool.max_pool(x, u.kernel, u.stride, u.padding, u.dilation, u.ceil,
                                  return_indices=True, layout=layout)
        if u.stray:  # the first pooled element's index (its plane's) moves outside its
            # window, to the last position of the plane no index names (no repeat: the
            # order of repeated indices is unspecified)
            rows = int(np.prod(u.lead[:-1] if layout == "NHWC" else u.lead))
            plane = idx.reshape(rows, -1, idx.shape[-1] if layout == "NHWC" else 1)[0, :, 0]
            named = set(plane.tolist())
            idx.reshape(-1)[0] = max(set(range(int(np.prod(u.spatial)))) - named)
        return y, idx.astype(idt)

    size = {None: None, "spatial": u.spatial, "full": shape}[u.output_size]
    run = lambda y, idx: gpupool.max_unpool(y, idx, u.kernel, u.stride, u.padding,  # noqa: E731
                                            size, dilation=u.dilation, layout=layout)
    if u.tiles and layout == "NCHW" and idt == "int64":  # the tiles check as they go
        requests = ("max_unpool_tiles",) + (("max_index_check", "max_unpool") if u.stray else ())
    else:
        requests = ("max_index_check", "max_unpool_gather" if u.gather else "max_unpool")
    return Case(f"unpool-{dtype}-idx_{idt}-{layout}-{u.id}", make, run, True,
                requests=requests, tags=u.tags, paths=paths)


def unpool_cases():
    for u, layout, dtype in itertools.product(UNPOOLS, ("NCHW", "NHWC"), FLOATS + INTS):
        if "many-planes" in u.id:
            if dtype not in ("float32", "int8"):
                continue
            u = u if layout == "NCHW" else dataclasses.replace(u, lead=u.lead[::-1])
        # every index dtype for the 2D k2 planes (48 positions: int8 holds them) and the 1D
        # overlapping ones (the gather's and the scatter's instantiations), else int64
        for idt in (INTS if u.id in ("2d-k2", "1d-k3-s1-overlap") else ("int64",)):
            yield unpool_case(u, layout, dtype, idt)


# ----------------------------------------------------------------------------- adaptive

ADAPTIVES = [  # id, lead, spatial, output size
    ("1d-10to3", (2, 3), (10,), (3,)),
    ("1d-9to3-divides", (2, 3), (9,), (3,)),
    ("2d-7x9to3x4", (2, 3), (7, 9), (3, 4)),
    ("2d-8x8to4x2-divides", (2, 3), (8, 8), (4, 2)),
    ("2d-5x5to7x6-upsample", (2, 3), (5, 5), (7, 6)),
    ("2d-6x7to1x1", (2, 3), (6, 7), (1, 1)),
    ("3d-5x6x7to2x3x4", (1, 3), (5, 6, 7), (2, 3, 4)),
    ("3d-4x4x4to2x2x2-divides", (1, 3), (4, 4, 4), (2, 2, 2)),
    # lane groups: 70 columns, two per lane: 32 lanes, 2 passes
    ("2d-3x140to2x2-two-passes", (1, 2), (3, 140), (2, 2)),
    ("2d-40x9to2x2-tall", (1, 2), (40, 9), (2, 2)),  # 20 rows: batches of 16, 2 of them
    ("2d-12x13to2x3-odd", (2, 3), (12, 13), (2, 3)),  # 5 columns: a lane with 1 of its 2
    # uniform windows the row tiles cover (2x2 s2; 4 s4): the window pooling's kernels
    ("2d-16x16to8x8-row-tiles", (2, 3), (16, 16), (8, 8)),
    ("1d-32to8-row-tiles", (2, 3), (32,), (8,)),
]
WIDE_ADAPTIVES = ("1d-10to3", "2d-7x9to3x4", "3d-5x6x7to2x3x4", "2d-40x9to2x2-tall",
                  "2d-12x13to2x3-odd")
ADAPTIVE_OPS = {
    "amax": (FLOATS + INTS, "max", True,
             lambda x, o, L: gpupool.adaptive_max_pool(x, o, layout=L)),
    "amax-idx": (FLOATS + INTS, "max", True,
                 lambda x, o, L: gpupool.adaptive_max_pool(x, o, return_indices=True, layout=L)),
    "aavg": (FLOATS, "sum", True, lambda x, o, L: gpupool.adaptive_avg_pool(x, o, layout=L)),
}


def adaptive_cases():
    for (gid, lead, spatial, out), layout, (op, (dtypes, values, exact, call)) in \
            itertools.product(ADAPTIVES, ("NCHW", "NHWC"), ADAPTIVE_OPS.items()):
        for dtype in dtypes:
            yield Case(f"{op}-{dtype}-{layout}-{gid}",
                       random_input(shaped(lead, spatial, layout), dtype, values),
                       lambda x, o=out, L=layout, f=call: f(x, o, L), exact,
                       tags=frozenset({"idx64"} if gid in WIDE_ADAPTIVES else ()))


# ----------------------------------------------------------------------------- global

GLOBALS = [  # id, shape, spatial_dims, layout, input values ("specials": NaN/inf), launches
    ("lanes4-1pass", (2, 3, 3, 3), 2, "NCHW", True, ("global_lanes",)),
    ("lanes4-1x1-planes", (2, 5, 1, 1), 2, "NCHW", False, ("global_lanes",)),
    ("lanes8-1pass", (2, 3, 5, 5), 2, "NCHW", False, ("global_lanes",)),
    ("lanes16-7x7-1pass", (2, 3, 7, 7), 2, "NCHW", False, ("global_lanes",)),
    ("lanes32-1pass", (2, 3, 20, 20), 2, "NCHW", False, ("global_lanes",)),
    ("lanes16-9x11-odd-planes", (2, 3, 9, 11), 2, "NCHW", False, ("global_lanes",)),
    ("lanes16-1d", (4, 50), 1, "NCHW", False, ("global_lanes",)),
    # 144 elements: 16 lanes of 2-byte elements (16 each), 32 of wider ones (4 each)
    ("lanes16-12x12-2byte", (2, 3, 12, 12), 2, "NCHW", False, ("global_lanes",)),
    ("block-1pass", (2, 3, 40, 41), 2, "NCHW", False, ("global_block",)),
    ("block-1pass-3d", (2, 10, 12, 14), 3, "NCHW", False, ("global_block",)),
    ("block-2pass-300x301", (1, 2, 300, 301), 2, "NCHW", False, ("global_block", "global_lanes")),
    ("lanes32-4d", (2, 3, 2, 3, 4, 5), 4, "NCHW", False, ("global_lanes",)),
    ("channels-1pass-7x7", (2, 7, 7, 5), 2, "NHWC", True, ("global_channels",)),
    ("channels-2pass-3d-C70", (2, 4, 5, 6, 70), 3, "NHWC", False,
     ("global_channels", "global_channels")),
    ("channels-2pass-30x30", (1, 30, 30, 3), 2, "NHWC", False,
     ("global_channels", "global_channels")),
    ("channels-2pass-300x301", (1, 300, 301, 3), 2, "NHWC", False,
     ("global_channels", "global_channels")),
]
GLOBAL_OPS = {
    "gmax": (FLOATS + INTS, "max", True, gpupool.global_max_pool),
    "gavg": (FLOATS, "sum", False, gpupool.global_avg_pool),
}


def global_cases():
    for (gid, shape, nd, layout, specials, launches), (op, (dtypes, values, exact, call)) in \
            itertools.product(GLOBALS, GLOBAL_OPS.items()):
        for dtype in dtypes:
            yield Case(f"{op}-{dtype}-{layout}-{gid}",
                       random_input(shape, dtype, values if specials else "plain"),
                       lambda x, f=call, nd=nd, L=layout: f(x, spatial_dims=nd, layout=L), exact,
                       launches=launches, tags=frozenset({"idx64"}))


# ----------------------------------------------------------------------------- quantized

QWINDOWS = ("1d-k3-s2-p1-ceil", "2d-k2", "2d-k3-s2-p1", "2d-k23-s12-pairs", "2d-empty-windows-ceil",
            "2d-k5-s2-d2-perdim-ceil", "3d-k2", "3d-k133-s122-p011", "4d-host-fallback")
QLAYOUTS = {"NCHW": 5, "NHWC-C5": 5, "NHWC-C8": 8}  # layout -> channels (C % 4 == 0: vmax4)
QWORD_TAKEN = {"3d-k133-s122-p011"}  # NCHW: IW = 8, OW = 4, so the word kernels


def _qavg(cip, requant):
    extra = dict(out_scale=0.07, out_zero_point=3, rounding="half_to_even") if requant else {}
    return lambda q, w, L: Q.avg_pool(q, w.kernel, w.stride, w.padding, w.ceil, cip, layout=L,
                                      **extra)


QWINDOW_OPS = {
    "qmax": lambda q, w, L: Q.max_pool(q, w.kernel, w.stride, w.padding, w.dilation, w.ceil,
                                       layout=L),
    "qavg": _qavg(False, False),
    "qavg-cip-requant": _qavg(True, True),
}


def quantized(dtype, call):
    """``run`` for a quantized op: wrap the codes in a QArray of the dtype's scale/zero point."""
    return lambda data: call(Q.QArray(data, *QPARAMS[dtype]))


def qinputs(shape, dtype):
    return lambda rng: (codes(rng, shape, dtype),)


def quantized_cases():
    windows = {w.id: w for w in WINDOWS}
    for wid, (layout, chans), (op, call), dtype in itertools.product(
            QWINDOWS, QLAYOUTS.items(), QWINDOW_OPS.items(), QDTYPES):
        w = windows[wid]
        if op != "qmax" and w.dilation != 1:
            continue  # quantized avg_pool has no dilation
        L = layout[:4]
        shape = shaped(w.lead[:-1] + (chans,), w.spatial, L)
        nd = len(w.spatial)
        if L == "NCHW" and wid in QWORD_TAKEN:
            kernels = "qmax_pool_words" if op == "qmax" else "qavg_pool_words"
        else:
            kernels = ("qmax_pool_nhwc4" if chans % 4 == 0 and L == "NHWC" else "max_pool"
                       ) if op == "qmax" else "qavg_pool"
        tags = {"acc64"} if op != "qmax" and nd <= 3 else set()
        if wid in ("2d-k2", "2d-k3-s2-p1", "2d-k23-s12-pairs"):
            tags |= {"idx64"}
        yield Case(f"{op}-{dtype}-{layout}-{wid}", qinputs(shape, dtype),
                   quantized(dtype, lambda q, w=w, L=L, f=call: f(q, w, L)), True,
                   requests=None if nd > 3 else (kernels,),
                   # the word kernels' plan spans 4 windows along W: no static window
                   static_k=None if nd > 3 or kernels.endswith("_words") else w.static_k,
                   tags=frozenset(tags))
    adaptive = [("1d-10to3", (2, 5), (10,), (3,)), ("2d-7x9to3x4", (2, 5), (7, 9), (3, 4)),
                ("2d-8x8to4x2-divides", (2, 5), (8, 8), (4, 2)),
                ("3d-5x6x7to2x3x4", (1, 5), (5, 6, 7), (2, 3, 4)),
                ("4d-host-fallback", (2,), (3, 3, 4, 4), (2, 2, 1, 3))]
    for (gid, lead, spatial, out), layout, dtype in itertools.product(
            adaptive, ("NCHW", "NHWC"), QDTYPES):
        requant = dict(out_scale=0.11, out_zero_point=-1 if dtype == "int8" else 9)
        yield Case(f"qadaptive-{dtype}-{layout}-{gid}",
                   qinputs(shaped(lead, spatial, layout), dtype),
                   quantized(dtype, lambda q, o=out, L=layout, kw=requant:
                             Q.adaptive_avg_pool(q, o, layout=L, **kw)), True,
                   requests=None if len(spatial) > 3 else ("qavg_adaptive",),
                   tags=frozenset({"acc64", "idx64"} if len(spatial) <= 3 else ()))
    for (gid, shape, nd, layout, _, launches), dtype in itertools.product(GLOBALS, QDTYPES):
        yield Case(f"qglobal-{dtype}-{layout}-{gid}", qinputs(shape, dtype),
                   quantized(dtype, lambda q, nd=nd, L=layout:
                             Q.global_avg_pool(q, spatial_dims=nd, layout=L, out_scale=0.02)),
                   True, launches=launches, requests=tuple("q" + k.replace("global", "avg_global")
                                                           for k in launches),
                   tags=frozenset({"acc64", "idx64"}))


#: NCHW windows with OW % 4 == 0 (the word kernels qmax_pool_words / qavg_pool_words): id,
#: lead, spatial, kernel, stride, padding, dilation, ceil mode; IW % 8 == 0 loads 8 bytes.
QWORD_WINDOWS = [
    ("2d-k2", (2, 3), (8, 24), 2, None, 0, 1, False),
    ("2d-k2-ceil-odd-rows", (2, 3), (7, 16), 2, None, 0, 1, True),
    ("2d-k3-s2-p1", (2, 3), (9, 16), 3, 2, 1, 1, False),
    ("2d-k3-s2-ceil", (2, 3), (7, 16), 3, 2, 0, 1, True),
    ("2d-k3-s3-odd-stride", (2, 3), (6, 24), 3, 3, 0, 1, False),
    ("2d-k3-s1-p1", (1, 3), (6, 16), 3, 1, 1, 1, False),
    ("2d-k23-s1-p01-iw12", (2, 3), (5, 12), (2, 3), 1, (0, 1), 1, False),
    ("2d-k2-s2-p1-d2", (2, 3), (6, 16), 2, 2, 1, 2, False),
    ("1d-k3-s2-p1", (2, 5), (32,), (3,), (2,), 1, 1, False),
    ("3d-k2", (1, 3), (4, 6, 8), (2, 2, 2), None, 0, 1, False),
]


#: the quantized window ops, and ties to even at the input's scale: averages of 2 or 4 taps
#: tie, so the word kernel's downward threshold correction is on
QWORD_OPS = dict(QWINDOW_OPS, **{"qavg-half-to-even": lambda q, w, L: Q.avg_pool(
    q, w.kernel, w.stride, w.padding, w.ceil, rounding="half_to_even", layout=L)})


def quantized_word_cases():
    for (wid, lead, spatial, k, s, p, d, ceil), (op, call), dtype in itertools.product(
            QWORD_WINDOWS, QWORD_OPS.items(), QDTYPES):
        if op != "qmax" and d != 1:
            continue
        w = Window(wid, lead, spatial, k, s, p, d, ceil)
        kernel = "qmax_pool_words" if op == "qmax" else "qavg_pool_words"
        tags = {"idx64"} | ({"acc64"} if op != "qmax" else set())
        yield Case(f"{op}-{dtype}-NCHW-words-{wid}", qinputs(lead + spatial, dtype),
                   quantized(dtype, lambda q, w=w, f=call: f(q, w, "NCHW")), True,
                   requests=(kernel,), tags=frozenset(tags))


#: 2-D NCHW 2 x 2 windows of stride 2 over rows of whole 16-byte packs (the pair kernels
#: qmax_pool_pairs / qavg_pool_pairs, 8 outputs per thread): id, shape, ceil mode. Floor mode
#: drops an odd last row; planes of one tile row pack several per block.
QPAIR_SHAPES = [("rows-of-2-tiles", (2, 3, 8, 32), False), ("odd-rows", (3, 2, 7, 48), False),
                ("ceil-even", (1, 5, 6, 16), True), ("many-small-planes", (2, 40, 2, 16), False)]


def quantized_pair_cases():
    for (pid, shape, ceil), (op, call), dtype in itertools.product(
            QPAIR_SHAPES, QWORD_OPS.items(), QDTYPES):
        w = Window(pid, shape[:2], shape[2:], 2, None, 0, 1, ceil)
        kernel = "qmax_pool_pairs" if op == "qmax" else "qavg_pool_pairs"
        yield Case(f"{op}-{dtype}-NCHW-pairs-{pid}", qinputs(shape, dtype),
                   quantized(dtype, lambda q, w=w, f=call: f(q, w, "NCHW")), True,
                   requests=(kernel,))


def natural_int64_accumulator_cases():
    """Windows of 8421505 > 2**31 / 255 taps take int64 accumulators without any hook."""
    taps = 2 ** 31 // 255 + 1
    cases = [("qadaptive", (1, 1, taps, 1), "NCHW", ("qavg_adaptive",),
              lambda q: Q.adaptive_avg_pool(q, (1, 2))),
             ("qglobal", (1, taps), "NCHW", ("qavg_global_block", "qavg_global_lanes"),
              lambda q: Q.global_avg_pool(q, spatial_dims=1)),
             ("qglobal", (1, taps, 1), "NHWC", ("qavg_global_channels",) * 2,
              lambda q: Q.global_avg_pool(q, spatial_dims=1, layout="NHWC"))]
    for op, shape, layout, kernels, call in cases:
        yield Case(f"{op}-int8-{layout}-{taps}-taps", qinputs(shape, "int8"),
                   quantized("int8", call), True, requests=kernels, paths=frozenset({"acc64"}))


# ----------------------------------------------------------------------------- planes > 65535

def many_plane_cases():
    """More planes than grid y holds: the planner puts the rest on grid z. Small planes are
    packed 64 to a block (block z), so the ``grid64`` hook lowers grid y's limit to 64 rather
    than launching 2**22 planes; unhooked, the same cases run packed on grid y."""
    n = 66000
    f32 = [
        # (2, 3) planes: a 2x2 window covering a plane would run as the global max
        ("max", (1, n, 2, 3), "NCHW", lambda x: gpupool.max_pool(x, 2), True),
        ("max-idx", (1, n, 2, 2), "NCHW", lambda x: gpupool.max_pool(x, 2, return_indices=True),
         True),
        ("max", (n, 2, 3, 1), "NHWC", lambda x: gpupool.max_pool(x, 2, layout="NHWC"), True),
        ("avg-cip", (1, n, 2, 2), "NCHW",
         lambda x: gpupool.avg_pool(x, 2, 2, ((1, 1), (0, 0)), count_include_pad=True), True),
        ("lp2", (n, 1, 2), "NCHW", lambda x: gpupool.lp_pool(x, 2, (2,)), True),
        ("amax-idx", (n, 3), "NCHW",
         lambda x: gpupool.adaptive_max_pool(x, (2,), return_indices=True), True),
        ("aavg", (n, 3), "NCHW", lambda x: gpupool.adaptive_avg_pool(x, (2,)), True),
        ("gmax", (n, 1, 1), "NHWC",
         lambda x: gpupool.global_max_pool(x, spatial_dims=1, layout="NHWC"), True),
        ("gavg", (n, 1, 1), "NHWC",
         lambda x: gpupool.global_avg_pool(x, spatial_dims=1, layout="NHWC"), False),
    ]
    for op, shape, layout, call, exact in f32:
        packed = not op.startswith("g")  # global NHWC: one block per batch row, on grid z
        yield Case(f"{op}-float32-{layout}-{'x'.join(map(str, shape))}",
                   random_input(shape, "float32", "max" if "max" in op else "sum"), call, exact,
                   tags=frozenset({"grid64"} if packed else ()),
                   paths=frozenset(() if packed else {"gridz"}))
    q = [("qmax", (1, n, 2, 2), "NCHW", lambda q: Q.max_pool(q, 2)),
         ("qmax", (n, 2, 2, 4), "NHWC", lambda q: Q.max_pool(q, 2, layout="NHWC")),
         ("qavg-cip", (1, n, 2, 2), "NCHW",
          lambda q: Q.avg_pool(q, 2, 2, ((1, 1), (0, 0)), count_include_pad=True)),
         ("qadaptive", (n, 3), "NCHW", lambda q: Q.adaptive_avg_pool(q, (2,)))]
    for op, shape, layout, call in q:
        yield Case(f"{op}-int8-{layout}-{'x'.join(map(str, shape))}", qinputs(shape, "int8"),
                   quantized("int8", call), True, tags=frozenset({"grid64"}))
    yield Case(f"qglobal-int8-NHWC-{n}x1x1", qinputs((n, 1, 1), "int8"),
               quantized("int8", lambda q: Q.global_avg_pool(q, spatial_dims=1, layout="NHWC")),
               True, requests=("qavg_global_channels",))


# ----------------------------------------------------------------------------- non-contiguous

def misaligned(a, offset=1):
    """A C-contiguous copy of ``a`` ``offset`` elements past the start of a fresh buffer (1-byte
    codes, offset 1: not 4-byte aligned), with array methods only, so it works on NumPy and
    CuPy alike."""
    flat = a.reshape(-1)
    view = flat.repeat(2)[offset:flat.size + offset]
    view[...] = flat
    return view.reshape(a.shape)


def strided_cases():
    """Strided and transposed views on both sides (the CUDA backend copies them first), and a
    contiguous but misaligned buffer (no 4-channel words)."""
    every_other = lambda a: a[..., ::2]  # noqa: E731
    views = [
        ("max-idx-float32-NCHW-k3s2p1-last-axis-step2", (2, 3, 9, 20), "float32", "max",
         lambda x: gpupool.max_pool(x, 3, 2, 1, return_indices=True), True, every_other),
        ("avg-float64-NCHW-k2-transposed-HW", (2, 3, 8, 6), "float64", "sum",
         lambda x: gpupool.avg_pool(x, 2, 1, count_include_pad=True), True,
         lambda a: a.swapaxes(-1, -2)),
        ("lp3.5-float16-NHWC-k3-channel-step2", (2, 7, 6, 10), "float16", "sum",
         lambda x: gpupool.lp_pool(x, 3.5, 3, 1, 1, layout="NHWC"), False, every_other),
        ("amax-int16-NCHW-7x9to3x4-reversed", (2, 3, 7, 9), "int16", "max",
         lambda x: gpupool.adaptive_max_pool(x, (3, 4)), True, lambda a: a[:, ::-1]),
        ("gavg-float32-NCHW-300x301-plane-step2", (2, 4, 300, 301), "float32", "plain",
         gpupool.global_avg_pool, False, lambda a: a[:, ::2]),
        ("gmax-uint8-NHWC-30x30-batch-step2", (4, 30, 30, 3), "uint8", "max",
         lambda x: gpupool.global_max_pool(x, layout="NHWC"), True, lambda a: a[::2]),
        # 2-byte elements in fours: every plane starts and ends off an 8-byte boundary
        ("gavg-float16-NCHW-4x6-misaligned", (2, 3, 4, 6), "float16", "plain",
         gpupool.global_avg_pool, False, misaligned),
        ("gmax-int16-NCHW-7x7-misaligned", (2, 3, 7, 7), "int16", "max",
         gpupool.global_max_pool, True, misaligned),
        ("gmax-bfloat16-NCHW-5x5-misaligned", (2, 3, 5, 5), "bfloat16", "max",
         gpupool.global_max_pool, True, misaligned),
    ]
    for cid, shape, dtype, values, call, exact, view in views:
        yield Case(cid, random_input(shape, dtype, values), call, exact, view=view)
    # channel packs: a strided view is copied (aligned: packs); an input off a 16-byte
    # boundary takes the general walk; an `out` off one stores a channel at a time
    for dtype in FLOATS:
        yield Case(f"avg-{dtype}-NHWC-C8-k3s1p1-channel-step2", random_input(
            (2, 7, 6, 16), dtype, "sum"), lambda x: gpupool.avg_pool(x, 3, 1, 1, layout="NHWC"),
            True, view=every_other, requests=("avg_pool_packs",))
        yield Case(f"max-{dtype}-NHWC-C8-k3s2p1-misaligned", random_input(
            (2, 9, 8, 8), dtype, "max"), lambda x: gpupool.max_pool(x, 3, 2, 1, layout="NHWC"),
            True, view=misaligned, requests=("max_pool",))
        yield Case(f"max-{dtype}-NHWC-C8-k2-out-misaligned", random_input(
            (2, 8, 6, 8), dtype, "max"), lambda x: gpupool.max_pool(
                x, 2, layout="NHWC", out=misaligned(x[:, ::2, ::2].copy())),
            True, requests=("max_pool_packs",))
    for layout, shape in (("NCHW", (2, 5, 9, 8)), ("NHWC", (2, 9, 8, 16))):
        yield Case(f"qmax-int8-{layout}-k3s2-last-axis-step2", qinputs(shape, "int8"),
                   quantized("int8", lambda q, L=layout: Q.max_pool(q, 3, 2, 1, layout=L)), True,
                   view=every_other)
        yield Case(f"qavg-uint8-{layout}-k2-last-axis-step2", qinputs(shape, "uint8"),
                   quantized("uint8", lambda q, L=layout: Q.avg_pool(q, 2, 1, layout=L)), True,
                   view=every_other)
    yield Case("qmax-int8-NHWC-C8-misaligned", qinputs((2, 9, 8, 8), "int8"),
               quantized("int8", lambda q: Q.max_pool(q, 3, 2, 1, layout="NHWC")), True,
               view=misaligned, requests=("max_pool",))
    # NCHW word and pair kernels: 8 bytes off a 16-byte boundary loads 8 bytes, 4 off an 8-byte
    # boundary words; 1 byte off, one code each
    for offset, (qmax, qavg) in ((8, ("qmax_pool_words", "qavg_pool_words")),
                                 (4, ("qmax_pool_words", "qavg_pool_words")),
                                 (1, ("max_pool", "qavg_pool"))):
        view = lambda a, o=offset: misaligned(a, o)  # noqa: E731
        yield Case(f"qmax-int8-NCHW-words-k3s2p1-offset{offset}", qinputs((2, 3, 9, 16), "int8"),
                   quantized("int8", lambda q: Q.max_pool(q, 3, 2, 1)), True, view=view,
                   requests=(qmax,))
        yield Case(f"qavg-uint8-NCHW-words-k2-offset{offset}", qinputs((2, 3, 8, 16), "uint8"),
                   quantized("uint8", lambda q: Q.avg_pool(q, 2)), True, view=view,
                   requests=(qavg,))


# ----------------------------------------------------------------------------- row tiles

def row_tile_cases():
    """Each row-tile kernel (row_tiles.ROW_TILE_WINDOWS: windows, W strides and W dilations; W
    pads up to half the window): max values, max values and indices, and averages of rows of
    64 elements (aligned packs, from every lead a pad gives) and of 37 (a load per column; a
    2-D max then takes the general walk), and of 37 and 38 in an input that ends on a pack
    (shifted packs); and inputs one element past an aligned start, which load a column at a
    time or take the general walk; 3-D max, with D taps (also in shifted packs) and with one D
    tap per slice (values: the slices as planes; with indices, which count the slices, the D
    taps at run time)."""
    maxes = (("max", _max(False), "max_pool"), ("max-idx", _max(True), "max_pool_indices"))
    for (kh, kw, sw, dw), dtype in itertools.product(row_tiles.ROW_TILE_WINDOWS,
                                                     row_tiles.ROW_TILE_DTYPES):
        lead, kernel, stride, dilation = (((2, 3, 7), (kh, kw), (2, sw), (1, dw)) if kh > 1
                                          else ((2, 3), (kw,), (sw,), (dw,)))
        name = f"{dtype}-NCHW-rows-k{kh}x{kw}-s{sw}-d{dw}"
        for pad, width in [(p, 64) for p in range(kw // 2 + 1)] + [(kw // 2, 37)]:
            shape = lead + (width,)
            ops = [(op, "max", call, (base if kh > 1 and width == 37 else f"{base}_rows",))
                   for op, call, base in maxes]
            ops.append(("avg-cip", "sum", _avg(cip=True), ("avg_pool_rows",)))
            for op, values, call, kernels in ops:
                w = Window(name, lead[:2], shape[2:], kernel, stride, pad, dilation)
                yield Case(f"{op}-{name}-p{pad}-w{width}", random_input(shape, dtype, values),
                           lambda x, w=w, f=call: f(x, w, "NCHW"), True, requests=kernels)
        # rows off the packs in an input that ends on one: shifted packs (2-D max and
        # average, 1-D of 4-byte elements), at each W pad and with a window past the row's end
        # (ceil mode); rows of 37 and 38, 4 planes of them
        ahead = (2, 4) + lead[2:]
        for pad, width, ceil in [(p, 37, False) for p in range(kw // 2 + 1)] + [(0, 38, True)]:
            shape = ahead + (width,)
            ops = [(op, "max", call, (f"{base}_rows",)) for op, call, base in maxes]
            ops.append(("avg-cip", "sum", _avg(cip=True), ("avg_pool_rows",)))
            for op, values, call, kernels in ops:
                w = Window(name, ahead[:2], shape[2:], kernel, stride, pad, dilation, ceil)
                yield Case(f"{op}-{name}-p{pad}-w{width}-shifted" + ("-ceil" if ceil else ""),
                           random_input(shape, dtype, values),
                           lambda x, w=w, f=call: f(x, w, "NCHW"), True, requests=kernels)
        shape = lead + (64,)
        w = Window(name, lead[:2], shape[2:], kernel, stride, 1, dilation)
        for op, call, base in maxes:
            yield Case(f"{op}-{name}-p1-w64-misaligned", random_input(shape, dtype, "max"),
                       lambda x, w=w, f=call: f(x, w, "NCHW"), True, view=misaligned,
                       requests=(base if kh > 1 else f"{base}_rows",))
        # 3-D max and average: windows of 2 D taps (D pad 1, ceil mode: windows of one valid
        # D tap and of none), the D taps at run time, each W pad (H windows over 1; else the
        # general walk); one D tap per window at its own slice
        spatial3 = (3, 7, 64)
        kernel3, stride3 = (2, kh, kw), (1, 2 if kh > 1 else 1, sw)
        ops3 = [(op, "max", call, base) for op, call, base in maxes] + [
            ("avg-cip", "sum", _avg(cip=True), "avg_pool")]
        for op, values, call, base in ops3:
            for pad in range(kw // 2 + 1):
                w = Window(name, lead[:2], spatial3, kernel3, stride3, (1, kh // 2, pad),
                           (1, 1, dw), True)
                yield Case(f"{op}-3d-{name}-p{pad}",
                           random_input(lead[:2] + spatial3, dtype, values),
                           lambda x, w=w, f=call: f(x, w, "NCHW"), True,
                           requests=(f"{base}_depth_rows" if kh > 1 else base,))
            if kh > 1:  # rows off the packs: shifted packs, the D taps at run time
                w = Window(name, (2, 4), spatial3[:2] + (37,), kernel3, stride3,
                           (1, kh // 2, kw // 2), (1, 1, dw), True)
                yield Case(f"{op}-3d-{name}-shifted",
                           random_input((2, 4) + spatial3[:2] + (37,), dtype, values),
                           lambda x, w=w, f=call: f(x, w, "NCHW"), True,
                           requests=(f"{base}_depth_rows",))
            w = Window(name, lead[:2], spatial3, (1,) + kernel3[1:], stride3,
                       (0, kh // 2, kw // 2), (1, 1, dw))
            yield Case(f"{op}-3d-slices-{name}", random_input(lead[:2] + spatial3, dtype, values),
                       lambda x, w=w, f=call: f(x, w, "NCHW"), True,
                       requests=(f"{base}_rows" if op != "max-idx" else
                                 "max_pool_indices_depth_rows" if kh > 1 else base,))


# ----------------------------------------------------------------------------- small device

def small_device_cases():
    """On a 1-SM device these few planes fill the GPU: each thread computes several output
    rows (NHWC: positions), in one chunk per plane or several."""
    cases = [  # op, dtype, layout, shape, call, exact
        # (float64: float16 and float32 take the row tiles, one output row per thread)
        ("max", "float64", "NCHW", (8, 8, 100), lambda x: gpupool.max_pool(x, 3, 1, 1), True),
        ("max-idx", "int32", "NCHW", (4, 16, 100),
         lambda x: gpupool.max_pool(x, (2, 3), 1, 1, 2, return_indices=True), True),
        ("avg", "float16", "NCHW", (8, 8, 100), lambda x: gpupool.avg_pool(x, 2, 1), True),
        # averages go two outputs at a time: odd row counts, W over several block widths,
        # padding and ceil mode
        ("avg-ceil-cip", "float64", "NCHW", (8, 9, 300),
         lambda x: gpupool.avg_pool(x, 3, 2, 1, True, True), True),
        ("avg-p1", "float64", "NHWC", (8, 5, 7, 64),
         lambda x: gpupool.avg_pool(x, 3, 1, 1, layout="NHWC"), True),
        ("lp2", "float64", "NHWC", (8, 4, 4, 64),
         lambda x: gpupool.lp_pool(x, 2, 2, 1, layout="NHWC"), True),
        ("max-3d", "float32", "NHWC", (8, 2, 2, 4, 64),
         lambda x: gpupool.max_pool(x, (2, 2, 2), 1, 1, layout="NHWC"), True),
        ("aavg", "float32", "NCHW", (8, 17, 130),
         lambda x: gpupool.adaptive_avg_pool(x, (8, 100)), True),
        ("amax-idx", "float32", "NHWC", (8, 9, 9, 64),
         lambda x: gpupool.adaptive_max_pool(x, (4, 4), return_indices=True, layout="NHWC"), True),
    ]
    for op, dtype, layout, shape, call, exact in cases:
        yield Case(f"{op}-{dtype}-{layout}-{'x'.join(map(str, shape))}",
                   random_input(shape, dtype, "max" if "max" in op else "sum"), call, exact,
                   paths=frozenset({"rows"}))
    # OW = 102: not whole words, so the per-code kernel with several rows per thread
    for dtype, shape, layout in (("int8", (8, 8, 102), "NCHW"), ("uint8", (8, 4, 4, 64), "NHWC")):
        yield Case(f"qavg-{dtype}-{layout}-{'x'.join(map(str, shape))}", qinputs(shape, dtype),
                   quantized(dtype, lambda q, L=layout: Q.avg_pool(q, 3, 1, 1, layout=L)), True,
                   paths=frozenset({"rows"}))
    yield Case("qmax-int8-NHWC-vmax4-8x4x4x64", qinputs((8, 4, 4, 64), "int8"),
               quantized("int8", lambda q: Q.max_pool(q, 2, 1, 1, layout="NHWC")), True,
               paths=frozenset({"rows"}))
    # (int32 indices on NCHW: int64 ones take the tiles, which have no rows)
    for layout, lead, spatial, idt in (("NCHW", (8,), (8, 100), "int32"),
                                       ("NHWC", (8, 64), (4, 4), "int64")):
        yield unpool_case(Unpool("2d-k2-rows", lead, spatial, 2, gather=True), layout,
                          "float32", idt, frozenset({"rows"}))


def exact_row_tile_cases():
    """Row tiles whose grid makes a wave of blocks on a 1-SM device: blocks a row's tiles wide
    (7, 9, 2, 5 and 25 tiles), warps running on into the next row and plane, partial last
    tiles, planes packed along block z."""
    cases = [  # op, dtype, shape, call
        ("max", "float16", (4, 8, 56, 56), lambda x: gpupool.max_pool(x, 3, 2, 1)),
        ("avg", "float32", (4, 8, 35, 35), lambda x: gpupool.avg_pool(x, 3, 1, 1)),
        ("avg-packed", "float32", (16, 16, 14, 14), lambda x: gpupool.avg_pool(x, 2)),
        ("max-3d", "float16", (4, 8, 8, 40, 40), lambda x: gpupool.max_pool(x, 2)),
        ("avg-3d-ceil", "float16", (4, 8, 8, 28, 28),
         lambda x: gpupool.avg_pool(x, 2, 2, 1, True)),
        ("max-1d", "float16", (8, 16, 300), lambda x: gpupool.max_pool(x, (3,), 3)),
    ]
    for op, dtype, shape, call in cases:
        yield Case(f"exact-rows-{op}-{dtype}-{'x'.join(map(str, shape))}",
                   random_input(shape, dtype, "max" if "max" in op else "sum"), call, True,
                   paths=frozenset({"exact"}))


# ----------------------------------------------------------------------------- the tables

CASES = (list(window_cases()) + list(pack_cases()) + list(whole_plane_cases()) + list(unpool_cases()) + list(adaptive_cases())
         + list(global_cases()) + list(quantized_cases()) + list(quantized_word_cases())
         + list(quantized_pair_cases())
         + list(many_plane_cases()) + list(row_tile_cases())
         + list(strided_cases()) + list(natural_int64_accumulator_cases()))
HOOKED = ([("idx64", c) for c in CASES if "idx64" in c.tags]
          + [("acc64", c) for c in CASES if "acc64" in c.tags]
          + [("idx64+acc64", c) for c in CASES if {"acc64", "idx64"} <= c.tags]
          + [("grid64", c) for c in CASES if "grid64" in c.tags]
          + [("small-device", c) for c in small_device_cases()]
          + [("small-device", c) for c in exact_row_tile_cases()])
assert len({c.id for c in CASES}) == len(CASES)


def apply_hooks(mp, hooks: str) -> None:
    """Install the named test hooks (see the module docstring) with ``mp``; the caller clears
    the memoized plans before and after."""
    from gpupool.cuda import grid, launching, tiled_gathers
    if "idx64" in hooks:
        for module in (grid, planner):
            mp.setattr(module, "INT32_LIMIT", 100)
    if "acc64" in hooks:
        mp.setattr(QS, "accumulator_dtype", lambda taps: ("int64", 255 * taps))
    if "grid64" in hooks:
        for module in (grid, row_tiles, tiled_gathers):
            mp.setattr(module, "GRID_YZ_MAX", 64)
    if "small-device" in hooks:
        mp.setattr(launching, "device_info", lambda device_id: planner.DeviceInfo(
            name="test: 1 SM", sm_count=1))


def clear_plans() -> None:
    from gpupool.cuda import launching
    PLAN.cache_clear()
    launching.clear_launches()
    QS.avg_plan.cache_clear()
    gpupool.plans.clear()


# ----------------------------------------------------------------------------- running a case

@dataclass
class Record:
    plans: list = field(default_factory=list)  # (spec, Plan) of every planner.plan call
    names: list = field(default_factory=list)  # (source file, name expression) asked for


def record(mp, kernel=None) -> Record:
    """Record plans and kernel requests of the CUDA backends from now on (``kernel``: what to
    hand out instead of the compiled kernel, e.g. a no-op)."""
    from gpupool.cuda import kernels, launching, names
    rec, real_kernel = Record(), kernels.kernel

    def plan_spy(spec, device=None, **options):
        p = PLAN(spec, device, **options)
        rec.plans.append((spec, p))
        return p

    def kernel_spy(name):
        rec.names.append((names.source_file(name), name))
        return kernel if kernel is not None else real_kernel(name)
    mp.setattr(planner, "plan", plan_spy)
    mp.setattr(kernels, "kernel", kernel_spy)
    launching.clear_launches()  # launch steps ask for their kernels again
    return rec


def unpack(result):
    """A tuple of ``(array, scale, zero point)`` (None for float results)."""
    results = result if isinstance(result, tuple) else (result,)
    return [(r.data, r.scale, r.zero_point) if isinstance(r, Q.QArray) else (r, None, None)
            for r in results]


def compare(case: Case, got, want, cupy) -> None:
    got, want = unpack(got), unpack(want)
    assert len(got) == len(want)
    for (g, gs, gz), (w, ws, wz) in zip(got, want):
        assert type(w) is np.ndarray, type(w)
        assert isinstance(g, cupy.ndarray), f"CuPy in gave {type(g)} out"
        assert (gs, gz) == (ws, wz)
        g = cupy.asnumpy(g)
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if w.dtype == numpy_dtype("bfloat16"):  # every NaN is 0x7FFF: bit for bit, NaNs too
            if case.exact:
                assert_array_equal(g.view(np.uint16), w.view(np.uint16))
            else:
                assert_allclose(g.astype(np.float32), w.astype(np.float32), equal_nan=True,
                                **TOL["bfloat16"])
        elif w.dtype.kind == "f" and case.exact:  # bit for bit, but any NaN for a NaN
            nan = np.isnan(w)
            assert_array_equal(np.isnan(g), nan)
            assert_array_equal(g[~nan].view(f"u{w.itemsize}"), w[~nan].view(f"u{w.itemsize}"))
        elif w.dtype.kind == "f":
            assert_allclose(g, w, equal_nan=True, **TOL[w.dtype.name])
        else:
            assert_array_equal(g, w)


def run_case(case: Case, mp, cupy) -> Record:
    """Run ``case`` on NumPy and on CuPy, compare, and return what the CUDA run recorded."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    host = case.inputs(rng)
    view = case.view or (lambda a: a)
    want = case.run(view(host[0]), *host[1:])
    dev = [cupy.asarray(a) for a in host]
    rec = record(mp)
    got = case.run(view(dev[0]), *dev[1:])
    compare(case, got, want, cupy)
    launches = [la for _, p in rec.plans for la in p.launches]
    if case.launches is not None:
        assert tuple(la.kernel for la in launches) == case.launches, [str(p) for _, p in rec.plans]
    if case.requests is not None:
        assert tuple(n.split("<")[0] for _, n in rec.names) == case.requests, rec.names
    if case.static_k is not None:
        assert [planner.static_window(s) for s, _ in rec.plans] == [case.static_k], rec.plans
    check_paths(rec, case.paths)
    return rec


def check_paths(rec: Record, paths) -> None:
    """``idx64``: 64-bit index variants only; ``acc64``: int64 accumulators in every quantized
    average kernel; ``rows``: the (first) launch computes several rows per thread; ``gridz``
    (and the ``grid64`` hook): every launch spills onto grid z; ``exact``: the launch is of
    row tiles, its blocks a thread per tile of an output row wide."""
    assert rec.names or not paths
    if "idx64" in paths:
        assert all(p.index_type == "long long" for _, p in rec.plans), rec.plans
        # an unpooling's check of indices takes the index type of the pooling they come
        # from, whose offsets are smaller than the scatter's
        unpooling = any(n.startswith("max_unpool") for _, n in rec.names)
        assert all("long long" in n for _, n in rec.names
                   if not (unpooling and n.startswith("max_index_check<"))), rec.names
    if "acc64" in paths:
        accs = [n.split("<")[1].split(", ")[1] for _, n in rec.names if n.startswith("qavg")]
        assert accs and set(accs) == {"long long"}, rec.names
    if paths & {"grid64", "gridz"}:
        launches = [la for _, p in rec.plans for la in p.launches]
        assert all(la.grid[2] > 1 for la in launches), launches
    if "rows" in paths:
        assert rec.plans[0][1].launches[0].rows > 1, str(rec.plans[0][1])
    if "exact" in paths:
        spec, p = rec.plans[0]
        la = p.launches[0]
        tiles = -(-spec.out_spatial[-1] // row_tiles.ROW_TILE)
        assert la.kernel.endswith("_rows") and la.block[0] == tiles, str(p)


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cuda_matches_numpy(case, cupy, monkeypatch):
    run_case(case, monkeypatch, cupy)


@pytest.fixture
def hooked(request, monkeypatch):
    """The hooks named by the parameter, installed (plans cleared before and after)."""
    clear_plans()
    apply_hooks(monkeypatch, request.param)
    yield request.param
    clear_plans()


@pytest.mark.parametrize("hooked, case", HOOKED, ids=[f"{h}-{c.id}" for h, c in HOOKED],
                         indirect=["hooked"])
def test_cuda_matches_numpy_under_hooks(hooked, case, cupy, monkeypatch):
    check_paths(run_case(case, monkeypatch, cupy), set(hooked.split("+")))


# ----------------------------------------------------------------------------- tied elements

def tie_input(kind, dtype):
    """One plane of 8 whose 2-tap windows tie: zeros of both signs, or NaNs of several signs
    and payloads (``v > m or isnan(v)``: ties keep the first tap, NaNs the last)."""
    dtype = numpy_dtype(dtype)
    u = f"u{dtype.itemsize}"
    if kind == "signed-zeros":
        return np.array([[-0.0, 0.0, 0.0, -0.0, 1.0, -0.0, -0.0, 1.0]], dtype)
    x = np.array([[np.nan, np.nan, 2, np.nan, 0.5, np.nan, 3, -np.inf]], dtype)
    bits = x.view(u)
    bits[0, 1] |= 1  # another payload
    bits[0, 3] |= np.array(1, u) << (8 * x.itemsize - 1)  # negative NaN
    return x


TIE_OPS = {
    "max": lambda x: gpupool.max_pool(x, (2,)),
    "max-idx": lambda x: gpupool.max_pool(x, (2,), return_indices=True)[0],
    "amax": lambda x: gpupool.adaptive_max_pool(x, (4,)),
    "amax-idx": lambda x: gpupool.adaptive_max_pool(x, (4,), return_indices=True)[0],
}
SIGNED_ZEROS = ("NumPy backend, values only (max_pool with indices returns x[indices]): tied "
                "zeros give the last tap (np.maximum), not the first: max_pool/adaptive_max_pool "
                "of [-0., 0., 0., -0., 1., -0., -0., 1.] in 2-tap windows give [+0, -0, 1, 1] "
                "([+0, +0, 1, 1] for float16); CUDA and tests/reference.py give [-0, +0, 1, 1]")
NAN_FIRST = ("NumPy backend, values only (max_pool with indices returns x[indices]): of two NaNs "
             "in a window it returns the first NaN's bits (np.maximum), where CUDA and "
             "tests/reference.py take the last: the window [nan, nan|1] gives nan (x[0]) on "
             "NumPy, nan|1 (x[1]) on CUDA")
def tie_params():
    """Every float dtype; bfloat16 with zeros only (its every NaN comes out as 0x7FFF, see
    tests/test_bfloat16.py). float16's NaNs come out as 0x7FFF too, values only or not, on
    both backends (as an H100 narrows every NaN to float16), so NumPy's first NaN is right."""
    for kind, dtype, backend in itertools.product(
            ("signed-zeros", "nan-payloads"), FLOATS, ("numpy", "cupy")):
        if kind == "nan-payloads" and dtype == "bfloat16":
            continue
        reason = SIGNED_ZEROS if kind == "signed-zeros" else NAN_FIRST
        fails = backend == "numpy" and (kind, dtype) != ("nan-payloads", "float16")
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if fails else []
        yield pytest.param(kind, dtype, backend, marks=marks, id=f"{kind}-{dtype}-{backend}")


@pytest.mark.parametrize("kind, dtype, backend", list(tie_params()))
def test_max_returns_the_winning_element_bit_for_bit(kind, dtype, backend, cupy):
    """Bit patterns the random inputs never hold: every max op returns exactly x[i], i the
    reference's index (first of tied taps, last NaN); a float16 NaN as 0x7FFF."""
    import reference as ref
    x = tie_input(kind, dtype)
    u = f"u{x.itemsize}"
    winners = x[0, ref.max_pool(x.astype(np.float64), (2,))[1][0]]
    want = winners.view(u).tolist()
    if dtype == "float16":
        want = [0x7FFF if np.isnan(v) else b for v, b in zip(winners, want)]
    xb = cupy.asarray(x) if backend == "cupy" else x
    got = {op: cupy.asnumpy(f(xb)).view(u)[0].tolist() for op, f in TIE_OPS.items()}
    assert got == dict.fromkeys(TIE_OPS, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_row_tiles_give_an_equal_value_of_tied_zeros(dtype, cupy, monkeypatch):
    """The values-only max of the 16-bit float row tiles reduces its taps as stored (HMNMX2,
    separable: each column over the rows, then each window over its columns): tied zeros
    give a zero of either sign, a window holding a NaN 0x7FFF, every other window the
    reference's max; with indices, the winning element itself."""
    import reference as ref
    rng = np.random.default_rng(5)
    x = np.where(rng.random((1, 2, 6, 64)) < 0.5, -0.0, 0.0).astype(numpy_dtype(dtype))
    x[rng.random(x.shape) < 0.1] = 1.5
    x[rng.random(x.shape) < 0.02] = np.nan
    want, where = ref.max_pool(x.astype(np.float64), 3, 2, 1)
    rec = record(monkeypatch)
    got = cupy.asnumpy(gpupool.max_pool(cupy.asarray(x), 3, 2, 1))
    assert [n.split("<")[0] for _, n in rec.names] == ["max_pool_rows"]
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all() and (got.view(np.uint16)[nan] == 0x7FFF).all()
    assert (got[~nan] == want[~nan]).all() and (want == 0).any() and (want == 1.5).any()
    values, indices = gpupool.max_pool(cupy.asarray(x), 3, 2, 1, return_indices=True)
    winners = np.take_along_axis(x.reshape(1, 2, -1), cupy.asnumpy(indices).reshape(1, 2, -1),
                                 2).reshape(want.shape)
    assert (cupy.asnumpy(indices) == where).all()
    assert (cupy.asnumpy(values).view(np.uint16)[~nan] == winners.view(np.uint16)[~nan]).all()


def lane_tie_input(kind: str) -> np.ndarray:
    """A (1, 1, 3, 72) float32 plane whose max over each adaptive window to (1, 1) is decided
    across window columns and column passes of the lane-group kernels (72 columns: 32 lanes
    of 2, 2 passes): ``signed-zeros``, the first zero in row-major order is -0 in a column of
    the second pass, +0 in earlier columns of later rows; ``nan-payloads``, three NaNs whose
    last in row-major order lies in the first column; ``-inf``, every element -inf (the
    first tap, whose value never beats the lowest)."""
    x = np.full((1, 1, 3, 72), -np.inf if kind == "-inf" else -1.0, np.float32)
    if kind == "signed-zeros":
        x[0, 0, 0, 67], x[0, 0, 1, 2], x[0, 0, 2, 0] = -0.0, 0.0, 0.0
    elif kind == "nan-payloads":
        bits = x.view(np.uint32)
        bits[0, 0, 0, 65], bits[0, 0, 1, 20], bits[0, 0, 2, 1] = 0x7FC00001, 0x7FC00002, 0xFFC00003
    return x


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["signed-zeros", "nan-payloads"])
@pytest.mark.parametrize("backend", ["numpy", "cupy"])
def test_adaptive_max_with_indices_keeps_the_row_major_winner(backend, kind, layout, cupy):
    """Windows of many taps (global, and two windows per row): each window's index and bits
    are those of its first tied tap in row-major order (the last NaN) on every backend."""
    import reference as ref
    x = np.concatenate([lane_tie_input(kind)] * 2, -1)
    if layout == "NHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    xb = cupy.asarray(x) if backend == "cupy" else x
    for size in ((1, 1), (1, 2)):
        want = ref.adaptive_max_pool(x.astype(np.float64), size, layout)[1]
        values, indices = gpupool.adaptive_max_pool(xb, size, return_indices=True, layout=layout)
        flat_x = x.view(np.uint32).reshape(-1)  # one plane: indices are flat positions in it
        assert cupy.asnumpy(indices).tolist() == want.tolist()
        assert cupy.asnumpy(values).view(np.uint32).tolist() == flat_x[want].tolist()


@pytest.mark.parametrize("kind", ["signed-zeros", "nan-payloads", "-inf"])
def test_adaptive_max_lane_groups_keep_the_row_major_winner(kind, cupy):
    """The lane-group kernels merge their lanes' maxima by position: a window's max is the
    first tied tap in row-major order (the last NaN), not the first of the lanes' order."""
    import reference as ref
    x = lane_tie_input(kind)
    want_index = int(ref.adaptive_max_pool(x.astype(np.float64), (1, 1))[1].ravel()[0])
    want = x.view(np.uint32).ravel()[want_index]
    values, indices = gpupool.adaptive_max_pool(cupy.asarray(x), (1, 1), return_indices=True)
    wide = gpupool.adaptive_max_pool(cupy.asarray(np.concatenate([x, x], -1)), (1, 2))
    assert cupy.asnumpy(indices).ravel().tolist() == [want_index]
    assert cupy.asnumpy(values).view(np.uint32).ravel().tolist() == [want]
    assert cupy.asnumpy(wide).view(np.uint32).ravel().tolist() == [want, want]


def row_tile_index_input(shape, dtype, kind):
    """``-inf``: every element -inf; ``nan``: every element NaN; ``mixed``: few distinct values
    with -inf and NaN runs (whole windows of them)."""
    if kind != "mixed":
        return np.full(shape, -np.inf if kind == "-inf" else np.nan, numpy_dtype(dtype))
    x = np.random.default_rng(3).integers(-2, 3, shape).astype(np.float64)
    flat = x.reshape(-1)
    flat[::11], flat[5::13], flat[64:72], flat[200:206] = -np.inf, np.nan, -np.inf, np.nan
    return x.astype(numpy_dtype(dtype))


@pytest.mark.parametrize("kind", ["-inf", "nan", "mixed"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil, rows", [
    ((1, 2, 7, 64), (3, 3), 2, 1, 1, False, "max_pool_indices_rows"),
    ((1, 2, 9, 64), (3, 3), 2, 0, 1, True, "max_pool_indices_rows"),  # last windows off the edge
    ((1, 2, 6, 64), (3, 3), 2, ((4, 0), (1, 1)), 1, True, "max_pool_indices_rows"),  # empty
    ((2, 3, 64), (3,), 3, 1, 1, True, "max_pool_indices_rows"),
    ((2, 3, 64), (3,), 3, 0, 1, False, "max_pool_indices_rows"),  # odd rows off 16 bytes
    # warps of 32 whole tiles of a row, and a warp with a tile cut by the row's end
    ((2, 3, 1540), (3,), 3, 1, 1, False, "max_pool_indices_rows"),
    ((1, 2, 4, 520), (3, 3), 1, 1, 1, False, "max_pool_indices_rows"),  # a pair past the warps
    ((2, 3, 64), (5,), 2, 2, 2, True, "max_pool_indices_rows"),  # dilated taps off the edge
    ((2, 3, 64), (5,), 2, ((10, 0),), 2, True, "max_pool_indices_rows"),  # empty, dilated
    ((1, 2, 3, 7, 64), (2, 3, 3), (1, 2, 2), 1, 1, True, "max_pool_indices_depth_rows"),
    ((1, 2, 3, 7, 64), (1, 2, 2), (1, 2, 2), 0, 1, False, "max_pool_indices_depth_rows"),
])
def test_row_tile_indices_name_valid_taps_only(shape, kernel, stride, padding, dilation, ceil,
                                               rows, kind, dtype, cupy, monkeypatch):
    """The row tiles' max with indices (whose loads fill the slots outside the plane with the
    lowest value) names the reference's tap: the first valid one of a window of -inf (never a
    padded slot), the last NaN, -1 for a window with no valid tap; 3-D indices count the
    slices. Each way of storing a tile's indices (a warp's exchange, a lane pair's, a store
    per tile) puts them in place."""
    import reference as ref
    x = row_tile_index_input(shape, dtype, kind)
    want_v, want_i = ref.max_pool(x.astype(np.float64), kernel, stride, padding, dilation, ceil)
    rec = record(monkeypatch)
    got_v, got_i = gpupool.max_pool(cupy.asarray(x), kernel, stride, padding, dilation, ceil,
                                    return_indices=True)
    assert [n.split("<")[0] for _, n in rec.names] == [rows]
    assert_array_equal(cupy.asnumpy(got_i), want_i)
    got_v = cupy.asnumpy(got_v).astype(np.float64)
    assert_array_equal(np.isnan(got_v), np.isnan(want_v))
    assert_array_equal(got_v[~np.isnan(want_v)], want_v[~np.isnan(want_v)])
    if kind != "mixed":
        assert (want_i == -1).any() == isinstance(padding, tuple)


# ----------------------------------------------------------------------------- coverage

def checked_by_backward_ops(name: str) -> bool:
    """Whether only the backward ops ask for kernel ``name``: the check of an adaptive max's
    indices (test_differential_backward's cases ask for it)."""
    return name.startswith("max_index_check<") and name.endswith(", true>")


def test_every_instantiation_is_requested(cupy):
    """All cases together (no-op kernels) ask for every kernel instantiation the host can but
    the backward ops' (test_differential_backward)."""
    from gpupool.cuda import names
    requested = set()
    groups = [("", CASES)] + [(h, [c for g, c in HOOKED if g == h])
                              for h in dict.fromkeys(g for g, _ in HOOKED)]
    for hooks, cases in groups:
        with pytest.MonkeyPatch.context() as mp:
            clear_plans()
            apply_hooks(mp, hooks)
            rec = record(mp, kernel=lambda grid, block, args: None)
            for case in cases:
                host = case.inputs(np.random.default_rng(0))
                case.run(*[cupy.asarray(a) for a in host])
            requested |= set(rec.names)
        clear_plans()
    listed = {n for n in names.instantiations()
              if n[0] != "pool_backward.cu" and not checked_by_backward_ops(n[1])}
    assert requested <= listed | {n for n in names.instantiations()
                                  if checked_by_backward_ops(n[1])}, sorted(requested - listed)
    assert not listed - requested, sorted(listed - requested)
