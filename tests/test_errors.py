"""Every class of invalid argument raises the same exception type on every backend, with a
message that names the function, the parameter and the bad value."""
from __future__ import annotations

import re

import numpy as np
import pytest

import gpupool
from gpupool import quantized as Q


def raises(exc, func, *fragments):
    """``pytest.raises`` that also checks the message names ``gpupool.<func>`` and every
    fragment (the parameter, the bad value)."""
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in (f"gpupool.{func}",) + fragments)
    return pytest.raises(exc, match=re.compile(pattern, re.S))


@pytest.fixture
def x(backend):
    return backend.to_backend(np.arange(2 * 3 * 6 * 6, dtype=np.float32).reshape(2, 3, 6, 6))


WINDOW_OPS = {
    "max_pool": lambda x, **kw: gpupool.max_pool(x, **kw),
    "avg_pool": lambda x, **kw: gpupool.avg_pool(x, **kw),
    "lp_pool": lambda x, **kw: gpupool.lp_pool(x, 2, **kw),
}


@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("param,value", [
    ("kernel_size", 0), ("kernel_size", (2, 0)), ("kernel_size", (-1, 2)),
    ("stride", 0), ("stride", (1, 0)), ("dilation", 0), ("dilation", (0, 1)),
])
def test_kernel_stride_dilation_below_one(x, func, param, value):
    kw = dict(kernel_size=2)
    kw[param] = value
    with raises(ValueError, func, param, repr(value)):
        WINDOW_OPS[func](x, **kw)


@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("padding", [-1, (0, -1), ((0, 1), (-1, 0))])
def test_negative_padding(x, func, padding):
    with raises(ValueError, func, "padding"):
        WINDOW_OPS[func](x, kernel_size=2, padding=padding)


@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("param,value", [
    ("stride", (1, 1, 1)), ("stride", (1,)), ("dilation", (1, 1, 1)), ("padding", (1, 1, 1)),
    ("padding", ((1, 1),)), ("padding", ((1, 1), (1, 1, 1))), ("padding", ((1, 1), (1, 1), (0, 0))),
])
def test_wrong_tuple_length(x, func, param, value):
    kw = dict(kernel_size=(2, 2))
    kw[param] = value
    with raises(ValueError, func, param):
        WINDOW_OPS[func](x, **kw)


@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("padding", ["full", "same_upper", ""])
def test_unknown_padding_string(x, func, padding):
    with raises(ValueError, func, "padding", repr(padding)):
        WINDOW_OPS[func](x, kernel_size=2, padding=padding)


ALL_OPS = {
    **WINDOW_OPS,
    "global_avg_pool": lambda x, **kw: gpupool.global_avg_pool(x, **kw),
    "global_max_pool": lambda x, **kw: gpupool.global_max_pool(x, **kw),
    "adaptive_avg_pool": lambda x, **kw: gpupool.adaptive_avg_pool(x, (2, 2), **kw),
    "adaptive_max_pool": lambda x, **kw: gpupool.adaptive_max_pool(x, (2, 2), **kw),
}


def _window_kw(func):
    return dict(kernel_size=2) if func in WINDOW_OPS else {}


@pytest.mark.parametrize("func", list(ALL_OPS))
@pytest.mark.parametrize("layout", ["NCDHW", "NCHW ", "CHW", "", None, 1])
def test_unknown_layout(x, func, layout):
    with raises(ValueError, func, "layout", repr(layout)):
        ALL_OPS[func](x, layout=layout, **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS))
def test_string_options_ignore_case(backend, func):
    """One rule for every string option: case does not matter (padding always allowed
    "SAME"; layout used to reject "nchw")."""
    call, kw = ALL_OPS[func], _window_kw(func)
    xn = np.arange(2 * 6 * 6 * 3, dtype=np.float32).reshape(2, 6, 6, 3)
    nhwc = backend.to_backend(xn)
    for spelling in ("nhwc", "Nhwc", "NHWC"):
        assert_same(backend, call(nhwc, layout=spelling, **kw), call(nhwc, layout="NHWC", **kw))
    nchw = backend.to_backend(np.ascontiguousarray(xn.transpose(0, 3, 1, 2)))
    assert_same(backend, call(nchw, layout="nchw", **kw), call(nchw, **kw))
    if func in WINDOW_OPS:
        for lower, spellings in (("same", ("SAME", "Same")), ("valid", ("VALID", "Valid")),
                                 ("same_lower", ("SAME_LOWER",))):
            for spelling in spellings:
                assert_same(backend, call(nchw, kernel_size=3, padding=spelling),
                            call(nchw, kernel_size=3, padding=lower))


def test_max_unpool_string_padding_ignores_case(backend):
    x = backend.to_backend(np.arange(49, dtype=np.float32).reshape(1, 1, 7, 7))
    y, i = gpupool.max_pool(x, 3, 2, "SAME", return_indices=True)
    assert_same(backend, gpupool.max_unpool(y, i, 3, 2, "Same", output_size=(7, 7)),
                gpupool.max_unpool(y, i, 3, 2, "same", output_size=(7, 7)))


def assert_same(backend, a, b):
    np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b))


