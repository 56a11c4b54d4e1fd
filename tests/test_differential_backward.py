"""Differential test of the backward ops: the CUDA kernels (CuPy arrays) against the NumPy
backend, bit for bit (any NaN for a NaN); Lp with p other than 1 and 2 within a per-dtype
tolerance (``pow`` differs between libms, in the forward output that the backward recomputes
and in the backward itself).

Cases run through :func:`test_differential.run_case`: every plan and kernel request of the
CUDA run is recorded, so a case asserts the kernel it means to take (none for a host
fallback). Geometries: the window table of ``test_differential`` (pads, SAME, ceil mode,
dilation, empty windows, overlapping and disjoint windows, 1-4 spatial dims) and random ones,
each with every backward op; adaptive sizes growing and shrinking; global poolings of 1-4
spatial dims. Hooks (``test_differential.apply_hooks``): ``idx64``, ``grid64`` and
``small-device``. ``test_every_backward_instantiation_is_requested`` replays every case with
no-op kernels and checks that together they ask for each instantiation of
``pool_backward.cu`` and of the check of an adaptive max's indices
(``gpupool.cuda.names.instantiations()``).
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import gpupool
from gpupool import grad_spec, gradients, spec as S
from gpupool.cuda import names
from dtypes import numpy_dtype
from test_differential import (ADAPTIVES, FLOATS, GLOBALS, WINDOWS, Case, Window, apply_hooks,
                               check_paths, checked_by_backward_ops, clear_plans, make_input,
                               record, run_case, shaped)

pytestmark = pytest.mark.gpu

IDX64_WINDOWS = ("2d-k3-s2-p1", "3d-k323-pairs-d121-ceil", "2d-k5-s2-d2-perdim-ceil")
IDX64_ADAPTIVES = ("2d-7x9to3x4", "3d-5x6x7to2x3x4")
IDX64_GLOBALS = ("lanes16-7x7-1pass", "channels-1pass-7x7", "lanes32-4d")


def strided(a):
    """The values of ``a`` as a non-contiguous view (step 2 along the last axis), with array
    methods only (NumPy and CuPy alike)."""
    return a.repeat(2, axis=-1)[..., ::2]


def grad_for(rng, shape, dtype):
    return (rng.standard_normal(shape) * 3).astype(numpy_dtype(dtype))


def lp_input(rng, shape, dtype):
    """Normal values with zeros (x == 0, and windows whose output is 0)."""
    x = (rng.standard_normal(shape) * 3).astype(numpy_dtype(dtype))
    x[rng.random(shape) < 0.15] = 0
    return x


# ----------------------------------------------------------------------------- random geometry

def random_windows(count: int, seed: int = 20240611) -> list[Window]:
    """Windows of 1-3 spatial dims with random kernel, stride, dilation, padding (ints, pairs,
    SAME, VALID) and ceil mode that the spec accepts."""
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        nd = int(rng.integers(1, 4))
        k = tuple(int(v) for v in rng.integers(1, 5, nd))
        s = tuple(int(v) for v in rng.integers(1, 4, nd))
        d = tuple(int(v) for v in rng.choice([1, 1, 2, 3], nd))
        spatial = tuple((kk - 1) * dd + 1 + int(rng.integers(0, 7 if nd == 3 else 9))
                        for kk, dd in zip(k, d))
        mode = str(rng.choice(["ints", "pairs", "same", "valid"]))
        if mode == "ints":
            padding = tuple(int(rng.integers(0, (kk - 1) * dd // 2 + 2)) for kk, dd in zip(k, d))
        elif mode == "pairs":
            padding = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in k)
        else:
            padding = mode
        ceil = bool(rng.integers(0, 2))
        lead = (2, 3) if nd < 3 else (1, 2)
        try:
            S.window_spec("test", "max", lead + spatial, "float32", k, s, padding, d, ceil,
                          "NCHW", return_indices=True)
        except ValueError:
            continue
        found.append(Window(f"rand{len(found)}-{nd}d", lead, spatial, k, s, padding, d, ceil))
    return found


def random_adaptives(count: int, seed: int = 7) -> list[tuple]:
    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        nd = 1 + i % 3
        spatial = tuple(int(v) for v in rng.integers(1, 10, nd))
        out = tuple(int(v) for v in rng.integers(1, 10, nd))
        found.append((f"rand{i}-{nd}d-{'x'.join(map(str, spatial))}to{'x'.join(map(str, out))}",
                      (2, 3) if nd < 3 else (1, 2), spatial, out))
    return found


# ----------------------------------------------------------------------------- window ops

def _max_case(w: Window, layout: str, dtype: str, shape, index_dtype="int64", view=None):
    def inputs(rng):
        x = make_input(rng, shape, dtype, "max")
        y, idx = gpupool.max_pool(x, w.kernel, w.stride, w.padding, w.dilation, w.ceil,
                                  return_indices=True, layout=layout)
        return grad_for(rng, y.shape, dtype), idx.astype(index_dtype)

    def run(g, idx):
        return gpupool.max_pool_backward(g, (view or (lambda a: a))(idx), shape, w.kernel,
                                         w.stride, w.padding, w.dilation, w.ceil, layout=layout)
    return inputs, run


def _own_max_case(w: Window, dtype: str, shape):
    """:func:`_max_case` through the backward of a max's own indices (autograd's), which the
    GPU takes unchecked."""
    inputs, _ = _max_case(w, "NCHW", dtype, shape)

    def run(g, idx):
        spec = grad_spec.window_grad_spec("max_pool_backward", "max", g.shape, dtype, shape,
                                          w.kernel, w.stride, w.padding, w.dilation, w.ceil,
                                          "NCHW", index_shape=idx.shape, index_dtype="int64")
        return gradients.max_backward_of_own_indices(g, idx, spec)
    return inputs, run


def _avg_case(w: Window, layout: str, dtype: str, shape, cip=False, div=None):
    def inputs(rng):
        y = gpupool.avg_pool(np.zeros(shape), w.kernel, w.stride, w.padding, w.ceil,
                             dilation=w.dilation, layout=layout)
        return (grad_for(rng, y.shape, dtype),)

    def run(g):
        return gpupool.avg_pool_backward(g, shape, w.kernel, w.stride, w.padding, w.ceil, cip,
                                         div, dilation=w.dilation, layout=layout)
    return inputs, run


def _lp_case(w: Window, layout: str, dtype: str, shape, p, view=None):
    def inputs(rng):
        x = lp_input(rng, shape, dtype)
        y = gpupool.lp_pool(x, p, w.kernel, w.stride, w.padding, w.dilation, w.ceil,
                            layout=layout)
        return grad_for(rng, y.shape, dtype), x

    def run(g, x):
        return gpupool.lp_pool_backward(g, (view or (lambda a: a))(x), p, w.kernel, w.stride,
                                        w.padding, w.dilation, w.ceil, layout=layout)
    return inputs, run


#: op id -> (builder, its keyword arguments, exact, kernels asked for: Lp's backward runs
#: the forward first)
LP = ("lp_pool", "lp_window_backward")
WINDOW_OPS = {
    "max": (_max_case, {}, True, ("max_window_backward",)),
    "avg": (_avg_case, {}, True, ("avg_window_backward",)),
    "avg-cip": (_avg_case, {"cip": True}, True, ("avg_window_backward",)),
    "avg-div3": (_avg_case, {"div": 3}, True, ("avg_window_backward",)),
    "lp1": (_lp_case, {"p": 1}, True, LP),
    "lp2": (_lp_case, {"p": 2}, True, LP),
    "lp3.5": (_lp_case, {"p": 3.5}, False, LP),
}


def by_cells(w: Window, layout: str, strides=(2,)) -> bool:
    """Whether a backward takes a cell kernel: 2-D NCHW, one stride along H and W, one of
    ``strides`` (a max's 2, an average's 2 or 1), 2 or 3 taps, no dilation and pad 0 or 1
    before, along H and W."""
    spec = S.window_spec("test", "max", w.lead + w.spatial, "float32", w.kernel, w.stride,
                         w.padding, w.dilation, w.ceil, "NCHW", return_indices=True)
    return (layout == "NCHW" and len(w.spatial) == 2 and len(set(spec.stride)) == 1
            and spec.stride[0] in strides and all(
                k in (2, 3) and d == 1 and pb in (0, 1)
                for k, d, (pb, _) in zip(spec.kernel, spec.dilation, spec.pads)))


def avg_kernels(w: Window, layout: str) -> tuple[str]:
    """The kernel of an average's backward over window ``w`` (tiles apart)."""
    return ("avg_cells_backward" if by_cells(w, layout, (2, 1)) else "avg_window_backward",)


