"""Pooling results against the independent reference in ``reference.py``.

Every test takes the ``backend`` fixture, so the same body runs on NumPy and (with a GPU) on
CuPy. Hypothesis property tests sweep the parameter space; example tests pin the edge cases
the semantics name, hand-computed where small.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import gpupool
import reference as ref
from dtypes import BFLOAT16, numpy_dtype

FLOATS = ("float16", "float32", "float64")
#: the float dtypes the random cases draw from: also bfloat16 (an ml_dtypes dtype NumPy cannot
#: byte-swap, so the byte order tests keep to FLOATS)
DRAWN_FLOATS = FLOATS + ("bfloat16",)
INTS = ("int8", "uint8", "int16", "int32", "int64")
# Per-dtype tolerance table (STYLE.md); never widen silently.
TOL = {np.dtype("float16"): dict(rtol=1e-3, atol=1e-3),
       np.dtype("float32"): dict(rtol=1e-5, atol=1e-5),
       np.dtype("float64"): dict(rtol=1e-12, atol=1e-12),
       BFLOAT16: dict(rtol=8e-3, atol=8e-3)}
MEMORY = ("C", "F", "strided", "reversed", "transposed")


# ----------------------------------------------------------------------------- helpers

def check(backend, actual, expected, dtype, *, exact=False):
    """``actual`` is a ``dtype`` array of ``backend`` equal to ``expected`` (float64 or int64)
    within the tolerance of ``dtype`` (exactly for integers, indices and ``exact``)."""
    assert backend.is_native(actual), type(actual)
    a = backend.to_numpy(actual)
    assert a.dtype == numpy_dtype(dtype), (a.dtype, dtype)
    assert a.shape == expected.shape, (a.shape, expected.shape)
    if exact or a.dtype.kind in "iu":
        assert_array_equal(a.astype(expected.dtype), expected)
    else:
        assert_allclose(a.astype(np.float64), expected, **TOL[a.dtype])


def make_input(rng, shape, dtype, values="normal", specials=()):
    """Random input: ``ties`` draws from a few values (many equal taps), ``normal`` from a
    continuous distribution; ``specials`` (nan, -inf, inf) are sprinkled over ~10%."""
    dtype = numpy_dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (max(info.min, -3), min(info.max, 3)) if values == "ties" else (info.min, info.max)
        return rng.integers(lo, hi, size=shape, endpoint=True, dtype=dtype)
    if values == "ties":
        x = rng.integers(-4, 5, size=shape) / 2
    else:
        x = rng.standard_normal(shape) * 3
    x = x.astype(dtype)
    for special in specials:
        x[rng.random(shape) < 0.1] = special
    return x


def full_shape(lead, spatial, layout, channels):
    return tuple(lead) + tuple(spatial) + ((channels,) if layout == "NHWC" else ())


def per_dim_or_int(draw, values, nd):
    """Draw a per-dim tuple (or list) of ``values``, or an int when every entry is equal."""
    vals = tuple(draw(values) for _ in range(nd))
    if len(set(vals)) == 1 and draw(st.booleans()):
        return vals[0]  # an int applies to every spatial dim
    return list(vals) if draw(st.booleans()) else vals


# ----------------------------------------------------------------------------- strategies

def draw_specials(draw, op, dtype):
    """Non-finite values to sprinkle: NaN and -inf everywhere, +inf only for max (inf - inf
    in a sum is NaN either way, and NumPy warns about it)."""
    if dtype in INTS:
        return ()
    choices = [(), (), ("nan",), ("-inf",), ("nan", "-inf")]
    if op == "max":
        choices += [("inf",), ("nan", "inf", "-inf")]
    return tuple(float(v) for v in draw(st.sampled_from(choices)))


MAX_SIZE = {1: 10, 2: 6, 3: 4}
WORK_LIMIT = 6000  # planes * outputs * taps: keeps the reference loops fast


@st.composite
def window_cases(draw, op):
    nd = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    lead = tuple(draw(st.integers(1, 2)) for _ in range(draw(st.integers(0, 2))))
    channels = draw(st.integers(1, 3)) if layout == "NHWC" else 1
    spatial = tuple(draw(st.sampled_from(range(1, MAX_SIZE[nd] + 1))) for _ in range(nd))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    kernel_arg = kernel
    if nd == 2 and kernel[0] == kernel[1] and draw(st.booleans()):
        kernel_arg = kernel[0]  # an int kernel means 2 spatial dims
    elif draw(st.booleans()):
        kernel_arg = list(kernel)
    stride = draw(st.none() | st.just("draw"))
    if stride == "draw":
        stride = per_dim_or_int(draw, st.integers(1, 3), nd)
    dilation = per_dim_or_int(draw, st.integers(1, 2), nd)
    form = draw(st.sampled_from(["int", "tuple", "pairs", "valid", "same", "same_lower"]))
    if form == "int":
        padding = draw(st.integers(0, 2))
    elif form == "tuple":
        padding = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    elif form == "pairs":
        padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd))
    else:
        padding = form
    ceil_mode = draw(st.booleans())
    dtypes = DRAWN_FLOATS + INTS if op == "max" else DRAWN_FLOATS
    dtype = draw(st.sampled_from(dtypes))
    values = draw(st.sampled_from(["ties", "normal"]))
    specials = draw_specials(draw, op, dtype)
    memory = draw(st.sampled_from(MEMORY))
    case = dict(nd=nd, layout=layout, lead=lead, channels=channels, spatial=spatial,
                kernel=kernel_arg, stride=stride, dilation=dilation, padding=padding,
                ceil_mode=ceil_mode, dtype=dtype, values=values, specials=specials,
                memory=memory, seed=draw(st.integers(0, 2**32 - 1)),
                use_out=draw(st.booleans()))
    # expected output size, from the reference's own rules
    k = kernel
    s = kernel if stride is None else (stride if not isinstance(stride, int) else (stride,) * nd)
    s = tuple(s)
    d = tuple(dilation) if not isinstance(dilation, int) else (dilation,) * nd
    pads = ref.resolve_padding(padding, spatial, k, s, d)
    out = tuple(ref.output_length(i, kk, ss, p, dd, ceil_mode)
                for i, kk, ss, p, dd in zip(spatial, k, s, pads, d))
    case["out_spatial"] = out
    if all(o >= 1 for o in out):
        planes = int(np.prod(lead)) * channels
        work = planes * int(np.prod(out)) * int(np.prod(k))
        if work > WORK_LIMIT:
            case["lead"], case["channels"] = (), 1  # one plane keeps the reference quick
    return case


def build_input(backend, case):
    rng = np.random.default_rng(case["seed"])
    shape = full_shape(case["lead"], case["spatial"], case["layout"], case["channels"])
    x = make_input(rng, shape, case["dtype"], case["values"], case["specials"])
    return x, backend.relayout(backend.to_backend(x), case["memory"])


def window_args(case):
    return dict(kernel_size=case["kernel"], stride=case["stride"], padding=case["padding"],
                ceil_mode=case["ceil_mode"], dilation=case["dilation"], layout=case["layout"])


def expect_too_small(case):
    """True when the reference says some output dim is < 1: gpupool must raise ValueError."""
    return any(o < 1 for o in case["out_spatial"])


# ------------------------------------------------------------------------- reference self-checks

@settings(max_examples=300)
@given(size=st.integers(1, 12), k=st.integers(1, 4), s=st.integers(1, 4), d=st.integers(1, 3),
       mode=st.sampled_from(["same", "same_lower"]))
def test_reference_same_padding_gives_ceil_of_size_over_stride(size, k, s, d, mode):
    (pb, pe), = ref.resolve_padding(mode, (size,), (k,), (s,), (d,))
    assert abs(pb - pe) <= 1 and (pe >= pb if mode == "same" else pb >= pe)
    assert ref.output_length(size, k, s, (pb, pe), d, False) == -(-size // s)


@settings(max_examples=300)
@given(size=st.integers(1, 12), k=st.integers(1, 4), s=st.integers(1, 4), d=st.integers(1, 3),
       pb=st.integers(0, 4), pe=st.integers(0, 4))
def test_reference_ceil_mode_last_window_starts_inside_input_or_begin_padding(
        size, k, s, d, pb, pe):
    floor_o = ref.output_length(size, k, s, (pb, pe), d, False)
    ceil_o = ref.output_length(size, k, s, (pb, pe), d, True)
    # ceil mode adds at most one window, and drops at most one (a window wholly in the end
    # padding, which floor mode keeps when the end padding is wider than the stride)
    assert floor_o - 1 <= ceil_o <= floor_o + 1
    if ceil_o > floor_o:  # the extra window starts inside the input or the begin padding
        assert (ceil_o - 1) * s < size + pb


@settings(max_examples=200)
@given(case=window_cases("avg"), op=st.sampled_from(["max", "avg", "lp"]),
       count_include_pad=st.booleans(), divisor_override=st.none() | st.integers(1, 5))
def test_reference_vectorised_check_agrees_with_the_loops(case, op, count_include_pad,
                                                           divisor_override):
    if expect_too_small(case) or case["layout"] != "NCHW":
        return
    x = make_input(np.random.default_rng(case["seed"]), case["lead"] + case["spatial"],
                   "float64", case["values"], case["specials"])
    nd = case["nd"]
    as_tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd  # noqa: E731
    kernel = as_tuple(case["kernel"])
    stride = kernel if case["stride"] is None else as_tuple(case["stride"])
    dilation = as_tuple(case["dilation"])
    pads = ref.resolve_padding(case["padding"], case["spatial"], kernel, stride, dilation)
    vec = ref.vectorised_window(x, op, kernel, stride, pads, dilation, case["out_spatial"],
                                count_include_pad=count_include_pad,
                                divisor_override=divisor_override, p=1.7)
    args = (case["kernel"], case["stride"], case["padding"])
    if op == "max":
        loops = ref.max_pool(x, *args, case["dilation"], case["ceil_mode"])[0]
    elif op == "avg":
        loops = ref.avg_pool(x, *args, case["ceil_mode"], count_include_pad, divisor_override,
                             case["dilation"])
    else:
        loops = ref.lp_pool(x, 1.7, *args, case["dilation"], case["ceil_mode"])
    assert_allclose(vec, loops, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------ hand-computed examples

def test_docstring_examples(backend):
    x = backend.to_backend(np.arange(16.0).reshape(1, 1, 4, 4))
    check(backend, gpupool.max_pool(x, 2), np.array([[[[5.0, 7.0], [13.0, 15.0]]]]), "float64")
    check(backend, gpupool.avg_pool(x, 2), np.array([[[[2.5, 4.5], [10.5, 12.5]]]]), "float64")
    check(backend, gpupool.lp_pool(backend.to_backend(np.array([[[3.0, -4.0]]])), 2, (2,)),
          np.array([[[5.0]]]), "float64")
    x6 = backend.to_backend(np.arange(6.0).reshape(1, 1, 6))
    check(backend, gpupool.adaptive_avg_pool(x6, (2,)), np.array([[[1.0, 4.0]]]), "float64")
    check(backend, gpupool.adaptive_max_pool(x6, (2,)), np.array([[[2.0, 5.0]]]), "float64")
    x8 = backend.to_backend(np.arange(8.0).reshape(1, 2, 2, 2))
    check(backend, gpupool.global_max_pool(x8), np.array([[[[3.0]], [[7.0]]]]), "float64")
    check(backend, gpupool.global_avg_pool(x8), np.array([[[[1.5]], [[5.5]]]]), "float64")
    y, i = gpupool.max_pool(backend.to_backend(np.arange(4.0).reshape(1, 1, 2, 2)), 2,
                            return_indices=True)
    check(backend, gpupool.max_unpool(y, i, 2), np.array([[[[0.0, 0.0], [0.0, 3.0]]]]),
          "float64")


def test_gh_36977_ceil_mode_must_not_give_nan_or_an_extra_window(backend):
    # I=5, k=2, s=2, pad=1: the floor formula with ceil gives 4 windows, but the 4th would
    # start at padded position 6 >= I + pb, i.e. wholly in the end padding: it is dropped.
    x = backend.to_backend(np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]]))
    args = dict(kernel_size=(2,), stride=(2,), padding=1, ceil_mode=True)
    check(backend, gpupool.avg_pool(x, **args), np.array([[[1.0, 2.5, 4.5]]]), "float64")
    check(backend, gpupool.avg_pool(x, **args, count_include_pad=True),
          np.array([[[0.5, 2.5, 4.5]]]), "float64")
    y, i = gpupool.max_pool(x, **args, return_indices=True)
    check(backend, y, np.array([[[1.0, 3.0, 5.0]]]), "float64")
    check(backend, i, np.array([[[0, 2, 4]]]), "int64")
    # 2-D, the configuration of the PyTorch report: no NaN anywhere
    x2 = backend.to_backend(np.ones((1, 1, 5, 5), np.float32))
    out = gpupool.avg_pool(x2, 2, 2, 1, ceil_mode=True)
    check(backend, out, np.ones((1, 1, 3, 3)), "float32")


def test_ceil_mode_overhang_is_not_counted_by_count_include_pad(backend):
    # I=5, k=2, s=2, no padding, ceil: the last window [4, 6) overhangs by one tap, which is
    # neither input nor explicit padding, so the divisor is 1.
    x = backend.to_backend(np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]]))
    for cip in (False, True):
        check(backend, gpupool.avg_pool(x, (2,), ceil_mode=True, count_include_pad=cip),
              np.array([[[1.5, 3.5, 5.0]]]), "float64")
    check(backend, gpupool.avg_pool(x, (2,), ceil_mode=True, divisor_override=2),
          np.array([[[1.5, 3.5, 2.5]]]), "float64")


def test_padding_bigger_than_half_kernel_gives_empty_windows(backend):
    # I=2, k=2, s=1, pad=3: windows start at -3..3; those at -3, -2, 2, 3 hold no input tap.
    xf = backend.to_backend(np.array([[[2.0, -1.0]]]))
    args = dict(kernel_size=(2,), stride=(1,), padding=3)
    ninf = -np.inf
    y, i = gpupool.max_pool(xf, **args, return_indices=True)
    check(backend, y, np.array([[[ninf, ninf, 2.0, 2.0, -1.0, ninf, ninf]]]), "float64")
    check(backend, i, np.array([[[-1, -1, 0, 0, 1, -1, -1]]]), "int64")
    check(backend, gpupool.avg_pool(xf, **args),
          np.array([[[0.0, 0.0, 2.0, 0.5, -1.0, 0.0, 0.0]]]), "float64")
    check(backend, gpupool.avg_pool(xf, **args, count_include_pad=True),
          np.array([[[0.0, 0.0, 1.0, 0.5, -0.5, 0.0, 0.0]]]), "float64")
    check(backend, gpupool.avg_pool(xf, **args, divisor_override=4),
          np.array([[[0.0, 0.0, 0.5, 0.25, -0.25, 0.0, 0.0]]]), "float64")
    check(backend, gpupool.lp_pool(xf, 2, **args),
          np.array([[[0.0, 0.0, 2.0, np.sqrt(5.0), 1.0, 0.0, 0.0]]]), "float64")
    for dtype in INTS:
        lo = np.iinfo(dtype).min
        xi = backend.to_backend(np.array([[[2, 1]]], dtype))
        y, i = gpupool.max_pool(xi, **args, return_indices=True)
        check(backend, y, np.array([[[lo, lo, 2, 2, 1, lo, lo]]]), dtype)
        check(backend, i, np.array([[[-1, -1, 0, 0, 1, -1, -1]]]), "int64")


def test_dilation(backend):
    x = backend.to_backend(np.array([[[0.0, 6.0, 2.0, 5.0, 4.0, 1.0, 3.0]]]))
    # k=3, d=2: windows {0,2,4}, {1,3,5}, {2,4,6}
    y, i = gpupool.max_pool(x, (3,), (1,), dilation=2, return_indices=True)
    check(backend, y, np.array([[[4.0, 6.0, 4.0]]]), "float64")
    check(backend, i, np.array([[[4, 1, 4]]]), "int64")
    check(backend, gpupool.avg_pool(x, (3,), (1,), dilation=2),
          np.array([[[2.0, 4.0, 3.0]]]), "float64")
    # dilated taps that land in padding: count_include_pad counts taps, not the span
    x2 = np.arange(1.0, 26.0).reshape(1, 5, 5)
    for cip in (False, True):
        expected = ref.avg_pool(x2, (3, 3), (2, 2), 2, count_include_pad=cip, dilation=(2, 2))
        check(backend, gpupool.avg_pool(backend.to_backend(x2), (3, 3), (2, 2), 2,
                                        count_include_pad=cip, dilation=(2, 2)),
              expected, "float64")


def test_nan_propagates_and_ties_keep_the_first_position(backend):
    x = np.array([[[1.0, 3.0, 3.0, np.nan, 2.0, 7.0]]])
    y, i = gpupool.max_pool(backend.to_backend(x), (3,), (3,), return_indices=True)
    check(backend, y, np.array([[[3.0, np.nan]]]), "float64")
    check(backend, i, np.array([[[1, 3]]]), "int64")
    check(backend, gpupool.avg_pool(backend.to_backend(x), (3,)),
          np.array([[[7 / 3, np.nan]]]), "float64")
    check(backend, gpupool.lp_pool(backend.to_backend(x), 1, (3,)),
          np.array([[[7.0, np.nan]]]), "float64")
    g = gpupool.global_max_pool(backend.to_backend(x), spatial_dims=1)
    check(backend, g, np.array([[[np.nan]]]), "float64")
    y, i = gpupool.adaptive_max_pool(backend.to_backend(x), (2,), return_indices=True)
    check(backend, y, np.array([[[3.0, np.nan]]]), "float64")
    check(backend, i, np.array([[[1, 3]]]), "int64")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nan_indices_in_windows_cut_by_padding(backend, dtype):
    # NumPy 2.4's np.isnan leaves part of a strided out= unwritten: the float64 index path
    # lost NaN taps in windows cut by the padding (index 7 or 3 where the NaN is at 6)
    x = np.arange(32.0).reshape(2, 1, 8, 2)
    x[1, 0, 3, 0] = np.nan
    x = x.astype(dtype)
    y, i = gpupool.max_pool(backend.to_backend(x), 3, 1, 1, return_indices=True)
    want_y, want_i = ref.max_pool(x.astype(np.float64), 3, 1, 1)
    check(backend, i, want_i, "int64")
    check(backend, y, want_y, dtype)
    assert backend.to_numpy(i)[1, 0, 3, 0] == 6


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_max_with_indices_returns_the_element_at_its_index_bit_for_bit(backend, dtype):
    # signed zeros tie (the first wins, whatever its sign) and NaNs of several payloads (the
    # last wins): the value must be the element at the index, not an equal one; a float16 NaN
    # comes back as 0x7FFF (an H100 narrows every NaN to float16 so)
    unsigned = f"u{np.dtype(dtype).itemsize}"
    x = np.array([[[-0.0, 0.0, 0.0, -0.0, np.nan, np.nan, 1.0, np.nan, -0.0]]], dtype)
    bits = x.view(unsigned)
    bits[0, 0, 5] |= 1  # another payload
    bits[0, 0, 7] |= np.array(1, unsigned) << (8 * x.itemsize - 1)  # a negative NaN
    for y, i in (gpupool.max_pool(backend.to_backend(x), (3,), (1,), 1, return_indices=True),
                 gpupool.adaptive_max_pool(backend.to_backend(x), (4,), return_indices=True)):
        y, i = backend.to_numpy(y), backend.to_numpy(i)
        assert (i >= 0).all()
        want = np.take_along_axis(bits, i, axis=-1)
        if dtype == "float16":
            want = np.where(np.isnan(np.take_along_axis(x, i, axis=-1)), 0x7FFF, want)
        assert_array_equal(y.view(unsigned), want.astype(unsigned))
    # the reference's indices for the window op: first of tied taps, last NaN
    _, want_i = ref.max_pool(x.astype(np.float64), (3,), (1,), 1)
    y, i = gpupool.max_pool(backend.to_backend(x), (3,), (1,), 1, return_indices=True)
    check(backend, i, want_i, "int64")


HALF_NAN_OPS = {
    "max-idx": lambda x: gpupool.max_pool(x, (2,), return_indices=True)[0],
    "amax-idx": lambda x: gpupool.adaptive_max_pool(x, (3,), return_indices=True)[0],
    "global-max": lambda x: gpupool.global_max_pool(x, spatial_dims=1),
    "avg": lambda x: gpupool.avg_pool(x, (2,)),
    "lp": lambda x: gpupool.lp_pool(x, 2.0, (2,)),
    "aavg": lambda x: gpupool.adaptive_avg_pool(x, (3,)),
    "global-avg": lambda x: gpupool.global_avg_pool(x, spatial_dims=1),
    "max-backward": lambda x: gpupool.max_pool_backward(x[..., :3], gpupool.max_pool(
        abs(x), (2,), return_indices=True)[1], x.shape, (2,)),
    "avg-backward": lambda x: gpupool.avg_pool_backward(x[..., :3], x.shape, (2,)),
}


@pytest.mark.parametrize("op", HALF_NAN_OPS)
def test_every_float16_nan_result_is_0x7fff(backend, op):
    # NaNs of other payloads and signs in every window: float16 results are narrowed from
    # float32 on CUDA, where every NaN becomes 0x7FFF (seen on an H100), and NumPy's match
    x = np.array([[[np.nan, 1.0, 2.0, np.nan, np.nan, -np.nan]]], np.float16)
    bits = x.view(np.uint16)
    bits[0, 0, 0] |= 1
    bits[0, 0, 3] |= 0x8000
    bits[0, 0, 4] |= 0x1ff
    y = backend.to_numpy(HALF_NAN_OPS[op](backend.to_backend(x)))
    nan = np.isnan(y)
    assert y.dtype == np.float16 and nan.any()
    assert (y.view(np.uint16)[nan] == 0x7FFF).all(), [hex(b) for b in y.view(np.uint16).ravel()]


def test_window_of_minus_inf_gives_minus_inf_and_its_first_valid_index(backend):
    # -inf taps are valid taps: the index is the first one, not the -1 of an empty window
    x = np.array([[[-np.inf, -np.inf, -np.inf, 1.0]]])
    y, i = gpupool.max_pool(backend.to_backend(x), (2,), (2,), padding=1,
                            return_indices=True)
    check(backend, y, np.array([[[-np.inf, -np.inf, 1.0]]]), "float64")
    check(backend, i, np.array([[[0, 1, 3]]]), "int64")
    check(backend, gpupool.avg_pool(backend.to_backend(x), (2,)),
          np.array([[[-np.inf, -np.inf]]]), "float64")
    check(backend, gpupool.lp_pool(backend.to_backend(x), 2, (2,)),
          np.array([[[np.inf, np.inf]]]), "float64")


def test_average_of_plus_and_minus_inf_is_nan_without_a_warning(backend):
    # NaN is the right answer; a RuntimeWarning from NumPy internals is not (warnings are
    # errors in this suite, and the GPU backend cannot warn)
    x = backend.to_backend(np.array([[[np.inf, -np.inf, 1.0, 2.0]]]))
    check(backend, gpupool.avg_pool(x, (2,)), np.array([[[np.nan, 1.5]]]), "float64")
    check(backend, gpupool.adaptive_avg_pool(x, (2,)), np.array([[[np.nan, 1.5]]]), "float64")
    check(backend, gpupool.global_avg_pool(x, spatial_dims=1), np.array([[[np.nan]]]), "float64")


@pytest.mark.parametrize("p", [np.float32(2.0), np.float64(0.5), np.int64(3), np.float16(1.5)])
def test_lp_p_may_be_a_numpy_scalar(backend, p):
    x = np.random.default_rng(6).standard_normal((2, 7))
    check(backend, gpupool.lp_pool(backend.to_backend(x), p, (3,), (2,)),
          ref.lp_pool(x, float(p), (3,), (2,)), "float64")


@pytest.mark.parametrize("dtype", INTS)
def test_integer_max_starts_from_the_dtype_minimum_not_zero(backend, dtype):
    info = np.iinfo(dtype)
    x = np.full((2, 3, 4), info.min, dtype)
    x[0, 1, 2] = info.min + 1
    x[1, 2, 3] = info.max
    if info.min < 0:
        x[1, 0, 0] = -5
    xb = backend.to_backend(x)
    for padding in (0, 1):
        for layout in ("NCHW", "NHWC"):
            y, i = gpupool.max_pool(xb, (2, 2), (1, 1), padding, return_indices=True,
                                    layout=layout)
            ev, ei = ref.max_pool(x, (2, 2), (1, 1), padding, layout=layout)
            check(backend, y, ev, dtype)
            check(backend, i, ei, "int64")
    check(backend, gpupool.global_max_pool(xb, spatial_dims=2), ref.global_max_pool(x), dtype)
    y, i = gpupool.adaptive_max_pool(xb, (2, 3), return_indices=True)
    ev, ei = ref.adaptive_max_pool(x, (2, 3))
    check(backend, y, ev, dtype)
    check(backend, i, ei, "int64")


@pytest.mark.parametrize("shape,kernel", [((1, 1, 1, 1), 1), ((1, 1, 1, 5), (1, 3)),
                                          ((3, 1, 5, 1), (2, 1)), ((1,), (1,)),
                                          ((1, 1, 1), (1, 1, 1)), ((1, 4, 1), (1, 1))])
def test_size_one_dims(backend, shape, kernel):
    x = np.random.default_rng(0).standard_normal(shape)
    xb = backend.to_backend(x)
    y, i = gpupool.max_pool(xb, kernel, 1, return_indices=True)
    ev, ei = ref.max_pool(x, kernel, 1)
    check(backend, y, ev, "float64")
    check(backend, i, ei, "int64")
    check(backend, gpupool.avg_pool(xb, kernel, 1, padding=0), ref.avg_pool(x, kernel, 1),
          "float64")
    check(backend, gpupool.lp_pool(xb, 3, kernel, 1), ref.lp_pool(x, 3, kernel, 1), "float64")
    nd = len(kernel) if isinstance(kernel, tuple) else 2
    check(backend, gpupool.global_avg_pool(xb, spatial_dims=nd),
          ref.global_avg_pool(x, nd), "float64")
    check(backend, gpupool.adaptive_max_pool(xb, (1,) * nd), ref.adaptive_max_pool(x, (1,) * nd)[0],
          "float64")


@pytest.mark.parametrize("shape,layout", [((0, 3, 4, 4), "NCHW"), ((2, 0, 4, 4), "NCHW"),
                                          ((0, 4, 4, 3), "NHWC"), ((2, 4, 4, 0), "NHWC"),
                                          ((0, 4, 4), "NCHW")])
def test_zero_size_batch_or_channel_gives_an_empty_result_of_the_right_shape(
        backend, shape, layout):
    x = backend.to_backend(np.zeros(shape, np.float32))
    spatial_at = len(shape) - 2 - (layout == "NHWC")

    def expect(out_hw):
        s = list(shape)
        s[spatial_at:spatial_at + 2] = out_hw
        return tuple(s)

    def ok(a, out_hw, dtype="float32"):
        assert backend.is_native(a)
        assert a.shape == expect(out_hw) and a.dtype == np.dtype(dtype)

    y, i = gpupool.max_pool(x, 2, return_indices=True, layout=layout)
    ok(y, (2, 2))
    ok(i, (2, 2), "int64")
    ok(gpupool.avg_pool(x, 3, 1, 1, layout=layout), (4, 4))
    ok(gpupool.lp_pool(x, 2, 2, ceil_mode=True, layout=layout), (2, 2))
    ok(gpupool.global_avg_pool(x, layout=layout), (1, 1))
    ok(gpupool.global_max_pool(x, layout=layout), (1, 1))
    ok(gpupool.adaptive_avg_pool(x, (3, 2), layout=layout), (3, 2))
    y2, i2 = gpupool.adaptive_max_pool(x, 5, return_indices=True, layout=layout)
    ok(y2, (5, 5))
    ok(i2, (5, 5), "int64")
    ok(gpupool.max_unpool(y, i, 2, layout=layout), (4, 4))


@pytest.mark.parametrize("memory", MEMORY[1:])
def test_non_contiguous_and_fortran_inputs(backend, memory):
    rng = np.random.default_rng(1)
    for layout in ("NCHW", "NHWC"):
        x = make_input(rng, (2, 3, 5, 6), "float32")
        xb = backend.relayout(backend.to_backend(x), memory)
        if memory == "F":
            assert xb.flags.f_contiguous and not xb.flags.c_contiguous
        else:
            assert not xb.flags.c_contiguous
        y, i = gpupool.max_pool(xb, (3, 2), (2, 1), ((1, 0), (1, 1)), ceil_mode=True,
                                return_indices=True, layout=layout)
        ev, ei = ref.max_pool(x, (3, 2), (2, 1), ((1, 0), (1, 1)), ceil_mode=True, layout=layout)
        check(backend, y, ev, "float32")
        check(backend, i, ei, "int64")
        check(backend, gpupool.max_pool(xb, (3, 2), (2, 1), 1, layout=layout),
              ref.max_pool(x, (3, 2), (2, 1), 1, layout=layout)[0], "float32")
        check(backend, gpupool.avg_pool(xb, 3, 2, "same", layout=layout),
              ref.avg_pool(x, 3, 2, "same", layout=layout), "float32")
        check(backend, gpupool.lp_pool(xb, 1.7, (2, 2), layout=layout),
              ref.lp_pool(x, 1.7, (2, 2), layout=layout), "float32")
        check(backend, gpupool.global_avg_pool(xb, layout=layout),
              ref.global_avg_pool(x, layout=layout), "float32")
        check(backend, gpupool.global_max_pool(xb, layout=layout),
              ref.global_max_pool(x, layout=layout), "float32")
        check(backend, gpupool.adaptive_avg_pool(xb, (2, 4), layout=layout),
              ref.adaptive_avg_pool(x, (2, 4), layout=layout), "float32")
        y, i = gpupool.adaptive_max_pool(xb, (4, 4), return_indices=True, layout=layout)
        ev, ei = ref.adaptive_max_pool(x, (4, 4), layout=layout)
        check(backend, y, ev, "float32")
        check(backend, i, ei, "int64")
        # unpool with non-contiguous values and indices
        yb, ib = gpupool.max_pool(backend.to_backend(x), 2, return_indices=True, layout=layout)
        yn, inn = backend.to_numpy(yb), backend.to_numpy(ib)
        spatial = (5, 6) if layout == "NCHW" else (3, 5)
        up = gpupool.max_unpool(backend.relayout(yb, memory), backend.relayout(ib, memory), 2,
                                output_size=spatial, layout=layout)
        check(backend, up, ref.max_unpool(yn, inn, 2, output_size=spatial, layout=layout),
              "float32")


def test_lists_are_accepted_and_give_numpy(backend):
    y = gpupool.max_pool([[[1.0, 5.0, 2.0, 0.0]]], (2,))
    assert isinstance(y, np.ndarray)
    assert_array_equal(y, [[[5.0, 2.0]]])
    y = gpupool.avg_pool([[1, 2], [3, 4.5]], 2)
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert_array_equal(y, [[2.625]])


# ----------------------------------------------------------------------------- out=

def test_out_receives_the_result_and_is_returned(backend):
    rng = np.random.default_rng(2)
    x = make_input(rng, (2, 3, 6, 5), "float32")
    xb = backend.to_backend(x)
    cases = [
        (lambda o: gpupool.max_pool(xb, 3, 2, 1, out=o), ref.max_pool(x, 3, 2, 1)[0]),
        (lambda o: gpupool.avg_pool(xb, 3, 2, 1, count_include_pad=True, out=o),
         ref.avg_pool(x, 3, 2, 1, count_include_pad=True)),
        (lambda o: gpupool.lp_pool(xb, 2, 2, out=o), ref.lp_pool(x, 2, 2)),
        (lambda o: gpupool.global_avg_pool(xb, out=o), ref.global_avg_pool(x)),
        (lambda o: gpupool.global_max_pool(xb, out=o), ref.global_max_pool(x)),
        (lambda o: gpupool.adaptive_avg_pool(xb, (4, 2), out=o), ref.adaptive_avg_pool(x, (4, 2))),
        (lambda o: gpupool.adaptive_max_pool(xb, (4, 2), out=o),
         ref.adaptive_max_pool(x, (4, 2))[0]),
    ]
    for call, expected in cases:
        out = backend.full(expected.shape, 123.0, "float32")
        result = call(out)
        assert result is out
        check(backend, out, expected, "float32")
    # with indices: out receives the values, indices come back alongside
    out = backend.full((2, 3, 3, 3), 123.0, "float32")
    y, i = gpupool.max_pool(xb, 3, 2, 1, return_indices=True, out=out)
    assert y is out
    ev, ei = ref.max_pool(x, 3, 2, 1)
    check(backend, out, ev, "float32")
    check(backend, i, ei, "int64")
    out = backend.full((2, 3, 6, 5), 123.0, "float32")
    up = gpupool.max_unpool(y, i, 3, 2, 1, output_size=(6, 5), out=out)
    assert up is out
    check(backend, out, ref.max_unpool(ev, ei, 3, 2, 1, output_size=(6, 5)), "float32")


# ----------------------------------------------------------------------------- max_unpool

def test_max_unpool_round_trip_and_output_size_forms(backend):
    rng = np.random.default_rng(3)
    x = make_input(rng, (2, 3, 5, 7), "float64")
    xb = backend.to_backend(x)
    y, i = gpupool.max_pool(xb, 2, return_indices=True)        # (2, 3, 2, 3)
    yn, inn = backend.to_numpy(y), backend.to_numpy(i)
    # default output size (I-1)*s + k = (4, 6): indices from a 5x7 plane may fall outside it
    default = ref.unpool_output_length(2, 2, 2, (0, 0)), ref.unpool_output_length(3, 2, 2, (0, 0))
    assert default == (4, 6)
    for output_size in [(5, 7), [5, 7], (2, 3, 5, 7)]:
        up = gpupool.max_unpool(y, i, 2, output_size=output_size)
        expected = ref.max_unpool(yn, inn, 2, output_size=(5, 7))
        check(backend, up, expected, "float64")
        # every pooled maximum sits where it came from, everything else is zero
        un = backend.to_numpy(up)
        kept = un != 0
        assert_array_equal(un[kept], x[kept])
    # exact tiling: the default size is the input size
    x2 = make_input(rng, (1, 2, 4, 6), "float32")
    y2, i2 = gpupool.max_pool(backend.to_backend(x2), (2, 3), return_indices=True)
    up2 = gpupool.max_unpool(y2, i2, (2, 3))
    check(backend, up2, ref.max_unpool(backend.to_numpy(y2), backend.to_numpy(i2), (2, 3)),
          "float32")
    # padding and stride with NHWC
    x3 = make_input(rng, (2, 5, 5, 3), "float32")
    y3, i3 = gpupool.max_pool(backend.to_backend(x3), 3, 2, 1, return_indices=True,
                              layout="NHWC")
    up3 = gpupool.max_unpool(y3, i3, 3, 2, 1, layout="NHWC")   # (3-1)*2 - 2 + 3 = 5
    check(backend, up3, ref.max_unpool(backend.to_numpy(y3), backend.to_numpy(i3), 3, 2, 1,
                                       layout="NHWC"), "float32")
    assert up3.shape == (2, 5, 5, 3)


@pytest.mark.parametrize("bad", [-2, -2**40, 20])
def test_max_unpool_out_of_range_index_raises_and_leaves_out_untouched(backend, bad):
    x = backend.to_backend(np.ones((1, 1, 2, 2), np.float32))
    idx = np.array([[[[0, 1], [2, 3]]]], np.int64)
    idx[0, 0, 1, 1] = bad
    out = backend.full((1, 1, 4, 5), 9.0, "float32")
    with pytest.raises(ValueError, match="gpupool.max_unpool"):
        gpupool.max_unpool(x, backend.to_backend(idx), 2, output_size=(4, 5), out=out)
    assert_array_equal(backend.to_numpy(out), np.full((1, 1, 4, 5), 9.0, np.float32))


def kernels_asked(backend, monkeypatch):
    """The base names of the kernels the CUDA backend asks for from now on (a list; on NumPy
    it stays empty), and a function that empties it and forgets every prepared launch, so
    that the next call asks again."""
    names, clear = [], None
    if backend.name == "cupy":
        from gpupool.cuda import kernels, launching
        real = kernels.kernel
        monkeypatch.setattr(kernels, "kernel",
                            lambda n: (names.append(n.split("<")[0]), real(n))[1])
        clear = launching.clear_launches

    def restart():
        names.clear()
        if clear:
            clear()
    restart()
    return names, restart


def scatter_reference(values, indices, out_spatial, layout="NCHW"):
    """max_unpool by a direct loop over the pooled elements: each value written at its flat
    index in its plane of a zero ``out_spatial`` plane; index -1 writes nothing."""
    values, indices = np.asarray(values), np.asarray(indices)
    nd = len(out_spatial)
    if layout == "NHWC":  # planes as NCHW: the channel axis before the spatial ones
        values, indices = np.moveaxis(values, -1, -nd - 1), np.moveaxis(indices, -1, -nd - 1)
    lead = values.shape[:values.ndim - nd]
    out = np.zeros(lead + tuple(out_spatial), values.dtype)
    flat_out = out.reshape(-1, int(np.prod(out_spatial)))
    for plane, (vals, idxs) in enumerate(zip(values.reshape(len(flat_out), -1),
                                             indices.reshape(len(flat_out), -1))):
        for v, i in zip(vals.tolist(), idxs.tolist()):
            if i != -1:
                flat_out[plane, i] = v
    return np.moveaxis(out, -nd - 1, -1) if layout == "NHWC" else out


def test_max_unpool_skips_index_minus_one_from_an_empty_window(backend):
    x = backend.to_backend(np.array([[[1.0, 2.0]]]))
    y, i = gpupool.max_pool(x, (1,), (1,), padding=1, return_indices=True)  # empty ends
    assert backend.to_numpy(i).tolist() == [[[-1, 0, 1, -1]]]
    up = gpupool.max_unpool(y, i, (1,), (1,), 1, output_size=(2,))
    check(backend, up, np.array([[[1.0, 2.0]]]), "float64", exact=True)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "int16", "float16"])
@pytest.mark.parametrize("kernel, stride, padding", [
    (2, 1, 3), ((3, 2), (2, 1), ((4, 0), (1, 3))), (2, 2, ((0, 5), (3, 0)))])
def test_max_unpool_round_trip_with_pads_beyond_half_the_window(backend, layout, dtype,
                                                                kernel, stride, padding):
    """Regression: max_pool with pads larger than k/2 returns -1 for its empty windows, and
    max_unpool refused those very indices ("indices span [-1, 15] outside the output plane");
    -1 is now skipped: the output positions keep what the other indices write."""
    rng = np.random.default_rng(21)
    shape = (2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3)
    x = make_input(rng, shape, dtype, "ties")
    y, i = gpupool.max_pool(backend.to_backend(x), kernel, stride, padding, return_indices=True,
                            layout=layout)
    yn, inn = backend.to_numpy(y), backend.to_numpy(i)
    assert (inn == -1).any() and (inn >= 0).any()
    expected = scatter_reference(yn, inn, (4, 5), layout)
    check(backend, gpupool.max_unpool(y, i, kernel, stride, padding, output_size=(4, 5),
                                      layout=layout), expected, dtype, exact=True)
    out = backend.full(shape, 7, dtype)  # out= is zero-filled first, -1 leaves it so
    assert gpupool.max_unpool(y, i, kernel, stride, padding, output_size=shape, layout=layout,
                              out=out) is out
    check(backend, out, expected, dtype, exact=True)


def test_max_unpool_minus_one_does_not_write_over_a_value(backend):
    # a -1 in the last position of a plane: NumPy's put_along_axis would write its value
    # to the plane's last element; here that element keeps the value another index puts there
    y = backend.to_backend(np.array([[[[5.0, -9.0]]]], np.float32))
    i = backend.to_backend(np.array([[[[7, -1]]]], np.int64))
    up = gpupool.max_unpool(y, i, (2, 2))  # (2, 4)
    check(backend, up, np.array([[[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]]]]), "float32",
          exact=True)


# id, kernel, stride, padding, dilation, ceil_mode, pooled input's spatial size (= output_size),
# layout: windows that do not overlap (the CUDA backend gathers: one pass writes every output
# once) with padding, ceil mode, empty windows (index -1), positions no window covers
# (output_size beyond the default), 1-D and 3-D; and overlapping windows (zero fill + scatter)
UNPOOL_GEOMETRIES = [
    ("2d-k2", 2, None, 0, 1, False, (6, 8), "NCHW"),
    ("2d-k2-s3-p1-ceil", 2, 3, 1, 1, True, (8, 10), "NHWC"),
    ("2d-k2-empty-windows", 2, 2, ((2, 0), (0, 3)), 1, False, (6, 8), "NCHW"),
    ("2d-k2-d2-s3-beyond-default", 2, 3, 0, 2, False, (10, 11), "NCHW"),  # default (9, 9)
    ("1d-k3-s3-p1-ceil", (3,), (3,), 1, 1, True, (13,), "NCHW"),
    ("3d-k122-p011-ceil", (1, 2, 2), (1, 2, 2), (0, 1, 1), 1, True, (3, 5, 7), "NHWC"),
    ("2d-k3-s2-p1-overlapping", 3, 2, 1, 1, False, (9, 10), "NCHW"),
]


@pytest.mark.parametrize("stray", [False, True], ids=["own-windows", "stray-index"])
@pytest.mark.parametrize("geometry", UNPOOL_GEOMETRIES, ids=lambda g: g[0])
def test_max_unpool_gather_and_scatter_paths(backend, monkeypatch, geometry, stray):
    """Every output written once by the gather where windows do not overlap and every index
    lies in its own window (as max_pool's do); an in-plane index outside its window (PyTorch
    accepts any) or overlapping windows take the zero fill + scatter. Same values either way,
    those of a direct loop (scatter_reference); on CuPy, the kernel asked for says which."""
    name, kernel, stride, padding, dilation, ceil, spatial, layout = geometry
    rng = np.random.default_rng(5)
    lead = (2, 3)
    shape = lead + spatial if layout == "NCHW" else lead[:1] + spatial + lead[1:]
    x = make_input(rng, shape, "int16" if stray else "float32")
    y, i = gpupool.max_pool(backend.to_backend(x), kernel, stride, padding, dilation, ceil,
                            return_indices=True, layout=layout)
    yn, inn = backend.to_numpy(y), backend.to_numpy(i).astype(np.int32)
    if "empty" in name:
        assert (inn == -1).any()
    if stray:  # plane 0's first index moves to the last position no index of its plane names
        plane = np.moveaxis(inn, -1, 1) if layout == "NHWC" else inn
        named = set(plane.reshape(6, -1)[0].tolist())
        inn.reshape(-1)[0] = max(set(range(int(np.prod(spatial)))) - named)
    names, _ = kernels_asked(backend, monkeypatch)
    up = gpupool.max_unpool(y, backend.to_backend(inn), kernel, stride, padding,
                            output_size=spatial, dilation=dilation, layout=layout)
    check(backend, up, scatter_reference(yn, inn, spatial, layout), yn.dtype, exact=True)
    if backend.name == "cupy":
        gather = not stray and "overlapping" not in name
        assert names == ["max_index_check", "max_unpool_gather" if gather else "max_unpool"]


@pytest.mark.parametrize("dtype", ["float64", "float16", "int8"])
@pytest.mark.parametrize("kernel, spatial", [((2,), (18,)), (2, (6, 10)), ((2, 2, 2), (4, 6, 36))],
                         ids=["1d", "2d", "3d"])
def test_max_unpool_tiles_of_windows_that_tile_the_output(backend, monkeypatch, dtype, kernel,
                                                           spatial):
    """Windows that tile the output, 2 wide along W (NCHW), with max_pool's int64 indices: the
    CUDA backend's tiles (packs of 8 bytes of pooled elements per thread, a row's last pack
    short where its width is not a multiple) write the values of a direct loop
    (scatter_reference); other index dtypes take the gather."""
    rng = np.random.default_rng(9)
    x = make_input(rng, (2, 3) + spatial, dtype)
    y, i = gpupool.max_pool(backend.to_backend(x), kernel, return_indices=True)
    yn, inn = backend.to_numpy(y), backend.to_numpy(i)
    names, restart = kernels_asked(backend, monkeypatch)
    for indices, kernel_name in ((inn, "max_unpool_tiles"),
                                 (inn.astype(np.int32), "max_unpool_gather")):
        restart()
        up = gpupool.max_unpool(y, backend.to_backend(indices), kernel)
        check(backend, up, scatter_reference(yn, indices, spatial), yn.dtype, exact=True)
        if backend.name == "cupy":
            assert names == (["max_unpool_tiles"] if kernel_name == "max_unpool_tiles"
                             else ["max_index_check", kernel_name])


@pytest.mark.parametrize("kernel, spatial", [((2,), (10,)), (2, (4, 6)), ((2, 2, 2), (4, 4, 6))],
                         ids=["1d", "2d", "3d"])
def test_max_unpool_tiles_check_every_window(backend, monkeypatch, kernel, spatial):
    """The tiles with int64 indices, every window's index in turn: each tap of its window
    (the others their window's first tap) is gathered; a position next to the window (PyTorch
    accepts any in the plane; the others -1) falls back to the check and the scatter, with the
    values of a direct loop; positions outside the plane and a tap past 32 bits (2**32 above
    it) raise."""
    nd = len(spatial)
    lead = (1, 2)
    windows, _, pooled = ref._windows(np.zeros(lead + spatial), kernel, kernel, 0, 1, False,
                                      "NCHW")
    tap_sets = [sorted({f for _, f in taps}) for taps, _ in windows]
    plane = int(np.prod(spatial))
    first = [t[0] for t in tap_sets]
    y = np.arange(1, len(tap_sets) + 1, dtype=np.float32).reshape(lead + tuple(pooled))
    names, restart = kernels_asked(backend, monkeypatch)

    def call(values):
        restart()
        indices = np.array(values, np.int64).reshape(y.shape)
        up = gpupool.max_unpool(backend.to_backend(y), backend.to_backend(indices), kernel)
        return backend.to_numpy(up), indices

    per_plane = len(tap_sets) // lead[1]
    for k, taps in enumerate(tap_sets):
        steps = [1] + [int(np.prod(spatial[a + 1:])) for a in range(nd - 1)]
        near = {t + d * s for t in taps for s in steps for d in (-1, 1)} - set(taps)
        for v in taps + sorted(p for p in near if 0 <= p < plane):
            # outside its window, the others -1: no two indices name one position
            values = list(first) if v in taps else [-1] * len(first)
            values[k] = v
            got, indices = call(values)
            assert_array_equal(got, scatter_reference(y, indices, spatial),
                               err_msg=f"window {k % per_plane}, index {v}")
            if backend.name == "cupy":
                assert names == (["max_unpool_tiles"] if v in taps else
                                 ["max_unpool_tiles", "max_index_check", "max_unpool"]), v
        for v in (-2, plane, 2**32 + taps[0]):
            values = list(first)
            values[k] = v
            with pytest.raises(ValueError, match=r"indices span \[.*\], outside the output"):
                call(values)


SWAPPED_OPS = {
    "max_pool": lambda x: gpupool.max_pool(x, 3, 2, 1),
    "max_pool_indices": lambda x: gpupool.max_pool(x, 3, 1, 1, return_indices=True),
    "max_pool_nhwc": lambda x: gpupool.max_pool(x, (2, 3), 1, layout="NHWC",
                                                return_indices=True),
    "avg_pool": lambda x: gpupool.avg_pool(x, 3, 1, 1, count_include_pad=True),
    "avg_pool_nhwc": lambda x: gpupool.avg_pool(x, 2, layout="NHWC"),
    "lp_pool": lambda x: gpupool.lp_pool(x, 2, 3, 1, 1),
    "lp_pool_p3": lambda x: gpupool.lp_pool(x, 3, 2, ceil_mode=True),
    "global_avg_pool": lambda x: gpupool.global_avg_pool(x),
    "global_max_pool": lambda x: gpupool.global_max_pool(x),
    "adaptive_avg_pool": lambda x: gpupool.adaptive_avg_pool(x, (4, 3)),
    "adaptive_max_pool": lambda x: gpupool.adaptive_max_pool(x, (4, 3), return_indices=True),
}
MAX_OPS = ("max_pool", "max_pool_indices", "max_pool_nhwc", "global_max_pool",
           "adaptive_max_pool")


def _swapped_input(dtype):
    """Native data of ``dtype`` with ties, NaN and infinities (floats), and its byte-swapped
    copy (``>f2`` for float16 on a little-endian machine). float16 values near its largest
    make a float16 sum overflow where the float32 sum does not."""
    rng = np.random.default_rng(17)
    native = np.dtype(dtype)
    if native.kind == "f":
        x = rng.choice([6.0e4, -6.0e4, 5.0e4, 1.5, 0.0, -0.0, -2.25, 1e-3, np.inf, np.nan],
                       size=(2, 3, 9, 8), p=[.2, .1, .2, .2, .1, .05, .05, .05, .02, .03])
        x = x.astype(native)
    else:
        x = make_input(rng, (2, 3, 9, 8), native, "ties")
    swapped = x.astype(native.newbyteorder("S"))
    assert not swapped.dtype.isnative
    return x, swapped


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("dtype", FLOATS + ("int16", "int32", "int64"))
@pytest.mark.parametrize("op", list(SWAPPED_OPS))
def test_byte_swapped_input_gives_the_native_result(op, dtype):
    """Regression: NumPy arrays in non-native byte order reached the backend, which read
    them wrongly in places (float16 summed in float16 to inf; max with indices wrong with
    NaN). They are converted once at the entry: every op gives, bit for bit, its result on
    the native-order copy, in native order. (CuPy has no byte-swapped arrays.)"""
    x, swapped = _swapped_input(dtype)
    if x.dtype.kind != "f" and op not in MAX_OPS:
        return
    got, want = SWAPPED_OPS[op](swapped), SWAPPED_OPS[op](x)
    if not isinstance(want, tuple):
        got, want = (got,), (want,)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.dtype.isnative
        assert_array_equal(_bits(g), _bits(w))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
@pytest.mark.parametrize("indices_dtype", ["int64", "int32", "int16"])
def test_byte_swapped_max_unpool_gives_the_native_result(dtype, indices_dtype):
    x, _ = _swapped_input(dtype)
    y, i = gpupool.max_pool(x, 3, 2, 4, return_indices=True)  # pads beyond k/2: some -1
    assert (i == -1).any()
    got = gpupool.max_unpool(y.astype(y.dtype.newbyteorder("S")),
                             i.astype(np.dtype(indices_dtype).newbyteorder("S")), 3, 2, 4,
                             output_size=(9, 8))
    want = gpupool.max_unpool(y, i, 3, 2, 4, output_size=(9, 8))
    assert got.dtype == want.dtype and got.dtype.isnative
    assert_array_equal(_bits(got), _bits(want))
    assert_array_equal(_bits(want), _bits(scatter_reference(y, i, (9, 8))))


@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_max_unpool_dtypes(backend, dtype):
    rng = np.random.default_rng(4)
    x = make_input(rng, (2, 6, 6), dtype)
    y, i = gpupool.max_pool(backend.to_backend(x), (2, 2), return_indices=True)
    up = gpupool.max_unpool(y, i, (2, 2))
    check(backend, up, ref.max_unpool(backend.to_numpy(y), backend.to_numpy(i), (2, 2)), dtype)


def test_float16_max_every_special_value(backend):
    """float16 max (which the CPU runs on order-preserving int16 keys): NaN of either sign
    propagates, -inf/inf/-0/subnormals/the extremes order right, empty windows give -inf."""
    neg_nan = np.copysign(np.float16(np.nan), np.float16(-1))
    specials = np.array([neg_nan, np.nan, -np.inf, np.inf, -0.0, 0.0, 6e-8, -6e-8, 65504,
                         -65504, 1.0, -1.0], dtype=np.float16)
    rng = np.random.default_rng(9)
    x = rng.choice(specials, size=(2, 3, 6, 40)).astype(np.float16)
    x[1] = rng.choice(specials[2:], size=(3, 6, 40))  # no NaN: pure ordering
    for kernel, stride, padding in (((2, 3), (1, 2), ((0, 0), (1, 1))), ((1, 2), (2, 2), ((3, 3), (2, 2))),
                                    ((3, 3), (2, 3), 1)):
        got = gpupool.max_pool(backend.to_backend(x), kernel, stride, padding)
        want = ref.max_pool(x, kernel, stride, padding)[0]
        check(backend, got, want, "float16", exact=True)
    assert np.isneginf(backend.to_numpy(gpupool.max_pool(backend.to_backend(x), (1, 2), 2, ((3, 3), (0, 0))))[:, :, 0]).all()


def test_float16_sums_see_every_half_exactly(backend):
    """Every one of the 65536 float16 bit patterns through the summing ops with one-tap
    windows (the CPU widens halves to float32 with integer passes): each comes back as
    itself (-0 may come back as +0 from a sum), NaN as NaN, infinities with their sign."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    xb = backend.to_backend(x.reshape(64, 32, 32))
    nan = np.isnan(x)
    for got, want in ((gpupool.avg_pool(xb, 1), x),
                      (gpupool.global_avg_pool(backend.to_backend(x.reshape(-1, 1, 1))), x),
                      (gpupool.adaptive_avg_pool(xb, (32, 32)), x),
                      (gpupool.lp_pool(xb, 1, 1), np.abs(x))):
        got = backend.to_numpy(got).reshape(-1)
        assert got.dtype == np.float16
        assert np.isnan(got[nan]).all()
        assert_array_equal(got[~nan].astype(np.float64), want[~nan].astype(np.float64))


