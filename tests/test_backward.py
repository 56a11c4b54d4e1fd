"""The backward ops on every backend: gradients against the direct loops of
``tests/reference.py`` (float64), against PyTorch's own pooling gradients where the semantics
agree, edges (NaN, empty windows, zero-size and size-1 dims, non-contiguous inputs, ``out=``),
and errors that name the function and the parameter."""
from __future__ import annotations


import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import gpupool as gp
import reference as ref

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=2e-6, atol=2e-6),
       "float64": dict(rtol=1e-12, atol=1e-12)}


def _window_cases(seed: int, count: int):
    """Random window geometries: (input shape, kernel, stride, padding, dilation, ceil_mode,
    layout), every padding form."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        nd = int(rng.integers(1, 4))
        layout = ("NCHW", "NHWC")[int(rng.integers(2))]
        kernel = tuple(int(k) for k in rng.integers(1, 4, nd))
        stride = tuple(int(s) for s in rng.integers(1, 4, nd))
        dilation = tuple(int(d) for d in rng.integers(1, 3, nd))
        spatial = tuple(int(rng.integers(d * (k - 1) + 1, d * (k - 1) + 7))
                        for k, d in zip(kernel, dilation))
        form = int(rng.integers(4))
        padding = (0 if form == 0 else "same" if form == 1
                   else tuple((int(rng.integers(0, k + 1)), int(rng.integers(0, k + 1)))
                              for k in kernel) if form == 2
                   else tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel))
        lead = (2, 3) if nd == 1 else (2,)
        shape = lead + spatial + ((2,) if layout == "NHWC" else ())
        cases.append((shape, kernel, stride, padding, dilation, bool(rng.integers(2)), layout))
    return cases


WINDOW_CASES = _window_cases(7, 24)


def _values(rng, shape, dtype, ties=False):
    x = rng.integers(-3, 4, shape) / 2 if ties else rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("case", WINDOW_CASES)
def test_max_pool_backward_matches_the_reference(backend, case, dtype):
    shape, kernel, stride, padding, dilation, ceil_mode, layout = case
    rng = np.random.default_rng(len(str(case)))
    x = _values(rng, shape, dtype, ties=True)
    y, idx = gp.max_pool(backend.to_backend(x), kernel, stride, padding, dilation, ceil_mode,
                         return_indices=True, layout=layout)
    g = _values(rng, y.shape, dtype)
    got = gp.max_pool_backward(backend.to_backend(g), idx, shape, kernel, stride, padding,
                               dilation, ceil_mode, layout=layout)
    assert backend.is_native(got) and got.dtype == dtype and got.shape == shape
    want = ref.max_pool_backward(g, x, kernel, stride, padding, dilation, ceil_mode, layout)
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("divisor", ["valid", "include_pad", "override"])
@pytest.mark.parametrize("case", WINDOW_CASES[::2])
def test_avg_pool_backward_matches_the_reference(backend, case, divisor, dtype):
    shape, kernel, stride, padding, dilation, ceil_mode, layout = case
    rng = np.random.default_rng(len(str(case)))
    include_pad, override = divisor == "include_pad", (5 if divisor == "override" else None)
    y = gp.avg_pool(np.zeros(shape, dtype), kernel, stride, padding, ceil_mode, include_pad,
                    override, dilation=dilation, layout=layout)
    g = _values(rng, y.shape, dtype)
    got = gp.avg_pool_backward(backend.to_backend(g), shape, kernel, stride, padding, ceil_mode,
                               include_pad, override, dilation=dilation, layout=layout)
    assert backend.is_native(got) and got.dtype == dtype and got.shape == shape
    want = ref.avg_pool_backward(g, shape, kernel, stride, padding, ceil_mode, include_pad,
                                 override, dilation, layout)
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 0.75])
@pytest.mark.parametrize("case", WINDOW_CASES[1::3])
def test_lp_pool_backward_matches_the_reference(backend, case, p):
    shape, kernel, stride, padding, dilation, ceil_mode, layout = case
    rng = np.random.default_rng(len(str(case)))
    x = rng.standard_normal(shape)
    x[rng.random(shape) < 0.1] = 0.0  # zero taps pass no gradient
    y = gp.lp_pool(x, p, kernel, stride, padding, dilation, ceil_mode, layout=layout)
    g = rng.standard_normal(y.shape)
    got = gp.lp_pool_backward(backend.to_backend(g), backend.to_backend(x), p, kernel, stride,
                              padding, dilation, ceil_mode, layout=layout)
    want = ref.lp_pool_backward(g, x, p, kernel, stride, padding, dilation, ceil_mode, layout)
    assert_allclose(backend.to_numpy(got), want, rtol=1e-11, atol=1e-11)


ADAPTIVE_CASES = [((2, 3, 7), (3,), "NCHW"), ((2, 5, 3), (5,), "NCHW"),
                  ((1, 2, 6, 9), (4, 4), "NCHW"), ((2, 5, 4, 3), (3, 7), "NHWC"),
                  ((1, 7, 5, 6, 2), (3, 2, 4), "NCHW"), ((1, 4, 3, 5, 2), (2, 3, 5), "NHWC"),
                  ((2, 2, 9, 9), (1, 1), "NCHW")]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("shape,output_size,layout", ADAPTIVE_CASES)
def test_adaptive_backward_matches_the_reference(backend, shape, output_size, layout, dtype):
    rng = np.random.default_rng(sum(shape))
    x = _values(rng, shape, dtype, ties=True)
    y, idx = gp.adaptive_max_pool(backend.to_backend(x), output_size, return_indices=True,
                                  layout=layout)
    g = _values(rng, y.shape, dtype)
    got = gp.adaptive_max_pool_backward(backend.to_backend(g), idx, shape, output_size,
                                        layout=layout)
    want = ref.adaptive_max_pool_backward(g, x, output_size, layout)
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])
    got = gp.adaptive_avg_pool_backward(backend.to_backend(g), shape, output_size, layout=layout)
    want = ref.adaptive_avg_pool_backward(g, shape, output_size, layout)
    assert backend.is_native(got) and got.dtype == dtype and got.shape == shape
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("shape,spatial_dims,layout", [
    ((2, 3, 5, 4), 2, "NCHW"), ((2, 5, 4, 3), 2, "NHWC"), ((3, 7), 1, "NCHW"),
    ((1, 2, 3, 4, 5), 3, "NCHW"), ((2, 1, 1, 4), 2, "NCHW")])
def test_global_backward_matches_the_reference(backend, shape, spatial_dims, layout, dtype):
    rng = np.random.default_rng(sum(shape))
    x = _values(rng, shape, dtype, ties=True)
    y = gp.global_max_pool(x, spatial_dims=spatial_dims, layout=layout)
    g = _values(rng, y.shape, dtype)
    got = gp.global_max_pool_backward(backend.to_backend(g), backend.to_backend(x),
                                      spatial_dims=spatial_dims, layout=layout)
    want = ref.global_max_pool_backward(g, x, spatial_dims, layout)
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])
    got = gp.global_avg_pool_backward(backend.to_backend(g), shape, spatial_dims=spatial_dims,
                                      layout=layout)
    want = ref.global_avg_pool_backward(g, shape, spatial_dims, layout)
    assert_allclose(backend.to_numpy(got).astype(np.float64), want, **TOL[dtype])


# ----------------------------------------------------------------------------- PyTorch

def _torch_grad(forward, x, g):
    t = torch.tensor(x, requires_grad=True)
    out = forward(t)
    out = out[0] if isinstance(out, tuple) else out
    (grad,) = torch.autograd.grad(out, t, torch.tensor(g))
    return grad.numpy()


def _torch_cases(seed: int, count: int):
    """Geometries within PyTorch's rules: 2-D, pads at most half the kernel."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        kernel = tuple(int(k) for k in rng.integers(1, 5, 2))
        stride = tuple(int(s) for s in rng.integers(1, 4, 2))
        dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
        padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
        spatial = tuple(int(rng.integers(d * (k - 1) + 1, d * (k - 1) + 9))
                        for k, d in zip(kernel, dilation))
        cases.append(((2, 3) + spatial, kernel, stride, padding, dilation, bool(rng.integers(2))))
    return cases