@pytest.mark.parametrize("func", list(ALL_OPS))
@pytest.mark.parametrize("shape,layout", [((6,), "NCHW"), ((6, 6), "NHWC"), ((), "NCHW")])
def test_rank_too_small(backend, func, shape, layout):
    x = backend.to_backend(np.ones(shape, np.float32))
    with raises(ValueError, func, "rank", str(shape)):
        ALL_OPS[func](x, layout=layout, **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS))
@pytest.mark.parametrize("shape,layout", [((2, 0, 5), "NCHW"), ((1, 3, 5, 0), "NCHW"),
                                          ((1, 0, 5, 3), "NHWC")])
def test_empty_spatial_dims(backend, func, shape, layout):
    x = backend.to_backend(np.ones(shape, np.float32))
    with raises(ValueError, func, "spatial", str(shape)):
        ALL_OPS[func](x, layout=layout, **_window_kw(func))


@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("kw,size", [
    (dict(kernel_size=7), "(0, 0)"),
    (dict(kernel_size=(3, 3), dilation=3), "(0, 0)"),
    (dict(kernel_size=(7, 2)), "(0, 3)"),
    (dict(kernel_size=(8, 1), padding=((0, 1), (0, 0))), "(0, 6)"),
])
def test_output_size_below_one_prints_the_computed_size(x, func, kw, size):
    with raises(ValueError, func, "output size", size):
        WINDOW_OPS[func](x, **kw)


@pytest.mark.parametrize("p", [0, -1, -0.5, 0.0, float("inf"), float("nan")])
def test_lp_p_must_be_positive_and_finite(x, p):
    with raises(ValueError, "lp_pool", "p=", repr(p)):
        gpupool.lp_pool(x, p, 2)


@pytest.mark.parametrize("func", ["adaptive_avg_pool", "adaptive_max_pool"])
@pytest.mark.parametrize("size", [0, (0, 2), (2, -1), (1, 1, 0)])
def test_adaptive_output_size_must_be_positive(x, func, size):
    fn = getattr(gpupool, func)
    xx = x if not (isinstance(size, tuple) and len(size) == 3) else x[..., None]
    with raises(ValueError, func, "output_size", repr(size)):
        fn(xx, size)


@pytest.mark.parametrize("func", ["global_avg_pool", "global_max_pool"])
@pytest.mark.parametrize("dims,exc", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                      (2.0, TypeError), ("2", TypeError)])
def test_global_spatial_dims_must_be_a_positive_int(x, func, dims, exc):
    with raises(exc, func, "spatial_dims", repr(dims)):
        getattr(gpupool, func)(x, spatial_dims=dims)


def test_divisor_override_and_ceil_mode_types(x):
    for bad in (0, -2):
        with raises(ValueError, "avg_pool", "divisor_override", repr(bad)):
            gpupool.avg_pool(x, 2, divisor_override=bad)
    for bad in (1.5, 2.0, True, "2"):
        with raises(TypeError, "avg_pool", "divisor_override", repr(bad)):
            gpupool.avg_pool(x, 2, divisor_override=bad)
    with raises(TypeError, "max_pool", "ceil_mode"):
        gpupool.max_pool(x, 2, ceil_mode="yes")


@pytest.mark.parametrize("value", [2**31, 10**400, np.int64(2**40)],
                         ids=["2**31", "10**400", "np.int64(2**40)"])
def test_divisor_override_beyond_int32(x, value):
    """Regression: CUDA passes divisor_override to the kernels as an int32, and raised a raw
    OverflowError from 2**31 (NumPy accepted it); 10**400 was an OverflowError on both."""
    with raises(ValueError, "avg_pool", "divisor_override", repr(value), "2147483647"):
        gpupool.avg_pool(x, 2, divisor_override=value)


def test_divisor_override_at_the_int32_limit(backend, x):
    got = gpupool.avg_pool(x, 2, divisor_override=np.int64(2**31 - 1))
    xn = backend.to_numpy(x).astype(np.float64)
    sums = xn.reshape(2, 3, 3, 2, 3, 2).sum(axis=(3, 5))
    np.testing.assert_allclose(backend.to_numpy(got), sums / (2**31 - 1), rtol=1e-6)


@pytest.mark.parametrize("dtype, p", [
    ("float32", 10**400), ("float32", 1e39), ("float32", 1e-39), ("float16", 4e38),
    ("float64", 10**400), ("float64", 1e-310), ("float64", float("-inf"))],
    ids=lambda v: "10**400" if v == 10**400 else str(v))
def test_lp_p_beyond_the_kernels_float(backend, dtype, p):
    """Regression: p=10**400 was a raw OverflowError; p beyond float32 (the kernels' p and
    1/p for float16/float32 input) became inf or 0 there."""
    x = backend.to_backend(np.ones((1, 1, 4, 4), dtype))
    with raises(ValueError, "lp_pool", f"p={p!r}", "float"):
        gpupool.lp_pool(x, p, 2)