def max_kernels(w: Window, layout: str) -> tuple[str, ...]:
    """The kernels of a max's backward over window ``w``: the gradient by cells, which checks
    the indices as it goes; else the check of the indices, then the gradient's."""
    if by_cells(w, layout):
        return ("max_cells_checked_backward",)
    return ("max_index_check", "max_window_backward")


def window_cases():
    """Every window of WINDOWS in every dtype; the random windows in one dtype each, in turn
    (CI runs these three times on the executor)."""
    combos = itertools.product(WINDOWS + random_windows(14), ("NCHW", "NHWC"),
                               WINDOW_OPS.items())
    for n, (w, layout, (op, (build, kw, exact, kernels))) in enumerate(combos):
        if op == "max":
            kernels = max_kernels(w, layout)
        elif op.startswith("avg"):
            kernels = avg_kernels(w, layout)
        for dtype in (FLOATS[n % len(FLOATS)],) if w.id.startswith("rand") else FLOATS:
            shape = shaped(w.lead, w.spatial, layout)
            inputs, run = build(w, layout, dtype, shape, **kw)
            yield Case(f"bw-{op}-{dtype}-{layout}-{w.id}", inputs, run, exact,
                       requests=() if len(w.spatial) > 3 else kernels,
                       tags=frozenset({"idx64"} if w.id in IDX64_WINDOWS else ()))