@pytest.mark.parametrize("case", _torch_cases(11, 16))
def test_max_and_avg_backward_equal_pytorch(backend, case):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    rng = np.random.default_rng(len(str(case)))
    x = rng.standard_normal(shape)
    y, idx = gp.max_pool(backend.to_backend(x), kernel, stride, padding, dilation, ceil_mode,
                         return_indices=True)
    g = rng.standard_normal(y.shape)
    want = _torch_grad(lambda t: F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode),
                       x, g)
    got = gp.max_pool_backward(backend.to_backend(g), idx, shape, kernel, stride, padding,
                               dilation, ceil_mode)
    assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)
    for include_pad in (False, True):
        want = _torch_grad(lambda t: F.avg_pool2d(t, kernel, stride, padding, ceil_mode,
                                                  include_pad), x, g) if dilation == (1, 1) \
            else None
        if want is None:
            continue
        got = gp.avg_pool_backward(backend.to_backend(g), shape, kernel, stride, padding,
                                   ceil_mode, include_pad)
        assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,output_size", [((2, 3, 7, 9), (3, 4)), ((1, 2, 4, 5), (6, 7)),
                                               ((2, 2, 8, 8), (1, 1)), ((1, 3, 5, 5), (5, 2))])
def test_adaptive_and_global_backward_equal_pytorch(backend, shape, output_size):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    g = rng.standard_normal(shape[:2] + output_size)
    want = _torch_grad(lambda t: F.adaptive_avg_pool2d(t, output_size), x, g)
    got = gp.adaptive_avg_pool_backward(backend.to_backend(g), shape, output_size)
    assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)
    _, idx = gp.adaptive_max_pool(backend.to_backend(x), output_size, return_indices=True)
    want = _torch_grad(lambda t: F.adaptive_max_pool2d(t, output_size), x, g)
    got = gp.adaptive_max_pool_backward(backend.to_backend(g), idx, shape, output_size)
    assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)
    if output_size == (1, 1):
        got = gp.global_max_pool_backward(backend.to_backend(g), backend.to_backend(x))
        assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)
        want = _torch_grad(lambda t: t.mean(dim=(2, 3), keepdim=True), x, g)
        got = gp.global_avg_pool_backward(backend.to_backend(g), shape)
        assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_lp_backward_equals_pytorch_on_positive_input(backend, p):
    rng = np.random.default_rng(3)
    x = rng.random((2, 3, 9, 8)) + 0.1  # PyTorch's lp_pool omits the abs
    g = rng.standard_normal((2, 3, 4, 3))
    want = _torch_grad(lambda t: F.lp_pool2d(t, p, 3, 2), x, g)
    got = gp.lp_pool_backward(backend.to_backend(g), backend.to_backend(x), p, 3, 2)
    assert_allclose(backend.to_numpy(got), want, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- edges

def test_max_backward_sends_the_gradient_to_the_last_nan(backend):
    x = np.array([[[1.0, np.nan, 5.0, np.nan, 2.0]]])
    y, idx = gp.max_pool(backend.to_backend(x), (5,), return_indices=True)
    got = gp.max_pool_backward(backend.to_backend(np.array([[[3.0]]])), idx, x.shape, (5,))
    assert_array_equal(backend.to_numpy(got), [[[0, 0, 0, 3.0, 0]]])
    got = gp.global_max_pool_backward(backend.to_backend(np.array([[[3.0]]])),
                                      backend.to_backend(x), spatial_dims=1)
    assert_array_equal(backend.to_numpy(got), [[[0, 0, 0, 3.0, 0]]])


def test_windows_in_the_padding_pass_nothing(backend):
    # pads larger than the window: the first and last windows have no valid tap
    x = np.arange(4.0).reshape(1, 1, 4)
    y, idx = gp.max_pool(backend.to_backend(x), (2,), 2, ((2, 2),), return_indices=True)
    assert backend.to_numpy(idx)[0, 0, 0] == -1
    g = np.arange(1.0, 5.0).reshape(1, 1, 4)
    got = gp.max_pool_backward(backend.to_backend(g), idx, x.shape, (2,), 2, ((2, 2),))
    assert_array_equal(backend.to_numpy(got), [[[0, 2.0, 0, 3.0]]])
    got = gp.avg_pool_backward(backend.to_backend(g), x.shape, (2,), 2, ((2, 2),))
    assert_array_equal(backend.to_numpy(got), [[[1.0, 1.0, 1.5, 1.5]]])


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4), (1, 1, 1, 1)])
def test_zero_size_and_size_one_dims(backend, shape):
    x = np.ones(shape)
    y, idx = gp.max_pool(backend.to_backend(x), 1, return_indices=True)
    g = np.full(y.shape, 2.0)
    for got in (gp.max_pool_backward(backend.to_backend(g), idx, shape, 1),
                gp.avg_pool_backward(backend.to_backend(g), shape, 1)):
        assert got.shape == shape
        assert_array_equal(backend.to_numpy(got), np.full(shape, 2.0))
    g = backend.to_backend(np.full(shape[:2] + (1, 1), 2.0))
    got = gp.global_avg_pool_backward(g, shape)
    assert got.shape == shape
    assert_array_equal(backend.to_numpy(got), np.full(shape, 2.0 / (shape[2] * shape[3])))