@pytest.mark.parametrize("p", [1e39, 1e-39, 3.0])
def test_lp_p_beyond_float32_is_taken_for_float64_input(backend, p):
    xn = np.array([[[[1.0, 1.0], [1.0, 1.0]]]])
    got = backend.to_numpy(gpupool.lp_pool(backend.to_backend(xn), p, 2))
    with np.errstate(over="ignore"):
        expected = np.float64(4.0) ** (1 / p)  # (4 * 1**p) ** (1/p): inf for p = 1e-39
    np.testing.assert_allclose(got, np.full((1, 1, 1, 1), expected), rtol=1e-12)


@pytest.mark.parametrize("p", ["2", True, np.bool_(True), None])
def test_lp_p_must_be_a_real_number(x, p):
    with raises(TypeError, "lp_pool", f"p={p!r}", "real number"):
        gpupool.lp_pool(x, p, 2)


BOOL_PARAMS = [
    ("max_pool", "ceil_mode", lambda x, v: gpupool.max_pool(x, 2, ceil_mode=v)),
    ("max_pool", "return_indices", lambda x, v: gpupool.max_pool(x, 2, return_indices=v)),
    ("avg_pool", "ceil_mode", lambda x, v: gpupool.avg_pool(x, 2, ceil_mode=v)),
    ("avg_pool", "count_include_pad",
     lambda x, v: gpupool.avg_pool(x, 2, padding=1, count_include_pad=v)),
    ("lp_pool", "ceil_mode", lambda x, v: gpupool.lp_pool(x, 2, 2, ceil_mode=v)),
    ("adaptive_max_pool", "return_indices",
     lambda x, v: gpupool.adaptive_max_pool(x, (2, 2), return_indices=v)),
    ("quantized.max_pool", "ceil_mode",
     lambda x, v: Q.max_pool(Q.QArray(x.astype("int8"), 0.5), 2, ceil_mode=v)),
    ("quantized.avg_pool", "ceil_mode",
     lambda x, v: Q.avg_pool(Q.QArray(x.astype("int8"), 0.5), 2, ceil_mode=v)),
    ("quantized.avg_pool", "count_include_pad",
     lambda x, v: Q.avg_pool(Q.QArray(x.astype("int8"), 0.5), 2, padding=1,
                             count_include_pad=v)),
]


@pytest.mark.parametrize("func, param, call", BOOL_PARAMS,
                         ids=[f"{func}-{param}" for func, param, _ in BOOL_PARAMS])
@pytest.mark.parametrize("value", ["False", "no", 0, 1, None, 1.0, np.array(True)],
                         ids=repr)
def test_boolean_parameters_must_be_bools(backend, func, param, call, value):
    """Regression: count_include_pad="False", return_indices="no" and the like were taken
    as true."""
    x = backend.to_backend(np.arange(2 * 3 * 5 * 5, dtype=np.float32).reshape(2, 3, 5, 5) % 7)
    with raises(TypeError, func, f"{param}={value!r}", "bool"):
        call(x, value)


@pytest.mark.parametrize("func, param, call", BOOL_PARAMS,
                         ids=[f"{func}-{param}" for func, param, _ in BOOL_PARAMS])
def test_numpy_bools_are_bools(backend, func, param, call):
    x = backend.to_backend(np.arange(2 * 3 * 5 * 5, dtype=np.float32).reshape(2, 3, 5, 5) % 7)
    for value in (False, True):
        assert_same_result(backend, call(x, np.bool_(value)), call(x, value))