#: Windows of the max gradients by cells (``by_cells``) beyond WINDOWS: 2 taps with pad 1 in
#: ceil mode, 2 x 3 taps with pads (1, 0), 3 taps with pad 0 on odd sizes, and rows wider than
#: one block of threads, whose last cell lies partly past the row's end.
CELL_WINDOWS = [
    Window("2d-k2-s2-p1-ceil", (2, 3), (7, 9), 2, 2, 1, 1, True),
    Window("2d-k23-s2-p10", (2, 3), (8, 11), (2, 3), 2, (1, 0)),
    Window("2d-k3-s2-p0-ceil", (1, 3), (11, 13), 3, 2, 0, 1, True),
    Window("2d-k3-s2-p1-wide", (1, 2), (5, 522), 3, 2, 1),
]


#: Windows of the average gradients by cells of stride 1 beyond WINDOWS: 3 x 3 taps with pads
#: 1 (compiled in) on sizes that no cell divides, and on one row of 2; 2 taps with no pad and
#: with SAME's pads (0, 1); 3 taps with no pad in ceil mode; 2 x 3 taps with pads (1, 0).
CELL1_WINDOWS = [
    Window("2d-k3-s1-p1-cells", (2, 3), (9, 13), 3, 1, 1),
    Window("2d-k3-s1-p1-tiny", (2, 3), (1, 2), 3, 1, 1),
    Window("2d-k2-s1-p0", (2, 3), (6, 10), 2, 1, 0),
    Window("2d-k2-s1-same", (2, 3), (7, 9), 2, 1, "same"),
    Window("2d-k3-s1-p0-ceil", (1, 3), (11, 7), 3, 1, 0, 1, True),
    Window("2d-k23-s1-p10", (2, 3), (8, 11), (2, 3), 1, (1, 0)),
]


def special_grad(rng, shape, dtype):
    """Normal gradients with NaN, inf and -0 among them (no -inf: inf - inf would make the
    NumPy backend warn)."""
    g = grad_for(rng, shape, dtype)
    pick = rng.random(shape)
    g[pick < 0.05] = np.nan
    g[(pick >= 0.05) & (pick < 0.1)] = np.inf
    g[(pick >= 0.1) & (pick < 0.2)] = -0.0
    return g