# ----------------------------------------------------------------------------- 1D geometry grid

def test_every_small_1d_geometry(backend):
    """Sizes 1..9 against every kernel, stride, dilation and padding up to (and past) the
    window extent, several planes at once: the CPU's flat, dense and per-tap paths and the
    edge outputs between them all meet here."""
    rng = np.random.default_rng(8)
    for size in range(1, 10):
        x = make_input(rng, (3, 2, size), "float64", specials=(np.nan,) if size % 3 == 0 else ())
        xb = backend.to_backend(x)
        for k in range(1, 5):
            for s in range(1, 4):
                for d in (1, 2):
                    for pads in ((0, 0), (1, 0), (0, 2), (k, k), (k + 1, 1)):
                        for ceil in (False, True):
                            if ref.output_length(size, k, s, pads, d, ceil) < 1:
                                continue  # the spec rejects it (tested elsewhere)
                            want = ref.max_pool(x, (k,), (s,), (pads,), (d,), ceil)[0]
                            got = gpupool.max_pool(xb, (k,), (s,), (pads,), (d,), ceil)
                            check(backend, got, want, "float64", exact=True)
                            got = gpupool.avg_pool(xb, (k,), (s,), (pads,), ceil, dilation=(d,))
                            want = ref.avg_pool(x, (k,), (s,), (pads,), ceil, dilation=(d,))
                            check(backend, got, want, "float64")