def assert_same_result(backend, a, b):
    """Equal results of any op: arrays, (values, indices) tuples or QArrays."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            assert_same_result(backend, u, v)
        return
    if isinstance(a, Q.QArray):
        assert (a.scale, a.zero_point) == (b.scale, b.zero_point)
        a, b = a.data, b.data
    assert not isinstance(b, (tuple, Q.QArray))
    assert_same(backend, a, b)


@pytest.mark.parametrize("func", sorted(WINDOW_OPS))
@pytest.mark.parametrize("kwargs, name", [
    (dict(kernel_size=2**31), "kernel_size"), (dict(kernel_size=2, stride=2**31), "stride"),
    (dict(kernel_size=1, dilation=(1, 2**31)), "dilation"),
    (dict(kernel_size=2, padding=2**31), "padding"),
    (dict(kernel_size=2, padding=((0, 0), (2**31, 1))), "padding")])
def test_window_parameters_beyond_int32(x, func, kwargs, name):
    """Regression: window parameters >= 2**31 passed validation, and the CUDA backend alone
    raised OverflowError converting them to int32 kernel arguments."""
    with raises(ValueError, func, name, "2**31 - 1"):
        WINDOW_OPS[func](x, **kwargs)


def test_unpool_window_parameters_beyond_int32(x):
    idx = x.astype("int64") * 0
    for kwargs, name in ((dict(kernel_size=2**31), "kernel_size"),
                         (dict(kernel_size=2, stride=2**31), "stride")):
        with raises(ValueError, "max_unpool", name, "2**31 - 1"):
            gpupool.max_unpool(x, idx, **kwargs)


@pytest.mark.parametrize("kernel_size,exc", [(2.0, TypeError), ((2, 2.5), TypeError),
                                             ("2", TypeError), ((), ValueError),
                                             (True, TypeError)])
def test_kernel_size_type(x, kernel_size, exc):
    with raises(exc, "max_pool", "kernel_size", repr(kernel_size)):
        gpupool.max_pool(x, kernel_size)


@pytest.mark.parametrize("size", [2.0, "2", None, (), True])
def test_scalar_or_empty_sizes_name_their_parameter(x, size):
    """Regression: a scalar non-int size said "size 2.0 must be ..." without the parameter."""
    exc = ValueError if size == () else TypeError
    for func in WINDOW_OPS:
        with raises(exc, func, "kernel_size=", repr(size)):
            WINDOW_OPS[func](x, kernel_size=size)
    for func in ("adaptive_avg_pool", "adaptive_max_pool"):
        with raises(exc, func, "output_size=", repr(size)):
            getattr(gpupool, func)(x, size)
    with raises(exc, "max_unpool", "kernel_size=", repr(size)):
        gpupool.max_unpool(x, x.astype("int64") * 0, size)


# ----------------------------------------------------------------------------- dtypes, inputs

@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
@pytest.mark.parametrize("func", ["avg_pool", "lp_pool", "global_avg_pool", "adaptive_avg_pool"])
def test_integer_input_to_avg_or_lp_points_at_quantized(backend, func, dtype):
    x = backend.to_backend(np.ones((1, 2, 4, 4), dtype))
    with raises(TypeError, func, dtype, "quantized"):
        ALL_OPS[func](x, **_window_kw(func))


@pytest.mark.parametrize("dtype", ["bool", "complex64", "complex128"])
@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
def test_bool_and_complex_are_rejected(backend, func, dtype):
    x = backend.to_backend(np.ones((1, 2, 4, 4), dtype))
    with raises(TypeError, func, dtype):
        if func == "max_unpool":
            gpupool.max_unpool(x, backend.to_backend(np.zeros((1, 2, 4, 4), np.int64)), 2)
        else:
            ALL_OPS[func](x, **_window_kw(func))


@pytest.mark.parametrize("make", [lambda: {"a": 1}, lambda: 3.0, lambda: None, lambda: "abc",
                                  lambda: np.float32(1.0), lambda: memoryview(b"1234")],
                         ids=["dict", "scalar", "None", "str", "numpy-scalar", "memoryview"])
@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
def test_non_array_non_sequence_input_is_a_type_error(func, make):
    x = make()
    with raises(TypeError, func, "x"):
        if func == "max_unpool":
            gpupool.max_unpool(x, np.zeros((1, 1, 2, 2), np.int64), 2)
        else:
            ALL_OPS[func](x, **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
@pytest.mark.parametrize("make", [lambda: np.float32(3), lambda: np.int64(3), lambda: 3.0,
                                  lambda: 3, lambda: True],
                         ids=["np.float32", "np.int64", "float", "int", "bool"])
def test_scalar_input_says_what_is_expected(func, make):
    """A scalar has no spatial dims: a TypeError that names x, calls it a scalar and says
    what pooling needs (not a complaint about array types)."""
    with raises(TypeError, func, "x is a scalar", "spatial dims"):
        if func == "max_unpool":
            gpupool.max_unpool(make(), np.zeros((1, 1, 2, 2), np.int64), 2)
        else:
            ALL_OPS[func](make(), **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
@pytest.mark.parametrize("ragged", [[[1.0, 2.0], [3.0]], [[[1.0, 2.0]], [3.0, 4.0]],
                                    ([1.0], (2.0, 3.0))])
def test_ragged_nested_sequence_names_the_parameter(func, ragged):
    """Regression: NumPy's own "inhomogeneous shape" error came through raw."""
    if func == "max_unpool":
        with raises(ValueError, func, "x is a nested sequence", "same length"):
            gpupool.max_unpool(ragged, np.zeros((2, 2), np.int64), 1)
        with raises(ValueError, func, "indices is a nested sequence", "same length"):
            gpupool.max_unpool(np.ones((2, 2)), ragged, 1)
    else:
        with raises(ValueError, func, "x is a nested sequence", "same length"):
            ALL_OPS[func](ragged, **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS))
def test_zero_dim_array_names_x_and_the_rank_needed(backend, func):
    x = backend.to_backend(np.float32(3))
    with raises(ValueError, func, "x of shape ()", "rank 0", "need rank >= 2"):
        ALL_OPS[func](x, **_window_kw(func))


@pytest.mark.parametrize("func", list(ALL_OPS))
def test_lists_and_tuples_are_accepted(func):
    nested = [[[[float(i * 4 + j) for j in range(4)] for i in range(4)]]]
    for value in (nested, tuple(tuple(tuple(r) for r in p) for p in nested)):
        y = ALL_OPS[func](value, **_window_kw(func))
        assert isinstance(y, np.ndarray)
        assert_equal_to_ndarray = ALL_OPS[func](np.asarray(value), **_window_kw(func))
        np.testing.assert_array_equal(y, assert_equal_to_ndarray)


# ----------------------------------------------------------------------------- out=

