"""Every invalid-argument class of the core issue raises the same exception type on every
backend, with a message that names the function, the parameter and the bad value."""
from __future__ import annotations

import re

import numpy as np
import pytest

import gpupool


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
@pytest.mark.parametrize("layout", ["NCDHW", "nchw", "CHW", None])
def test_unknown_layout(x, func, layout):
    with raises(ValueError, func, "layout", repr(layout)):
        ALL_OPS[func](x, layout=layout, **_window_kw(func))


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
@pytest.mark.parametrize("dims,exc", [(0, ValueError), (-1, ValueError)])
def test_global_spatial_dims_must_be_positive(x, func, dims, exc):
    with raises(exc, func, "spatial_dims", repr(dims)):
        getattr(gpupool, func)(x, spatial_dims=dims)


def test_divisor_override_and_ceil_mode_types(x):
    for bad in (0, -2, 1.5):
        with raises(ValueError, "avg_pool", "divisor_override", repr(bad)):
            gpupool.avg_pool(x, 2, divisor_override=bad)
    with raises(TypeError, "max_pool", "ceil_mode"):
        gpupool.max_pool(x, 2, ceil_mode="yes")


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
    with raises(exc, "max_pool"):
        gpupool.max_pool(x, kernel_size)


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


def _torch_tensor():
    torch = pytest.importorskip("torch")
    return torch.ones((1, 1, 4, 4))


@pytest.mark.parametrize("make", [lambda: {"a": 1}, lambda: 3.0, lambda: None, lambda: "abc",
                                  lambda: np.float32(1.0), lambda: memoryview(b"1234"),
                                  _torch_tensor], ids=["dict", "scalar", "None", "str",
                                                       "numpy-scalar", "memoryview", "torch"])
@pytest.mark.parametrize("func", list(ALL_OPS) + ["max_unpool"])
def test_non_array_non_sequence_input_is_a_type_error(func, make):
    x = make()
    with raises(TypeError, func, "x"):
        if func == "max_unpool":
            gpupool.max_unpool(x, np.zeros((1, 1, 2, 2), np.int64), 2)
        else:
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
    with raises(ValueError, func, "out"):  # wrong array type: a list, a NumPy array for CuPy
        call(x, out=backend.to_numpy(good).tolist(), **kw)
    if backend.name != "numpy":
        with raises(ValueError, func, "out"):
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
    with raises(ValueError, "max_unpool", "indices", "-1"):
        gpupool.max_unpool(y, backend.to_backend(good - 1), 2)
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