def cell_cases():
    """The cell kernels' windows in every dtype, with normal gradients and with NaN, inf and
    -0 among them (a max's sum in the order of np.add.at); averages of every divisor form, of
    stride 2 and 1."""
    table = CELL_WINDOWS + [w for w in WINDOWS if w.id in ("2d-k2", "2d-k3-s2-p1")]
    for w, dtype, special in itertools.product(table, FLOATS, (False, True)):
        if not special and w in WINDOWS:
            continue
        shape = shaped(w.lead, w.spatial, "NCHW")
        inputs, run = _max_case(w, "NCHW", dtype, shape)
        if special:
            plain = inputs

            def inputs(rng, plain=plain, dtype=dtype):
                g, idx = plain(rng)
                return special_grad(rng, g.shape, dtype), idx
        yield Case(f"bw-max-{dtype}-NCHW-{w.id}{'-nan-inf' if special else ''}", inputs, run,
                   True, requests=("max_cells_checked_backward",))
        if not special:
            yield Case(f"bw-max-own-{dtype}-NCHW-{w.id}", *_own_max_case(w, dtype, shape),
                       True, requests=("max_cells_backward",))
    for w, dtype, (op, kw) in itertools.product(
            CELL_WINDOWS + CELL1_WINDOWS, FLOATS, (("avg", {}), ("avg-cip", {"cip": True}),
                                   ("avg-div3", {"div": 3}))):
        inputs, run = _avg_case(w, "NCHW", dtype, shaped(w.lead, w.spatial, "NCHW"), **kw)
        plain = inputs

        def inputs(rng, plain=plain, dtype=dtype):
            (g,) = plain(rng)
            return (special_grad(rng, g.shape, dtype),)
        yield Case(f"bw-{op}-{dtype}-NCHW-{w.id}-nan-inf", inputs, run, True,
                   requests=("avg_cells_backward",))


#: Windows that tile their input exactly: NCHW averages 2 wide along W take the tile kernel
#: (a pack of a row's gradients per thread; rows of 16 floats on 16-byte aligned addresses, rows
#: of 14 half of them not, a last pack with fewer gradients where W / 2 is odd), NHWC ones the
#: channel tiles (a pack of a position's channels per thread: 3 channels, a short pack; 8,
#: whole 16-byte packs).
TILE_WINDOWS = [
    Window("1d-k2-tiles", (2, 3), (14,), (2,)),
    Window("2d-k2-tiles", (2, 3), (8, 16), 2),
    Window("2d-k32-tiles", (2, 3), (9, 10), (3, 2)),
    Window("2d-k23-c8-tiles", (2, 8), (4, 9), (2, 3)),
    Window("3d-k2-tiles-ceil", (1, 3), (4, 6, 12), (2, 2, 2), ceil=True),
]


def tile_cases():
    for w, layout, (op, kw), dtype in itertools.product(
            TILE_WINDOWS, ("NCHW", "NHWC"), (("avg", {}), ("avg-div3", {"div": 3})), FLOATS):
        shape = shaped(w.lead, w.spatial, layout)
        inputs, run = _avg_case(w, layout, dtype, shape, **kw)
        kernel = ("avg_channel_tiles_backward" if layout == "NHWC" else "avg_tiles_backward"
                  if np.atleast_1d(w.kernel)[-1] == 2 else "avg_window_backward")
        yield Case(f"bw-{op}-{dtype}-{layout}-{w.id}", inputs, run, True, requests=(kernel,),
                   tags=frozenset({"idx64"} if w.id == "2d-k2-tiles" else ()))


# ----------------------------------------------------------------------------- adaptive, global

def _amax(lead, spatial, out, layout, dtype, index_dtype="int64"):
    shape = shaped(lead, spatial, layout)

    def inputs(rng):
        x = make_input(rng, shape, dtype, "max")
        y, idx = gpupool.adaptive_max_pool(x, out, return_indices=True, layout=layout)
        return grad_for(rng, y.shape, dtype), idx.astype(index_dtype)

    def run(g, idx):
        return gpupool.adaptive_max_pool_backward(g, idx, shape, out, layout=layout)
    return inputs, run


def _aavg(lead, spatial, out, layout, dtype):
    shape = shaped(lead, spatial, layout)

    def inputs(rng):
        return (grad_for(rng, shaped(lead, out, layout), dtype),)

    def run(g):
        return gpupool.adaptive_avg_pool_backward(g, shape, out, layout=layout)
    return inputs, run


ADAPTIVE_OPS = {"amax": (_amax, ("max_index_check", "max_adaptive_backward")),
                "aavg": (_aavg, ("avg_adaptive_backward",))}