@pytest.mark.parametrize("func", list(ALL_OPS))
def test_bad_out(backend, x, func):
    call = ALL_OPS[func]
    kw = _window_kw(func)
    good = call(x, **kw)
    shape, dtype = good.shape, good.dtype
    wrong_shape = backend.empty(shape[:-1] + (shape[-1] + 1,), dtype)
    with raises(ValueError, func, "out", "shape"):
        call(x, out=wrong_shape, **kw)
    with raises(ValueError, func, "out", "dtype"):
        call(x, out=backend.empty(shape, "float64"), **kw)
    with raises(TypeError, func, "out"):  # wrong array type: a list, a NumPy array for CuPy
        call(x, out=backend.to_numpy(good).tolist(), **kw)
    if backend.name != "numpy":
        with raises(TypeError, func, "out", "numpy.ndarray"):
            call(x, out=np.empty(shape, dtype), **kw)
    noncontig = backend.empty((2 * shape[0],) + shape[1:], dtype)[::2]
    assert not noncontig.flags.c_contiguous
    with raises(ValueError, func, "out", "contiguous"):
        call(x, out=noncontig, **kw)
    # an out that overlaps the input, with the right shape, dtype and contiguity
    size = int(np.prod(shape))
    buf = backend.to_backend(np.arange(x.size, dtype=np.float32))
    overlapping = buf[:size].reshape(shape)
    with raises(ValueError, func, "out", "overlap"):
        call(buf.reshape(x.shape), out=overlapping, **kw)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
def test_byte_swapped_out_is_rejected(backend, func, dtype):
    """Regression: out is written in place in native order, and a byte-swapped out (whose
    dtype name equals the native one's) came back as garbage."""
    x = backend.to_backend(np.arange(2 * 3 * 6 * 6, dtype=dtype).reshape(2, 3, 6, 6) % 11)
    if func == "max_unpool":
        y, i = gpupool.max_pool(x, 2, return_indices=True)
        call = lambda out: gpupool.max_unpool(y, i, 2, out=out)  # noqa: E731
    else:
        call = lambda out: ALL_OPS[func](x, out=out, **_window_kw(func))  # noqa: E731
    good = call(None)
    try:
        swapped = backend.empty(good.shape, np.dtype(dtype).newbyteorder())
    except (TypeError, ValueError):
        pytest.skip(f"{backend.name} has no byte-swapped arrays")
    with raises(ValueError, func, "out", "byte order"):
        call(swapped)


def test_masked_arrays_are_refused_not_unmasked():
    """Regression: a numpy.ma.MaskedArray was pooled as its data, masked values included
    (max of a window whose max is masked gave that value); as input or out= it is a TypeError."""
    data = np.arange(16.0).reshape(1, 1, 4, 4)
    masked = np.ma.masked_array(data, mask=np.eye(4, dtype=bool)[None, None])
    for call in (lambda: gpupool.max_pool(masked, 2), lambda: gpupool.global_avg_pool(masked),
                 lambda: gpupool.quantized.QArray(np.ma.masked_array(np.zeros(4, np.int8)), 1.0)):
        with pytest.raises(TypeError, match="MaskedArray; its mask would be ignored"):
            call()
    dask = pytest.importorskip("dask.array")
    with raises(TypeError, "max_pool", "MaskedArray"):
        gpupool.max_pool(dask.ma.masked_array(dask.from_array(data), mask=data > 7), 2)
    out = np.ma.masked_array(np.zeros((1, 1, 2, 2)), mask=True)
    with raises(TypeError, "max_pool", "out", "MaskedArray"):
        gpupool.max_pool(data, 2, out=out)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_subclasses_are_numpy_arrays(tmp_path):
    """Regression: a np.memmap input with an ndarray out= (or the reverse) was a TypeError
    (exact types compared), an np.matrix input a raw reshape error. Subclasses are viewed as
    plain arrays: the results are plain ndarrays, or out itself."""
    xn = np.arange(2 * 3 * 6 * 6, dtype=np.float32).reshape(2, 3, 6, 6) % 13
    expected = xn.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5))
    mapped = np.memmap(tmp_path / "x", np.float32, "w+", shape=xn.shape)
    mapped[...] = xn
    out = np.empty(expected.shape, np.float32)
    assert gpupool.max_pool(mapped, 2, out=out) is out
    np.testing.assert_array_equal(out, expected)
    result = gpupool.max_pool(mapped, 2)
    assert type(result) is np.ndarray
    np.testing.assert_array_equal(result, expected)
    mapped_out = np.memmap(tmp_path / "out", np.float32, "w+", shape=expected.shape)
    assert gpupool.max_pool(xn, 2, out=mapped_out) is mapped_out
    np.testing.assert_array_equal(np.asarray(mapped_out), expected)
    y, i = gpupool.max_pool(xn, 2, return_indices=True)
    unpooled = np.memmap(tmp_path / "unpooled", np.float32, "w+", shape=xn.shape)
    assert gpupool.max_unpool(y, i, 2, out=unpooled) is unpooled
    np.testing.assert_array_equal(np.asarray(unpooled), np.where(
        np.kron(expected, np.ones((2, 2), np.float32)) == xn, xn, 0))
    matrix = np.matrix(xn[0, 0])
    for op in (lambda a: gpupool.max_pool(a, 2), lambda a: gpupool.avg_pool(a, 3, 1, 1),
               lambda a: gpupool.global_avg_pool(a), lambda a: gpupool.adaptive_max_pool(a, 4)):
        got = op(matrix)
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, op(np.asarray(matrix)))
    m_out = np.matrix(np.zeros((3, 3), np.float32))
    assert gpupool.max_pool(matrix, 2, out=m_out) is m_out
    np.testing.assert_array_equal(np.asarray(m_out), expected[0, 0])