def test_subnormal_gradients_are_kept(backend):
    tiny = np.float32(1e-40)  # subnormal in float32
    g = np.full((1, 1, 1, 1), tiny, np.float32)
    got = gp.avg_pool_backward(backend.to_backend(g), (1, 1, 1, 2), (1, 2))
    assert_array_equal(backend.to_numpy(got), np.full((1, 1, 1, 2), tiny / np.float32(2)))


def test_negative_zero_gradients_sum_to_positive_zero(backend):
    # every sum starts from +0, the disjoint windows' plain stores included
    g = backend.to_backend(np.full((1, 1, 1, 1), -0.0))
    got = gp.global_max_pool_backward(g, backend.to_backend(np.ones((1, 1, 2, 2))))
    assert not np.signbit(backend.to_numpy(got)).any()
    got = gp.avg_pool_backward(g, (1, 1, 2, 2), 2)
    assert not np.signbit(backend.to_numpy(got)).any()


def test_lp_positions_no_window_covers_get_positive_zero(backend):
    x = np.array([[[[-1.0, np.inf, -1.0, -2.0]]]])
    got = gp.lp_pool_backward(backend.to_backend(np.ones((1, 1, 1, 2))), backend.to_backend(x),
                              2, (1, 1), (1, 2))
    assert_array_equal(backend.to_numpy(got), [[[[-1.0, 0.0, -1.0, 0.0]]]])
    assert not np.signbit(backend.to_numpy(got)[0, 0, 0, 1::2]).any()