def test_every_small_strided_2d_geometry(backend):
    """Small 2D planes, strides 2 and 3, both layouts, 1-, 2- and 4-byte dtypes, odd and even
    row lengths, several planes at once: on the CPU the outer axis runs dense (short strided
    rows), and stride-2 picks of single elements go through double-width integers."""
    rng = np.random.default_rng(12)
    for layout, channels in (("NCHW", 1), ("NHWC", 3)):
        for spatial in ((1, 7), (5, 4), (6, 9), (9, 10)):
            for dtype in ("int8", "float16", "float32"):
                x = make_input(rng, full_shape((2, 3), spatial, layout, channels), dtype)
                xb = backend.to_backend(x)
                for k, s, pads, ceil in itertools.product((1, 2, 3), (2, 3),
                                                          (((0, 0), (0, 0)), ((1, 1), (1, 0)), ((0, 2), (2, 1))),
                                                          (False, True)):
                    if min(ref.output_length(i, k, s, p, 1, ceil) for i, p in zip(spatial, pads)) < 1:
                        continue  # the spec rejects it (tested elsewhere)
                    kw = dict(kernel_size=(k, k), stride=s, padding=pads, ceil_mode=ceil, layout=layout)
                    check(backend, gpupool.max_pool(xb, **kw), ref.max_pool(x, **kw)[0], dtype, exact=True)
                    if dtype != "int8":
                        check(backend, gpupool.avg_pool(xb, **kw), ref.avg_pool(x, **kw), dtype)