def test_numpy_subclass_out_for_a_cupy_input_is_a_type_error(backend, tmp_path):
    x = backend.to_backend(np.ones((1, 1, 4, 4), np.float32))
    mapped = np.memmap(tmp_path / "out", np.float32, "w+", shape=(1, 1, 2, 2))
    if backend.name == "numpy":
        assert gpupool.max_pool(x, 2, out=mapped) is mapped
    else:
        with raises(TypeError, "max_pool", "out", "numpy.memmap", backend.name):
            gpupool.max_pool(x, 2, out=mapped)


def test_read_only_out_is_rejected():
    x = np.ones((1, 1, 4, 4), np.float32)
    out = np.empty((1, 1, 2, 2), np.float32)
    out.flags.writeable = False
    with raises(ValueError, "max_pool", "out", "writeable"):
        gpupool.max_pool(x, 2, out=out)


def test_max_unpool_bad_out_and_out_overlapping_values(backend):
    y = backend.to_backend(np.ones((1, 1, 2, 2), np.float32))
    i = backend.to_backend(np.array([[[[0, 1], [4, 5]]]], np.int64))
    with raises(ValueError, "max_unpool", "out", "shape"):
        gpupool.max_unpool(y, i, 2, out=backend.empty((1, 1, 4, 5), "float32"))
    with raises(ValueError, "max_unpool", "out", "dtype"):
        gpupool.max_unpool(y, i, 2, out=backend.empty((1, 1, 4, 4), "float64"))
    buf = backend.to_backend(np.zeros(16, np.float32))
    with raises(ValueError, "max_unpool", "out", "overlap"):
        gpupool.max_unpool(buf[:4].reshape(1, 1, 2, 2), i, 2, out=buf.reshape(1, 1, 4, 4))


def test_max_unpool_out_overlapping_the_indices_is_rejected(backend):
    # indices are an input too: zero-filling such an out would clobber them first
    buf = backend.to_backend(np.zeros(16, np.int64))
    indices = buf[:4].reshape(1, 1, 2, 2)
    indices[...] = backend.to_backend(np.array([[[[0, 1], [4, 5]]]], np.int64))
    y = backend.to_backend(np.array([[[[7, 8], [9, 10]]]], np.int64))
    with raises(ValueError, "max_unpool", "out", "overlap"):
        gpupool.max_unpool(y, indices, 2, out=buf.reshape(1, 1, 4, 4))


# ----------------------------------------------------------------------------- max_unpool indices

def test_max_unpool_bad_indices(backend):
    y = backend.to_backend(np.ones((1, 1, 2, 2), np.float32))
    good = np.array([[[[0, 1], [4, 5]]]], np.int64)
    with raises(TypeError, "max_unpool", "indices", "float32"):
        gpupool.max_unpool(y, backend.to_backend(good.astype(np.float32)), 2)
    with raises(TypeError, "max_unpool", "indices", "bool"):
        gpupool.max_unpool(y, backend.to_backend(good.astype(bool)), 2)
    with raises(ValueError, "max_unpool", "indices", "shape", "(1, 1, 1, 4)"):
        gpupool.max_unpool(y, backend.to_backend(good.reshape(1, 1, 1, 4)), 2)
    with raises(ValueError, "max_unpool", "indices", "16"):
        gpupool.max_unpool(y, backend.to_backend(good + 11), 2)  # max 16 outside [0, 16)
    with raises(ValueError, "max_unpool", "indices", "[-2, 3]"):  # only -1 is skipped
        gpupool.max_unpool(y, backend.to_backend(good - 2), 2)
    with raises(TypeError, "max_unpool", "indices"):
        gpupool.max_unpool(y, {"not": "an array"}, 2)
    if backend.name != "numpy":
        with raises(TypeError, "max_unpool", "indices"):
            gpupool.max_unpool(y, good, 2)


def test_max_unpool_output_size_and_padding_errors(backend):
    y = backend.to_backend(np.ones((1, 1, 2, 2), np.float32))
    i = backend.to_backend(np.array([[[[0, 1], [4, 5]]]], np.int64))
    with raises(ValueError, "max_unpool", "padding", "output_size"):
        gpupool.max_unpool(y, i, 2, padding="same")
    with raises(ValueError, "max_unpool", "output_size"):
        gpupool.max_unpool(y, i, 2, output_size=(2, 1, 4, 4))  # disagrees with N
    with raises(ValueError, "max_unpool", "output_size"):
        gpupool.max_unpool(y, i, 2, output_size=(4, 4, 4))     # neither spatial nor full
    with raises(ValueError, "max_unpool", "output_size"):
        gpupool.max_unpool(y, i, 2, output_size=(0, 4))
    with raises(TypeError, "max_unpool", "output_size"):
        gpupool.max_unpool(y, i, 2, output_size=4)
    with raises(ValueError, "max_unpool", "output size"):
        gpupool.max_unpool(y, i, 1, padding=1)                  # (2-1)*1 - 2 + 1 = 0
    with raises(ValueError, "max_unpool", "kernel_size"):
        gpupool.max_unpool(y, i, 0)
    with raises(ValueError, "max_unpool", "padding"):
        gpupool.max_unpool(y, i, 2, padding=-1)