@pytest.mark.parametrize("mode", ["F", "strided", "reversed", "transposed"])
def test_non_contiguous_operands(backend, mode):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 7, 6))
    y, idx = gp.max_pool(x, 3, 2, 1, return_indices=True)
    g = rng.standard_normal(y.shape)
    want = gp.max_pool_backward(g, idx, x.shape, 3, 2, 1)
    got = gp.max_pool_backward(backend.relayout(backend.to_backend(g), mode),
                               backend.relayout(backend.to_backend(idx), mode), x.shape, 3, 2, 1)
    assert_array_equal(backend.to_numpy(got), want)
    want = gp.lp_pool_backward(g, x, 2.0, 3, 2, 1)
    got = gp.lp_pool_backward(backend.relayout(backend.to_backend(g), mode),
                              backend.relayout(backend.to_backend(x), mode), 2.0, 3, 2, 1)
    assert_array_equal(backend.to_numpy(got), want)


def test_out_is_written_and_returned(backend):
    g = backend.to_backend(np.ones((1, 2, 2, 2)))
    out = backend.empty((1, 2, 4, 4), np.float64)
    got = gp.avg_pool_backward(g, (1, 2, 4, 4), 2, out=out)
    assert got is out
    assert_array_equal(backend.to_numpy(out), np.full((1, 2, 4, 4), 0.25))
    with pytest.raises(ValueError, match="avg_pool_backward: out has shape"):
        gp.avg_pool_backward(g, (1, 2, 4, 4), 2, out=backend.empty((1, 2, 4, 3), np.float64))