# ----------------------------------------------------------------------------- big planes

def test_big_plane_against_a_vectorised_check(backend):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 1, 1024, 1024)).astype(np.float32)
    xb = backend.to_backend(x)
    x64 = x.astype(np.float64)
    # max, k=2 s=2: a reshape
    expected = x64.reshape(1, 1, 512, 2, 512, 2).max(axis=(3, 5))
    check(backend, gpupool.max_pool(xb, 2), expected, "float32", exact=True)
    # avg, k=3 s=1 pad=1, count_include_pad False: zero-padded box sums over box counts
    padded = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view
    sums = win(padded, (3, 3), axis=(2, 3)).sum(axis=(-2, -1))
    counts = win(ones, (3, 3), axis=(2, 3)).sum(axis=(-2, -1))
    check(backend, gpupool.avg_pool(xb, 3, 1, 1), sums / counts, "float32")
    check(backend, gpupool.avg_pool(xb, 3, 1, 1, count_include_pad=True), sums / 9, "float32")
    check(backend, gpupool.global_avg_pool(xb), x64.mean(axis=(2, 3), keepdims=True), "float32")
    check(backend, gpupool.global_max_pool(xb), x64.max(axis=(2, 3), keepdims=True), "float32",
          exact=True)
    # max with indices, k=2 s=2: argmax inside each 2x2 block (first on ties)
    y, i = gpupool.max_pool(xb, 2, return_indices=True)
    blocks = x64.reshape(512, 2, 512, 2).transpose(0, 2, 1, 3).reshape(512, 512, 4)
    arg = blocks.argmax(axis=-1)
    rows = np.arange(512)[:, None] * 2 + arg // 2
    cols = np.arange(512)[None, :] * 2 + arg % 2
    check(backend, i, (rows * 1024 + cols)[None, None], "int64")