def adaptive_cases():
    table = ADAPTIVES + [("4d-host-fallback", (2,), (3, 3, 4, 4), (2, 2, 1, 3))]
    for (gid, lead, spatial, out), layout, (op, (build, kernels)), dtype in itertools.product(
            table + random_adaptives(9), ("NCHW", "NHWC"), ADAPTIVE_OPS.items(), FLOATS):
        inputs, run = build(lead, spatial, out, layout, dtype)
        if op == "aavg" and all(o == 1 for o in out):
            kernels = ("avg_global_backward",)  # an average to size 1 is a global one
        yield Case(f"bw-{op}-{dtype}-{layout}-{gid}", inputs, run, True,
                   requests=() if len(spatial) > 3 else kernels,
                   tags=frozenset({"idx64"} if gid in IDX64_ADAPTIVES else ()))


def _gmax(shape, nd, layout, dtype):
    def inputs(rng):
        x = make_input(rng, shape, dtype, "max")
        g = grad_for(rng, gpupool.global_max_pool(x, spatial_dims=nd, layout=layout).shape,
                     dtype)
        return g, x

    def run(g, x):
        return gpupool.global_max_pool_backward(g, x, spatial_dims=nd, layout=layout)
    return inputs, run


def _gavg(shape, nd, layout, dtype):
    def inputs(rng):
        y = gpupool.global_avg_pool(np.zeros(shape), spatial_dims=nd, layout=layout)
        return (grad_for(rng, y.shape, dtype),)

    def run(g):
        return gpupool.global_avg_pool_backward(g, shape, spatial_dims=nd, layout=layout)
    return inputs, run


def global_cases():
    for (gid, shape, nd, layout, _, _), dtype in itertools.product(GLOBALS, FLOATS):
        tags = frozenset({"idx64"} if gid in IDX64_GLOBALS else ())
        inputs, run = _gmax(shape, nd, layout, dtype)
        # the forward max with indices of more than 3 dims runs on the host; NCHW planes of 1
        # or 2 dims 4 or more columns wide take a group of lanes each
        forward = "adaptive_max_indices" + (
            "_lanes" if layout == "NCHW" and nd <= 2 and shape[-1] >= 4 else "")
        requests = (() if nd > 3 else (forward,)) + ("max_adaptive_backward",)
        yield Case(f"bw-gmax-{dtype}-{layout}-{gid}", inputs, run, True, requests=requests,
                   tags=tags)
        inputs, run = _gavg(shape, nd, layout, dtype)
        yield Case(f"bw-gavg-{dtype}-{layout}-{gid}", inputs, run, True,
                   requests=("avg_global_backward",), tags=tags)


# ----------------------------------------------------------------------------- operands

def operand_cases():
    """Index dtypes other than int64 (widened on the device), and non-contiguous gradients,
    indices and x (copied first)."""
    w = Window("2d-k2", (2, 3), (6, 8), 2)
    w3 = Window("2d-k3-s2-p1", (2, 3), (9, 10), 3, 2, 1)
    for idt, layout in itertools.product(("int8", "uint8", "int16", "int32"), ("NCHW", "NHWC")):
        shape = shaped(w.lead, w.spatial, layout)
        inputs, run = _max_case(w, layout, "float32", shape, idt)
        yield Case(f"bw-max-float32-idx_{idt}-{layout}-2d-k2", inputs, run, True,
                   requests=max_kernels(w, layout))
        inputs, run = _amax((2, 3), (7, 9), (3, 4), layout, "float16", idt)
        yield Case(f"bw-amax-float16-idx_{idt}-{layout}-7x9to3x4", inputs, run, True,
                   requests=("max_index_check", "max_adaptive_backward"),
                   tags=frozenset({"idx64"}))
    for layout, dtype in itertools.product(("NCHW", "NHWC"), FLOATS):
        shape = shaped(w3.lead, w3.spatial, layout)
        inputs, run = _max_case(w3, layout, dtype, shape, view=strided)
        yield Case(f"bw-max-{dtype}-{layout}-strided-grad-and-indices", inputs, run, True,
                   view=strided, requests=max_kernels(w3, layout))
        inputs, run = _lp_case(w3, layout, dtype, shape, 2, view=strided)
        yield Case(f"bw-lp2-{dtype}-{layout}-strided-grad-and-x", inputs, run, True,
                   view=strided, requests=("lp_pool", "lp_window_backward"))
        inputs, run = _avg_case(w3, layout, dtype, shape, cip=True)
        yield Case(f"bw-avg-cip-{dtype}-{layout}-transposed-grad", inputs, run, True,
                   view=lambda a: a.swapaxes(-1, -2).copy().swapaxes(-1, -2),
                   requests=avg_kernels(w3, layout))
        inputs, run = _aavg((2, 3), (5, 5), (7, 6), layout, dtype)
        yield Case(f"bw-aavg-{dtype}-{layout}-reversed-grad", inputs, run, True,
                   view=lambda a: a[::-1].copy()[::-1], requests=("avg_adaptive_backward",))