# ----------------------------------------------------------------------------- memoized validation

@pytest.mark.parametrize("func,good,bad", [
    ("max_pool", dict(kernel_size=(2, 2)), dict(kernel_size=(2.0, 2))),
    ("max_pool", dict(kernel_size=(1, 1)), dict(kernel_size=(True, True))),
    ("avg_pool", dict(kernel_size=2, stride=(1, 1)), dict(kernel_size=2, stride=(1.0, 1))),
    ("avg_pool", dict(kernel_size=2, padding=((1, 1), (0, 0))),
     dict(kernel_size=2, padding=((1.0, 1), (0, 0)))),
    ("lp_pool", dict(kernel_size=2, dilation=(1, 1)), dict(kernel_size=2, dilation=(1, 1.0))),
])
def test_validation_does_not_depend_on_earlier_valid_calls(x, func, good, bad):
    # a spec cache keyed on argument values must not let (2.0, 2) through because an equal,
    # valid (2, 2) was seen first: 2.0 == 2 and True == 1 hash alike inside a tuple
    WINDOW_OPS[func](x, **good)
    with raises(TypeError, func):
        WINDOW_OPS[func](x, **bad)


def test_adaptive_validation_does_not_depend_on_earlier_valid_calls(x):
    gpupool.adaptive_avg_pool(x, (2, 3))
    with raises(TypeError, "adaptive_avg_pool", "output_size"):
        gpupool.adaptive_avg_pool(x, (2.0, 3))


# ----------------------------------------------------------------------------- absurd geometry

@pytest.mark.parametrize("func", list(WINDOW_OPS))
@pytest.mark.parametrize("lead", [(2, 3), (0, 3)])
def test_absurd_padding_is_a_value_error_before_any_allocation(backend, func, lead):
    """Regression: padding=10**9 reached the allocator ("Unable to allocate 6.94 EiB"). An
    output beyond 2**48 bytes is a geometry error naming the parameter and the output shape;
    an empty batch counts as one plane."""
    x = backend.to_backend(np.ones(lead + (6, 6), np.float32))
    out = 10**9 + 3  # floor((6 + 2 * 10**9 - 2) / 2) + 1
    with raises(ValueError, func, "padding=1000000000", f"output shape {lead + (out, out)}",
                "2**48 bytes"):
        WINDOW_OPS[func](x, kernel_size=2, padding=10**9)


def test_output_bytes_limit_counts_dtype_and_indices(backend):
    # (1, 1, 2**24, 2**22) float32 = 2**48 bytes exactly: allowed by the spec (not allocated
    # here); one more row, or int64 indices on top, is over the limit
    from gpupool import spec as S
    shape = (1, 1, 1, 1)
    for out_spatial, dtype, indices, ok in [((2**24, 2**22), "float32", False, True),
                                            ((2**24 + 1, 2**22), "float32", False, False),
                                            ((2**24, 2**22), "float32", True, False),
                                            ((2**24, 2**23), "int8", True, False),
                                            ((2**24, 2**20), "int8", True, True)]:
        g = S.geometry("max_pool", shape, dtype, "NCHW", 2, integers=True)
        if ok:
            S.check_output_size("max_pool", g, out_spatial, "padding=p", indices)
        else:
            with raises(ValueError, "max_pool", "padding=p", str((1, 1) + out_spatial)):
                S.check_output_size("max_pool", g, out_spatial, "padding=p", indices)


@pytest.mark.parametrize("func", ["adaptive_avg_pool", "adaptive_max_pool"])
def test_absurd_adaptive_output_size(x, func):
    with raises(ValueError, func, "output_size=(100000000, 100000000)",
                "output shape (2, 3, 100000000, 100000000)", "2**48 bytes"):
        getattr(gpupool, func)(x, (10**8, 10**8))


def test_absurd_unpool_stride(x):
    idx = x.astype("int64") * 0
    big = 2**30
    out = 5 * big + 2
    with raises(ValueError, "max_unpool", "stride=(1073741824, 1073741824)",
                f"output shape (2, 3, {out}, {out})", "2**48 bytes"):
        gpupool.max_unpool(x, idx, 2, big)


# ----------------------------------------------------------------------------- unpool output_size

def _pooled_7x7(backend, **kw):
    x = backend.to_backend(np.arange(2 * 49, dtype=np.float32).reshape(2, 1, 7, 7))
    return gpupool.max_pool(x, return_indices=True, **kw)


@pytest.mark.parametrize("output_size", [(20, 20), (8, 7), (7, 4), (2, 1, 20, 20), [4, 4]])
def test_max_unpool_output_size_outside_pytorchs_range(backend, output_size):
    """Regression: indices pooled from a 7x7 plane were scattered into a 20x20 one, at the
    wrong positions. Each dim must lie strictly between default - stride and default + stride
    (default (6, 6) here: 5..7)."""
    y, i = _pooled_7x7(backend, kernel_size=2)
    with raises(ValueError, "max_unpool", f"output_size={output_size!r}", "(6, 6)",
                "[5, 7] x [5, 7]"):
        gpupool.max_unpool(y, i, 2, output_size=output_size)