MANY_PLANES = [  # 128 planes of 128x128: several cache blocks, run on the thread pool
    dict(op="max", kernel=(3, 3), stride=(2, 2), padding=1, dtype="float32"),
    dict(op="max", kernel=(3, 3), stride=(1, 1), padding="same", dilation=(2, 2),
         ceil_mode=True, dtype="float16"),
    dict(op="avg", kernel=(3, 3), stride=(1, 1), padding=1, dtype="float32"),
    dict(op="avg", kernel=(2, 3), stride=(2, 2), padding=((0, 1), (1, 1)), ceil_mode=True,
         count_include_pad=True, dtype="float64"),
    dict(op="avg", kernel=(3, 3), stride=(2, 2), padding="same_lower", divisor_override=4,
         dtype="float16"),
    dict(op="lp", p=2.0, kernel=(2, 2), stride=(2, 2), dtype="float32"),
    dict(op="lp", p=1.7, kernel=(3, 2), stride=(3, 1), padding=(2, 0), ceil_mode=True,
         dilation=(1, 3), dtype="float32"),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cfg", MANY_PLANES, ids=lambda c: f"{c['op']}-{c['dtype']}")
def test_many_planes_against_a_vectorised_check(backend, cfg, layout):
    cfg = dict(cfg)
    op, dtype = cfg.pop("op"), cfg.pop("dtype")
    p = cfg.pop("p", None)
    kernel, stride = cfg["kernel"], cfg["stride"]
    padding, dilation = cfg.get("padding", 0), cfg.get("dilation", (1, 1))
    ceil_mode = cfg.get("ceil_mode", False)
    x = np.random.default_rng(7).standard_normal((8, 16, 128, 128)).astype(dtype)
    pads = ref.resolve_padding(padding, (128, 128), kernel, stride, dilation)
    out_spatial = tuple(ref.output_length(128, k, s, pd, d, ceil_mode)
                        for k, s, pd, d in zip(kernel, stride, pads, dilation))
    expected = ref.vectorised_window(
        x, op, kernel, stride, pads, dilation, out_spatial,
        count_include_pad=cfg.get("count_include_pad", False),
        divisor_override=cfg.get("divisor_override"), p=p)
    xin = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if layout == "NHWC" else x
    if layout == "NHWC":
        expected = np.moveaxis(expected, 1, -1)
    xb = backend.to_backend(xin)
    if op == "max":
        y, i = gpupool.max_pool(xb, kernel, stride, padding, dilation, ceil_mode,
                                return_indices=True, layout=layout)
        check(backend, gpupool.max_pool(xb, kernel, stride, padding, dilation, ceil_mode,
                                        layout=layout), expected, dtype, exact=True)
        check(backend, y, expected, dtype, exact=True)
        # every index points at its maximum inside its own plane
        xi = np.moveaxis(xin, -1, 1) if layout == "NHWC" else xin
        yi = backend.to_numpy(i)
        yi = np.moveaxis(yi, -1, 1) if layout == "NHWC" else yi
        gathered = np.take_along_axis(xi.reshape(8, 16, -1), yi.reshape(8, 16, -1), axis=2)
        assert_array_equal(gathered.astype(np.float64).reshape(yi.shape),
                           np.moveaxis(expected, -1, 1) if layout == "NHWC" else expected)
    elif op == "avg":
        check(backend, gpupool.avg_pool(xb, kernel, stride, padding, ceil_mode,
                                        cfg.get("count_include_pad", False),
                                        cfg.get("divisor_override"), dilation=dilation,
                                        layout=layout), expected, dtype)
    else:
        check(backend, gpupool.lp_pool(xb, p, kernel, stride, padding, dilation, ceil_mode,
                                       layout=layout), expected, dtype)


# ----------------------------------------------------------------------------- properties

def _call_window(backend, op, case, xb, **extra):
    args = window_args(case)
    if op == "max":
        return gpupool.max_pool(xb, **args, **extra)
    if op == "avg":
        return gpupool.avg_pool(xb, **args, **extra)
    return gpupool.lp_pool(xb, extra.pop("p"), **args, **extra)


def _maybe_out(backend, case, shape):
    return backend.full(shape, 77, numpy_dtype(case["dtype"])) if case["use_out"] else None


@settings(max_examples=500)
@given(case=window_cases("max"), return_indices=st.booleans())
def test_max_pool_matches_reference(backend, case, return_indices):
    x, xb = build_input(backend, case)
    if expect_too_small(case):
        with pytest.raises(ValueError, match="gpupool.max_pool"):
            _call_window(backend, "max", case, xb)
        return
    ev, ei = ref.max_pool(x, case["kernel"], case["stride"], case["padding"], case["dilation"],
                          case["ceil_mode"], case["layout"])
    out = _maybe_out(backend, case, ev.shape)
    res = _call_window(backend, "max", case, xb, return_indices=return_indices, out=out)
    if return_indices:
        res, idx = res
        check(backend, idx, ei, "int64")
    if out is not None:
        assert res is out
    check(backend, res, ev, case["dtype"], exact=True)


@settings(max_examples=400)
@given(case=window_cases("avg"), count_include_pad=st.booleans(),
       divisor_override=st.none() | st.integers(1, 5))
def test_avg_pool_matches_reference(backend, case, count_include_pad, divisor_override):
    x, xb = build_input(backend, case)
    extra = dict(count_include_pad=count_include_pad, divisor_override=divisor_override)
    if expect_too_small(case):
        with pytest.raises(ValueError, match="gpupool.avg_pool"):
            _call_window(backend, "avg", case, xb, **extra)
        return
    expected = ref.avg_pool(x, case["kernel"], case["stride"], case["padding"],
                            case["ceil_mode"], count_include_pad, divisor_override,
                            case["dilation"], case["layout"])
    out = _maybe_out(backend, case, expected.shape)
    res = _call_window(backend, "avg", case, xb, out=out, **extra)
    if out is not None:
        assert res is out
    check(backend, res, expected, case["dtype"])


@settings(max_examples=400)
@given(case=window_cases("lp"), p=st.sampled_from([1, 2, 3, 0.5, 1.7, 2.0, 1.0]))
def test_lp_pool_matches_reference(backend, case, p):
    x, xb = build_input(backend, case)
    if expect_too_small(case):
        with pytest.raises(ValueError, match="gpupool.lp_pool"):
            _call_window(backend, "lp", case, xb, p=p)
        return
    expected = ref.lp_pool(x, p, case["kernel"], case["stride"], case["padding"],
                           case["dilation"], case["ceil_mode"], case["layout"])
    out = _maybe_out(backend, case, expected.shape)
    res = _call_window(backend, "lp", case, xb, p=p, out=out)
    if out is not None:
        assert res is out
    check(backend, res, expected, case["dtype"])


@st.composite
def adaptive_cases(draw, op):
    nd = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    lead = tuple(draw(st.integers(0 if draw(st.integers(0, 20)) == 0 else 1, 2))
                 for _ in range(draw(st.integers(0, 2))))
    channels = draw(st.integers(1, 3)) if layout == "NHWC" else 1
    spatial = tuple(draw(st.sampled_from(range(1, MAX_SIZE[nd] + 2))) for _ in range(nd))
    output_size = tuple(draw(st.integers(1, i + 2)) for i in spatial)  # O > I allowed
    if nd == 2 and output_size[0] == output_size[1] and draw(st.booleans()):
        output_size = output_size[0]
    dtype = draw(st.sampled_from(DRAWN_FLOATS + INTS if op == "max" else DRAWN_FLOATS))
    specials = draw_specials(draw, op, dtype)
    return dict(nd=nd, layout=layout, lead=lead, channels=channels, spatial=spatial,
                output_size=output_size, dtype=dtype, specials=specials,
                values=draw(st.sampled_from(["ties", "normal"])),
                memory=draw(st.sampled_from(MEMORY)), seed=draw(st.integers(0, 2**32 - 1)),
                use_out=draw(st.booleans()))


@settings(max_examples=250)
@given(case=adaptive_cases("avg"))
def test_adaptive_avg_pool_matches_reference(backend, case):
    x, xb = build_input(backend, case)
    expected = ref.adaptive_avg_pool(x, case["output_size"], case["layout"])
    out = _maybe_out(backend, case, expected.shape)
    res = gpupool.adaptive_avg_pool(xb, case["output_size"], layout=case["layout"], out=out)
    if out is not None:
        assert res is out
    check(backend, res, expected, case["dtype"])


@settings(max_examples=300)
@given(case=adaptive_cases("max"), return_indices=st.booleans())
def test_adaptive_max_pool_matches_reference(backend, case, return_indices):
    x, xb = build_input(backend, case)
    ev, ei = ref.adaptive_max_pool(x, case["output_size"], case["layout"])
    out = _maybe_out(backend, case, ev.shape)
    res = gpupool.adaptive_max_pool(xb, case["output_size"], return_indices=return_indices,
                                    layout=case["layout"], out=out)
    if return_indices:
        res, idx = res
        check(backend, idx, ei, "int64")
    if out is not None:
        assert res is out
    check(backend, res, ev, case["dtype"], exact=True)


@settings(max_examples=200)
@given(case=adaptive_cases("max"))
def test_global_pools_match_reference(backend, case):
    x, xb = build_input(backend, case)
    nd, layout = case["nd"], case["layout"]
    check(backend, gpupool.global_max_pool(xb, spatial_dims=nd, layout=layout),
          ref.global_max_pool(x, nd, layout), case["dtype"], exact=True)
    if case["dtype"] not in INTS and np.inf not in case["specials"]:
        check(backend, gpupool.global_avg_pool(xb, spatial_dims=nd, layout=layout),
              ref.global_avg_pool(x, nd, layout), case["dtype"])


@settings(max_examples=300)
@given(case=window_cases("max"))
def test_max_unpool_round_trip_matches_reference(backend, case):
    x, xb = build_input(backend, case)
    if expect_too_small(case) or isinstance(case["padding"], str) and case["padding"] != "valid":
        return
    y, i = _call_window(backend, "max", case, backend.to_backend(x), return_indices=True)
    yn, inn = backend.to_numpy(y), backend.to_numpy(i)
    yb, ib = backend.relayout(y, case["memory"]), backend.relayout(i, case["memory"])
    spatial = case["spatial"]
    full = full_shape(case["lead"], spatial, case["layout"], case["channels"])
    output_size = full if case["use_out"] else spatial
    up = gpupool.max_unpool(yb, ib, case["kernel"], case["stride"], case["padding"],
                            output_size=output_size, dilation=case["dilation"],
                            layout=case["layout"])
    if (inn < 0).any():  # an empty window's index -1 is skipped
        expected = scatter_reference(yn, inn, spatial, case["layout"]).astype(
            np.int64 if yn.dtype.kind in "iu" else np.float64)
    else:
        expected = ref.max_unpool(yn, inn, case["kernel"], case["stride"], case["padding"],
                                  output_size=spatial, layout=case["layout"])
    check(backend, up, expected, case["dtype"], exact=True)


@pytest.mark.parametrize("dtype, big", [("float16", 6.0e4), ("float32", 3.0e38),
                                        ("float64", 1.5e308)])
@pytest.mark.parametrize("shape, layout", [((2, 3, 7, 7), "NCHW"), ((1, 2, 300, 301), "NCHW"),
                                           ((2, 7, 7, 5), "NHWC"), ((1, 40, 41, 3), "NHWC")])
def test_global_mean_of_values_near_the_largest_float_is_finite(backend, dtype, big, shape,
                                                                layout):
    """Regression: the GPU summed a plane, then scaled it, so four float32 values of 3e38
    averaged to inf where the CPU gave 3e38; both now sum value * (1 / count). Small and
    large planes, one and two passes, both layouts."""
    x = np.full(shape, big, dtype)
    x.reshape(-1)[::7] = -big / 2
    axes = (1, 2) if layout == "NHWC" else (2, 3)
    count = shape[axes[0]] * shape[axes[1]]
    expected = (x.astype(np.float64) / count).sum(axis=axes, keepdims=True)
    check(backend, gpupool.global_avg_pool(backend.to_backend(x), layout=layout), expected,
          dtype)