# ----------------------------------------------------------------------------- hooked cases

def many_plane_cases(n: int):
    """``n`` planes: under the ``grid64`` hook more than grid y holds, so they spill onto grid
    z (a 2x2 plane packs fewer planes per block than the forward's 1x1 output, so the hooked
    runs take 5000 planes: 64 x 64 blocks hold them); unhooked, 66000 planes packed on grid
    y."""
    w = Window("k2", (1, n), (2, 2), 2)
    w1 = Window("k2-1d", (n, 1), (2,), (2,))
    cases = [
        ("max", _max_case(w, "NCHW", "float32", (1, n, 2, 2))),
        ("max", _max_case(w, "NHWC", "float32", (n, 2, 2, 1))),
        ("avg-cip", _avg_case(Window("k2-pairs", (1, n), (2, 2), 2, 2, ((1, 1), (0, 0))),
                              "NCHW", "float32", (1, n, 2, 2), cip=True)),
        ("lp2", _lp_case(w1, "NCHW", "float32", (n, 1, 2), 2)),
        ("amax", _amax((n,), (3,), (2,), "NCHW", "float32")),
        ("aavg", _aavg((n,), (3,), (2,), "NCHW", "float32")),
        ("gavg", _gavg((n, 1, 1), 1, "NHWC", "float32")),
        ("gmax", _gmax((n, 3), 1, "NCHW", "float32")),
    ]
    for i, (op, (inputs, run)) in enumerate(cases):
        yield Case(f"bw-{op}-float32-{n}-planes-{i}", inputs, run, True)


def small_device_cases():
    """On a 1-SM device these few planes fill the GPU: each thread takes several rows (NHWC:
    positions) of the input."""
    cases = [
        ("max", (8, 8, 100), "NCHW", _max_case(Window("k3", (8,), (8, 100), 3, 1, 1), "NCHW",
                                                "float32", (8, 8, 100))),
        ("avg", (8, 9, 300), "NCHW", _avg_case(Window("k3", (8,), (9, 300), 3, 2, 1, 2, True),
                                                "NCHW", "float32", (8, 9, 300), cip=True)),
        ("lp2", (8, 4, 4, 64), "NHWC", _lp_case(Window("k2", (8, 64), (4, 4), 2, 1), "NHWC",
                                                 "float64", (8, 4, 4, 64), 2)),
        ("aavg", (8, 17, 130), "NCHW", _aavg((8,), (17, 130), (8, 100), "NCHW", "float16")),
        ("amax", (8, 9, 9, 64), "NHWC", _amax((8, 64), (9, 9), (4, 4), "NHWC", "float32")),
    ]
    for op, shape, layout, (inputs, run) in cases:
        yield Case(f"bw-{op}-{layout}-{'x'.join(map(str, shape))}", inputs, run, True)


CASES = (list(window_cases()) + list(cell_cases()) + list(tile_cases()) + list(adaptive_cases())
         + list(global_cases()) + list(operand_cases()))
def with_wide_offsets(case: Case) -> Case:
    """``case`` as the ``idx64`` hook runs it: the cell kernels take 32-bit offsets only."""
    wide = {"max_cells_checked_backward": ("max_index_check", "max_window_backward"),
            "avg_cells_backward": ("avg_window_backward",)}
    return dataclasses.replace(case, requests=sum((wide.get(k, (k,)) for k in case.requests),
                                                  ()))


HOOKED = ([("idx64", with_wide_offsets(c)) for c in CASES if "idx64" in c.tags]
          + [("grid64", c) for c in many_plane_cases(5000)]
          + [("small-device", c) for c in small_device_cases()])
assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cuda_backward_matches_numpy(case, cupy, monkeypatch):
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
def test_cuda_backward_matches_numpy_under_hooks(hooked, case, cupy, monkeypatch):
    rec = run_case(case, monkeypatch, cupy)
    gathers = [la for _, p in rec.plans if p.family == "gather" for la in p.launches]
    assert gathers, rec.plans
    if hooked == "small-device":
        assert all(la.rows > 1 for la in gathers), gathers
    else:
        check_paths(rec, {hooked})