def test_max_unpool_output_sizes_inside_the_range(backend):
    y, i = _pooled_7x7(backend, kernel_size=2)
    x = np.arange(2 * 49, dtype=np.float32).reshape(2, 1, 7, 7)
    up = backend.to_numpy(gpupool.max_unpool(y, i, 2, output_size=(7, 7)))
    kept = up != 0
    np.testing.assert_array_equal(up[kept], x[kept])
    assert kept.sum() == 2 * 9
    # 5 and 6 are allowed sizes; these indices reach position 40 and so do not fit them
    with raises(ValueError, "max_unpool", "indices"):
        gpupool.max_unpool(y, i, 2, output_size=(6, 6))


def test_max_unpool_output_size_range_with_padding_ceil_and_dilation(backend):
    # ceil mode: 7x7, k3 s2 p1 ceil -> 4x4; default (4-1)*2 - 2 + 3 = 7; range 6..8
    y, i = _pooled_7x7(backend, kernel_size=3, stride=2, padding=1, ceil_mode=True)
    assert gpupool.max_unpool(y, i, 3, 2, 1, output_size=(7, 7)).shape == (2, 1, 7, 7)
    with raises(ValueError, "max_unpool", "output_size=(9, 7)", "[6, 8] x [6, 8]"):
        gpupool.max_unpool(y, i, 3, 2, 1, output_size=(9, 7))
    # dilation: 7x7, k3 d2 s1 -> 3x3; the unpool needs the pooling's dilation to accept 7
    y, i = _pooled_7x7(backend, kernel_size=3, stride=1, dilation=2)
    assert gpupool.max_unpool(y, i, 3, 1, dilation=2).shape == (2, 1, 7, 7)
    assert gpupool.max_unpool(y, i, 3, 1, output_size=(7, 7), dilation=2).shape == (2, 1, 7, 7)
    with raises(ValueError, "max_unpool", "output_size=(7, 7)", "dilation (1, 1)"):
        gpupool.max_unpool(y, i, 3, 1, output_size=(7, 7))
    with raises(ValueError, "max_unpool", "dilation=0"):
        gpupool.max_unpool(y, i, 3, 1, dilation=0)
    # "same": the pads follow from output_size; 7 pools to 4 with stride 2, 9 does not
    y, i = _pooled_7x7(backend, kernel_size=3, stride=2, padding="same")
    assert gpupool.max_unpool(y, i, 3, 2, "same", output_size=(7, 7)).shape == (2, 1, 7, 7)
    with raises(ValueError, "max_unpool", "output_size=(9, 7)"):
        gpupool.max_unpool(y, i, 3, 2, "same", output_size=(9, 7))


def test_unpool_sizes_are_pytorchs_range_plus_every_size_that_pools_to_the_input():
    """The accepted output_size range, checked by brute force: PyTorch's default +- stride
    range united with every size that max_pool (either ceil_mode) pools to the pooled size,
    which differ only with pads larger than PyTorch allows; SAME: ceil(O / s) == I."""
    import itertools
    from gpupool import spec as S
    for i, k, s, b, e, d in itertools.product(range(1, 6), range(1, 4), range(1, 4), range(4),
                                              range(4), range(1, 3)):
        default = (i - 1) * s - b - e + d * (k - 1) + 1
        sizes = {o for o in range(1, 60) if default - s < o < default + s or any(
            S.output_length(o, k, s, (b, e), d, ceil) == i for ceil in (False, True))}
        ((lo, hi),) = S.unpool_sizes((i,), (k,), (s,), ((b, e),), (d,))
        assert sizes == set(range(lo, hi + 1)), (i, k, s, b, e, d)
    for i, k, s, d, mode in itertools.product(range(1, 6), range(1, 4), range(1, 4), range(1, 3),
                                              ("same", "same_lower")):
        sizes = {o for o in range(1, 60) for ceil in (False, True) if S.output_length(
            o, k, s, S.resolve_padding("f", mode, 1, (o,), (k,), (s,), (d,))[0], d, ceil) == i}
        assert sizes == set(range((i - 1) * s + 1, i * s + 1)), (i, k, s, d, mode)
        assert S.unpool_sizes((i,), (k,), (s,), None, (d,)) == (((i - 1) * s + 1, i * s),)


def test_max_unpool_accepts_the_original_size_with_pads_beyond_pytorchs(backend):
    # 1 wide, k1 s1, end pad 1, ceil mode: pooled to 1 (the window starting in the end
    # padding is dropped); the default size is 0, PyTorch's range would exclude 1
    x = backend.to_backend(np.array([[[5.0]]]))
    y, i = gpupool.max_pool(x, (1,), (1,), ((0, 1),), ceil_mode=True, return_indices=True)
    assert y.shape == (1, 1, 1)
    up = gpupool.max_unpool(y, i, (1,), (1,), ((0, 1),), output_size=(1,))
    assert backend.to_numpy(up).tolist() == [[[5.0]]]