def test_repeated_calls_give_the_same_bits(backend):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 11, 10)).astype(np.float32)
    g = backend.to_backend(rng.standard_normal((2, 3, 6, 5)).astype(np.float32))
    first = gp.avg_pool_backward(g, x.shape, 3, 2, 1, count_include_pad=True)
    for _ in range(3):
        again = gp.avg_pool_backward(g, x.shape, 3, 2, 1, count_include_pad=True)
        assert_array_equal(backend.to_numpy(again).view(np.uint32),
                           backend.to_numpy(first).view(np.uint32))


# ----------------------------------------------------------------------------- errors

def _g(b):
    return b.to_backend(np.ones((1, 1, 2, 2)))


def _idx(b, value=0):
    return b.to_backend(np.full((1, 1, 2, 2), value, np.int64))


def _x(b, dtype=np.float64):
    return b.to_backend(np.ones((1, 1, 4, 4), dtype))


ERRORS = {
    "grad shape": (lambda b: gp.avg_pool_backward(b.to_backend(np.ones((1, 1, 2, 3))),
                                                  (1, 1, 4, 4), 2),
                   ValueError, r"avg_pool_backward: grad_output has shape \(1, 1, 2, 3\)"),
    "grad dtype": (lambda b: gp.avg_pool_backward(b.to_backend(np.ones((1, 1, 2, 2), np.int32)),
                                                  (1, 1, 4, 4), 2),
                   TypeError, "avg_pool_backward: grad_output has dtype int32"),
    "input_shape type": (lambda b: gp.avg_pool_backward(_g(b), 16, 2), TypeError,
                         "avg_pool_backward: input_shape=16"),
    "input_shape negative": (lambda b: gp.avg_pool_backward(_g(b), (1, -1, 4, 4), 2),
                             ValueError, "avg_pool_backward: input_shape=.* negative"),
    "kernel_size": (lambda b: gp.avg_pool_backward(_g(b), (1, 1, 4, 4), 0), ValueError,
                    "avg_pool_backward: kernel_size=0"),
    "layout": (lambda b: gp.avg_pool_backward(_g(b), (1, 1, 4, 4), 2, layout="NWHC"),
               ValueError, "avg_pool_backward: layout='NWHC'"),
    "out": (lambda b: gp.avg_pool_backward(_g(b), (1, 1, 4, 4), 2, out=_x(b, np.float32)),
            ValueError, "avg_pool_backward: out has shape"),
    "indices shape": (lambda b: gp.max_pool_backward(
        _g(b), b.to_backend(np.zeros((1, 1, 2), np.int64)), (1, 1, 4, 4), 2),
        ValueError, "max_pool_backward: indices has shape"),
    "indices dtype": (lambda b: gp.max_pool_backward(
        _g(b), b.to_backend(np.zeros((1, 1, 2, 2))), (1, 1, 4, 4), 2),
        TypeError, "max_pool_backward: indices has dtype float64"),
    "indices range": (lambda b: gp.max_pool_backward(_g(b), _idx(b, 16), (1, 1, 4, 4), 2),
                      ValueError, r"max_pool_backward: indices span \[16, 16\], outside"),
    "indices window": (lambda b: gp.max_pool_backward(_g(b), _idx(b), (1, 1, 4, 4), 2),
                       ValueError, "max_pool_backward: an index lies outside the pooling window"),
    "adaptive indices window": (
        lambda b: gp.adaptive_max_pool_backward(_g(b), _idx(b, 15), (1, 1, 4, 4), (2, 2)),
        ValueError, "adaptive_max_pool_backward: an index lies outside the pooling window"),
    "indices backend": (lambda b: gp.max_pool_backward(
        _g(b), np.zeros((1, 1, 2, 2), np.int64) if b.name == "cupy" else object(),
        (1, 1, 4, 4), 2), TypeError, "max_pool_backward: indices"),
    "x shape": (lambda b: gp.lp_pool_backward(_g(b), _x(b, np.float32), 2, 2), ValueError,
                "lp_pool_backward: x has shape"),
    "p": (lambda b: gp.lp_pool_backward(_g(b), _x(b), 0, 2), ValueError,
          "lp_pool_backward: p=0"),
    "global grad shape": (lambda b: gp.global_max_pool_backward(_g(b), _x(b)), ValueError,
                          r"global_max_pool_backward: grad_output has shape \(1, 1, 2, 2\)"),
    "adaptive grad shape": (lambda b: gp.adaptive_avg_pool_backward(_g(b), (1, 1, 4, 4), (3, 3)),
                            ValueError, "adaptive_avg_pool_backward: grad_output has shape"),
    "spatial_dims": (lambda b: gp.global_avg_pool_backward(_g(b), (1, 1, 4, 4), spatial_dims=0),
                     ValueError, "global_avg_pool_backward: spatial_dims=0"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_name_the_function_and_the_parameter(backend, case):
    call, exc, message = ERRORS[case]
    with pytest.raises(exc, match=message):
        call(backend)


def _index_rule_trials(backend, tap_sets, plane, lead, out_spatial, layout, call, seed):
    """Indices of each output's own window (a random valid tap, -1 where none) pass; then one
    index at a time changed to a tap of its own window, -1, any position of the plane (on
    another window's tap, between two dilated taps, in no window) or just outside the plane:
    ``call(indices)`` must raise exactly where the reference's taps (``tap_sets``, per plane
    and output in row-major order) do not hold it, with the message of the fault."""
    rng = np.random.default_rng(seed)
    chosen = [int(rng.choice(sorted(s))) if s else -1 for s in tap_sets]
    for trial in range(13):
        values = list(chosen)
        if trial:
            k = int(rng.integers(len(values)))
            options = [-2, -1, plane, int(rng.integers(plane)), int(rng.integers(plane))]
            if tap_sets[k]:
                options.append(int(rng.choice(sorted(tap_sets[k]))))
            values[k] = options[trial % len(options)]
        dtype = (np.int64, np.int32)[trial % 2]
        indices = backend.to_backend(ref._unplanes(values, lead, out_spatial, layout, dtype))
        faults = [v for k, v in enumerate(values) if v != -1 and v not in tap_sets[k]]
        if not faults:
            call(indices)
        elif any(v < -1 or v >= plane for v in faults):
            with pytest.raises(ValueError, match=r"indices span \[.*\], outside the input plane"):
                call(indices)
        else:
            with pytest.raises(ValueError, match="an index lies outside the pooling window"):
                call(indices)


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_max_pool_backward_takes_exactly_the_indices_of_their_windows(backend, case):
    shape, kernel, stride, padding, dilation, ceil_mode, layout = case
    windows, lead, out_spatial = ref._windows(np.zeros(shape), kernel, stride, padding,
                                              dilation, ceil_mode, layout)
    tap_sets = [{f for _, f in taps} for taps, _ in windows]
    plane = math.prod(ref._planes(np.zeros(shape), len(out_spatial), layout)[2])
    grad = backend.to_backend(np.ones(ref._unplanes([0.0] * len(tap_sets), lead, out_spatial,
                                                    layout, np.float32).shape, np.float32))
    _index_rule_trials(backend, tap_sets, plane, lead, out_spatial, layout,
                       lambda i: gp.max_pool_backward(grad, i, shape, kernel, stride, padding,
                                                      dilation, ceil_mode, layout=layout),
                       len(str(case)))


def _refused(call, first, k, near, taps, plane):
    """``call(values)``, ``values`` being ``first`` with entry ``k`` set in turn to each
    position of ``near`` (in the plane, no tap of window ``k``), raises the window error; set
    to -2, the plane size or the window's first tap 2**32 above (past 32 bits), the range
    error."""
    for v, message in ([(v, "an index lies outside the pooling window") for v in near]
                       + [(v, r"indices span \[.*\], outside the input")
                          for v in (-2, plane, 2**32 + (taps[0] if taps else 0))]):
        values = list(first)
        values[k] = v
        with pytest.raises(ValueError, match=message):
            call(values)


#: 2-D NCHW windows of stride 2 (input shape, kernel, padding, ceil mode), whose max gradients
#: the CUDA backend takes by cells that check the indices as they load them.
CELL_CASES = [((1, 2, 7, 9), 3, 1, False), ((2, 1, 6, 8), 2, 0, False),
              ((1, 1, 7, 9), 2, 1, True), ((1, 1, 8, 11), (3, 2), (1, 0), False),
              ((1, 1, 11, 13), 3, 0, True), ((1, 1, 3, 21), 3, 1, True)]


@pytest.mark.parametrize("shape,kernel,padding,ceil_mode", CELL_CASES)
def test_max_gradients_by_cells_check_every_window(backend, shape, kernel, padding, ceil_mode):
    """Every window's index in turn (the others their window's first tap): each tap of its
    window passes, with the gradient of a direct scatter; a position next to the window raises,
    as do positions outside the plane and a tap past 32 bits (2**32 above it)."""
    windows, lead, out_spatial = ref._windows(np.zeros(shape), kernel, 2, padding, 1,
                                              ceil_mode, "NCHW")
    tap_sets = [sorted({f for _, f in taps}) for taps, _ in windows]
    _, w = shape[2:]
    plane = math.prod(shape[2:])
    planes = math.prod(lead)
    first = [t[0] if t else -1 for t in tap_sets]
    g = np.arange(1, len(tap_sets) + 1, dtype=np.float32)  # sums of few integers: exact
    grad = backend.to_backend(ref._unplanes(list(g), lead, out_spatial, "NCHW", np.float32))

    def call(values):
        i = backend.to_backend(ref._unplanes(values, lead, out_spatial, "NCHW", np.int64))
        return gp.max_pool_backward(grad, i, shape, kernel, 2, padding, 1, ceil_mode)

    per_plane = len(tap_sets) // planes
    for k, taps in enumerate(tap_sets):
        base = (k // per_plane) * per_plane
        for tap in taps:
            values = list(first)
            values[k] = tap
            want = np.zeros(planes * plane, np.float32)
            for o, v in enumerate(values):
                if v >= 0:
                    want[(o // per_plane) * plane + v] += g[o]
            got = backend.to_numpy(call(values))
            assert_array_equal(got.reshape(-1), want, err_msg=f"window {k - base}, tap {tap}")
        near = {t + d for t in taps for d in (-1, 1, -w, w)} - set(taps)
        _refused(call, first, k, sorted(p for p in near if 0 <= p < plane), taps, plane)


@pytest.mark.parametrize("shape,output_size,layout", ADAPTIVE_CASES)
def test_adaptive_max_pool_backward_takes_exactly_the_indices_of_their_windows(
        backend, shape, output_size, layout):
    nd = len(output_size)
    tap_sets = [{f for _, f in taps}
                for taps, _ in ref._adaptive_windows(np.zeros(shape), output_size, layout)]
    _, lead, spatial = ref._planes(np.zeros(shape), nd, layout)
    grad = backend.to_backend(np.ones(ref._unplanes([0.0] * len(tap_sets), lead, output_size,
                                                    layout, np.float64).shape))
    _index_rule_trials(backend, tap_sets, math.prod(spatial), lead, output_size, layout,
                       lambda i: gp.adaptive_max_pool_backward(grad, i, shape, output_size,
                                                               layout=layout),
                       len(str(shape)))


#: Geometries whose indices the CUDA backend checks in a pass before the gradient: (input
#: shape, kernel, stride, padding, dilation, ceil mode, layout); output size for adaptive.
CHECKED_CASES = [((1, 1, 11), 3, 1, 2, 2, False, "NCHW"),
                 ((1, 5, 6, 2), 3, 1, 1, 1, False, "NHWC"),
                 ((1, 1, 7, 8), (2, 3), (1, 2), (1, 1), (2, 1), True, "NCHW"),
                 ((1, 1, 3, 5, 6), (2, 2, 3), (1, 2, 2), (0, 1, 1), 1, True, "NCHW"),
                 ((1, 1, 4, 6), 2, 1, 0, 1, False, "NCHW"),
                 ((1, 1, 5, 7), (3, 4), "NCHW"), ((1, 4, 5, 3), (2, 3), "NHWC"),
                 ((1, 1, 3, 4, 5), (2, 3, 2), "NCHW")]


@pytest.mark.parametrize("case", CHECKED_CASES, ids=str)
def test_max_gradient_index_check_takes_every_tap_and_refuses_every_neighbour(backend, case):
    """Every window's index in turn (the others their window's first tap): each tap of its
    window passes; a position next to one of its taps (along any dim) that is no tap of it
    raises, as do -2, the plane size and a tap 2**32 above it."""
    if len(case) == 3:
        shape, out_size, layout = case
        windows = list(ref._adaptive_windows(np.zeros(shape), out_size, layout))
        _, lead, spatial = ref._planes(np.zeros(shape), len(out_size), layout)
        def backward(grad, i):
            return gp.adaptive_max_pool_backward(grad, i, shape, out_size, layout=layout)
    else:
        shape, kernel, stride, padding, dilation, ceil_mode, layout = case
        windows, lead, out_size = ref._windows(np.zeros(shape), kernel, stride, padding,
                                               dilation, ceil_mode, layout)
        _, _, spatial = ref._planes(np.zeros(shape), len(out_size), layout)
        def backward(grad, i):
            return gp.max_pool_backward(grad, i, shape, kernel, stride, padding, dilation,
                                        ceil_mode, layout=layout)
    tap_sets = [sorted({f for _, f in taps}) for taps, _ in windows]
    plane = math.prod(spatial)
    steps = [math.prod(spatial[d + 1:]) for d in range(len(spatial))]
    first = [t[0] if t else -1 for t in tap_sets]
    grad = backend.to_backend(np.ones(ref._unplanes(first, lead, out_size, layout,
                                                    np.float32).shape, np.float32))

    def call(values):
        backward(grad, backend.to_backend(ref._unplanes(values, lead, out_size, layout,
                                                        np.int64)))

    for k, taps in enumerate(tap_sets):
        for v in taps:
            values = list(first)
            values[k] = v
            call(values)
        near = {t + s * d for t in taps for s in steps for d in (-1, 1)} - set(taps)
        _refused(call, first, k, sorted(p for p in near if 0 <= p < plane), taps, plane)