def test_unhooked_many_planes_match(cupy, monkeypatch):
    """The ``grid64`` cases without the hook: planes packed along block z on grid y."""
    for case in many_plane_cases(66000):
        run_case(case, monkeypatch, cupy)


# ----------------------------------------------------------------------------- plans

def test_gather_plans_tile_the_input():
    """A gather launch covers every input position once: its plan is the forward launch shape
    over the input's positions, with the traffic of the backward."""
    from gpupool import grad_spec as G
    from gpupool.cuda import planner, tiled_gathers
    spec = G.window_grad_spec("t", "max", (32, 56, 56, 64), "float32", (32, 112, 112, 64), 3,
                              2, 1, 1, False, "NHWC", index_shape=(32, 56, 56, 64),
                              index_dtype="int64")
    pl = planner.plan(spec)
    (la,) = pl.launches
    assert pl.family == "gather" and la.kernel == "max_window_backward"
    assert la.outputs == 32 * 64 * 112 * 112
    assert la.bytes_read == 32 * 64 * 56 * 56 * (4 + 8)
    assert la.bytes_written == 4 * la.outputs
    # packs of MAX_PACK positions along W: 3x3 windows of stride 2 reach at most 3 of them
    assert la.get("covers") == 3
    assert la.threads * la.rows * planner.MAX_PACK >= la.outputs
    # NCHW: a thread per 2 rows by CELL_COLUMNS columns, on a grid of (W chunks, row-pair
    # groups, planes)
    spec = G.window_grad_spec("t", "max", (32, 64, 56, 56), "float32", (32, 64, 112, 112), 3,
                              2, 1, 1, False, "NCHW", index_shape=(32, 64, 56, 56),
                              index_dtype="int64")
    (la,) = planner.plan(spec).launches
    assert la.kernel == "max_cells_backward" and la.grid[2] == 32 * 64
    assert la.outputs == 32 * 64 * 112 * 112 and la.bytes_read == 32 * 64 * 56 * 56 * (4 + 8)
    tx, ty, _ = la.block
    assert la.grid[0] * tx * tiled_gathers.CELL_COLUMNS >= 112 and la.grid[1] * ty * 2 >= 112
    # an average of stride 1: a thread per CELL1_ROWS rows by CELL1_COLUMNS columns, the cells
    # numbered across the planes in blocks of 256; a max of stride 1 walks its covering windows
    args = ((32, 64, 56, 56), "float32", (32, 64, 56, 56), 3, 1, 1, 1, False, "NCHW")
    (la,) = planner.plan(G.window_grad_spec("t", "avg", *args)).launches
    assert la.kernel == "avg_cells_backward" and la.get("stride") == 1
    assert la.outputs == 32 * 64 * 56 * 56 and la.block == (256, 1, 1)
    assert la.grid == (-(-32 * 64 * 56 * 56 // (256 * tiled_gathers.CELL1_ROWS
                                               * tiled_gathers.CELL1_COLUMNS)), 1, 1)
    (la,) = planner.plan(G.window_grad_spec("t", "max", *args, index_shape=args[0],
                                            index_dtype="int64")).launches
    assert la.kernel == "max_window_backward"
    g4 = G.global_grad_spec("t", "avg", (2, 3, 1, 1, 1, 1), "float16", (2, 3, 4, 5, 6, 7), 4,
                            "NCHW")
    view = planner.gather_view(g4)
    assert view.geom.spatial == (840,) and view.out_spatial == (1,)
    (la,) = planner.plan(g4).launches
    assert la.kernel == "avg_global_backward" and la.outputs == 2 * 3 * 840
    # BROADCAST_PACKS 16-byte packs per thread over whole planes: every pack has a thread
    assert la.threads * tiled_gathers.BROADCAST_PACKS * 8 >= la.outputs


# ----------------------------------------------------------------------------- coverage

def test_every_backward_instantiation_is_requested(cupy):
    """All cases together (no-op kernels) ask for every backward instantiation, and for no
    name outside the list."""
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
            requested |= {n for n in rec.names
                          if n[0] == "pool_backward.cu" or checked_by_backward_ops(n[1])}
        clear_plans()
    listed = {n for n in names.instantiations()
              if n[0] == "pool_backward.cu" or checked_by_backward_ops(n[1])}
    assert requested == listed, sorted(listed ^ requested)

