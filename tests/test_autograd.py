"""Gradients through the float ops (:mod:`gpupool.interop.torch_ops`,
:mod:`gpupool.interop.autograd`): PyTorch autograd against
PyTorch's own pooling on random geometry within PyTorch's rules, ``gradcheck``, the graph,
``no_grad`` and the refusals; JAX ``grad`` (through ``jit`` and ``vmap``) against the same
pooling written with ``jax.lax.reduce_window`` and ``jnp.mean``/``jnp.max``."""
from __future__ import annotations

import math

import numpy as np
import pytest

import gpupool

torch = pytest.importorskip("torch")
F = torch.nn.functional
TORCH_TOL = {"float64": 1e-12, "float32": 2e-5}


def _distinct(rng, shape, dtype="float64"):
    """Values without ties, at least 0.01 apart (so that no max flips under gradcheck's
    perturbation), in random order."""
    n = math.prod(shape)
    return (rng.permutation(n).reshape(shape) * 0.01 - n * 0.005).astype(dtype)


def _grads(ours, theirs, a, dtype, seed):
    """``(gradient through ours, gradient through theirs)`` of ``(f(x) * g).sum()`` for a
    random cotangent ``g``, both on a copy of the NumPy array ``a``."""
    results = []
    for f in (ours, theirs):
        t = torch.tensor(a, dtype=getattr(torch, dtype), requires_grad=True)
        y = f(t)
        g = torch.tensor(np.random.default_rng(seed).standard_normal(tuple(y.shape)),
                         dtype=y.dtype)
        (y * g).sum().backward()
        results.append((y.detach().numpy(), t.grad.numpy()))
    (y_ours, grad_ours), (y_theirs, grad_theirs) = results
    tol = TORCH_TOL[dtype]
    np.testing.assert_allclose(y_ours, y_theirs, rtol=tol, atol=tol)
    np.testing.assert_allclose(grad_ours, grad_theirs, rtol=tol, atol=tol)
    return grad_ours


def _window_case(seed, op):
    """Random geometry within PyTorch's rules for ``op`` ("max", "max_dilated", "avg", "lp"):
    ``(nd, shape, kernel, stride, pad, dilation, ceil_mode)``."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, nd))
    stride = tuple(int(s) for s in rng.integers(1, 4, nd))
    dilation = (tuple(int(d) for d in rng.integers(1, 3, nd)) if op == "max_dilated"
                else (1,) * nd)
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if op == "lp":
        pad = (0,) * nd
    elif op == "avg":
        pad = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    else:  # PyTorch: at most half the kernel (not the dilated span)
        pad = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    spatial = tuple(int(s + rng.integers(0, 5)) for s in span)
    lead = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    ceil_mode = bool(rng.integers(0, 2)) and op != "lp"
    return nd, lead + spatial, kernel, stride, pad, dilation, ceil_mode


def _torch_pool(name, nd):
    return getattr(F, f"{name}{nd}d")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("op", ["max", "max_dilated"])
def test_torch_max_pool_gradient_equals_pytorchs(op, seed, dtype):
    nd, shape, k, s, p, d, ceil = _window_case(seed, op)
    a = _distinct(np.random.default_rng(seed), shape, dtype)
    _grads(lambda t: gpupool.max_pool(t, k, s, p, d, ceil),
           lambda t: _torch_pool("max_pool", nd)(t, k, s, p, d, ceil), a, dtype, seed)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_torch_avg_pool_gradient_equals_pytorchs(count_include_pad, seed, dtype):
    nd, shape, k, s, p, _, ceil = _window_case(seed, "avg")
    a = np.random.default_rng(seed).standard_normal(shape)
    divisor = int(np.random.default_rng(seed).integers(1, 7)) if nd == 2 and seed % 3 == 0 else None
    extra = {} if divisor is None else {"divisor_override": divisor}
    _grads(lambda t: gpupool.avg_pool(t, k, s, p, ceil, count_include_pad, divisor),
           lambda t: _torch_pool("avg_pool", nd)(t, k, s, p, ceil, count_include_pad, **extra),
           a, dtype, seed)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("seed", range(12))
def test_torch_lp_pool_gradient_equals_pytorchs(seed, dtype):
    """PyTorch's lp_pool omits the abs of ONNX's (gpupool's): positive inputs; without ceil
    mode, where PyTorch scales a partial window's mean by the whole kernel."""
    nd, shape, k, s, _, _, _ = _window_case(seed, "lp")
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 2.0, shape)
    norm = float(rng.choice([1.0, 1.5, 2.0, 3.0]))
    _grads(lambda t: gpupool.lp_pool(t, norm, k, s),
           lambda t: _torch_pool("lp_pool", nd)(t, norm, k[0] if nd == 1 else k,
                                                s[0] if nd == 1 else s), a, dtype, seed)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("op", ["avg", "max"])
def test_torch_adaptive_pool_gradient_equals_pytorchs(op, seed, dtype):
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    spatial = tuple(int(i) for i in rng.integers(1, 8, nd))
    out = tuple(int(rng.integers(1, i + 3)) for i in spatial)
    a = _distinct(rng, (2, 3) + spatial, dtype)
    ours = getattr(gpupool, f"adaptive_{op}_pool")
    _grads(lambda t: ours(t, out), lambda t: _torch_pool(f"adaptive_{op}_pool", nd)(t, out),
           a, dtype, seed)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("spatial_dims", [1, 2, 3])
@pytest.mark.parametrize("op", ["avg", "max"])
def test_torch_global_pool_gradient_equals_pytorchs(op, spatial_dims, dtype):
    rng = np.random.default_rng(spatial_dims)
    a = _distinct(rng, (2, 3) + tuple(int(i) for i in rng.integers(1, 6, spatial_dims)), dtype)
    ours = getattr(gpupool, f"global_{op}_pool")
    dims = tuple(range(2, 2 + spatial_dims))
    theirs = ((lambda t: t.mean(dim=dims, keepdim=True)) if op == "avg"
              else (lambda t: t.amax(dim=dims, keepdim=True)))
    _grads(lambda t: ours(t, spatial_dims=spatial_dims), theirs, a, dtype, spatial_dims)


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "adaptive_max_pool",
                                  "global_avg_pool"])
def test_torch_nhwc_gradient_equals_nchw(name):
    a = _distinct(np.random.default_rng(3), (2, 5, 6, 3))
    call = {"max_pool": lambda t, layout: gpupool.max_pool(t, 3, 2, 1, layout=layout),
            "avg_pool": lambda t, layout: gpupool.avg_pool(t, 3, 2, 1, True, layout=layout),
            "adaptive_max_pool": lambda t, layout: gpupool.adaptive_max_pool(
                t, (4, 4), layout=layout),
            "global_avg_pool": lambda t, layout: gpupool.global_avg_pool(t, layout=layout)}
    f = call[name]
    _grads(lambda t: f(t, "NHWC"),
           lambda t: f(t.permute(0, 3, 1, 2), "NCHW").permute(0, 2, 3, 1), a, "float64", 3)


@pytest.mark.parametrize("f", [
    lambda t: gpupool.avg_pool(t, 3, 2, 1, True, False),
    lambda t: gpupool.avg_pool(t, (2, 3), (1, 2), ((1, 0), (0, 1)), False, True),
    lambda t: gpupool.lp_pool(t.abs() + 0.5, 2.5, 3, 2, 1, ceil_mode=True),
    lambda t: gpupool.lp_pool(t, 3, 2, 1),
    lambda t: gpupool.max_pool(t, 3, 2, 1, 2, True),
    lambda t: gpupool.max_pool(t, 2, return_indices=True)[0],
    lambda t: gpupool.adaptive_avg_pool(t, (3, 4)),
    lambda t: gpupool.adaptive_max_pool(t, (4, 3)),
    lambda t: gpupool.global_max_pool(t),
], ids=["avg-ceil", "avg-asymmetric", "lp-ceil", "lp", "max-dilated", "max-indices",
        "adaptive-avg", "adaptive-max", "global-max"])
def test_torch_gradcheck(f):
    a = _distinct(np.random.default_rng(0), (2, 2, 7, 6)) + 0.003  # no zero (lp's |x|)
    t = torch.tensor(a, requires_grad=True)
    assert torch.autograd.gradcheck(f, (t,))


def test_torch_result_is_part_of_the_graph():
    t = torch.arange(16.0).reshape(1, 1, 4, 4).requires_grad_()
    y = gpupool.max_pool(t * 2, 2)  # a non-leaf input
    assert y.requires_grad and "gpupool_max_pool" in type(y.grad_fn).__name__
    y.sum().backward()
    want = np.zeros((4, 4))
    want[1::2, 1::2] = 2
    np.testing.assert_array_equal(t.grad[0, 0].numpy(), want)


def test_torch_indices_are_not_differentiable():
    t = torch.tensor(_distinct(np.random.default_rng(1), (1, 2, 4, 4)), requires_grad=True)
    for values, indices in (gpupool.max_pool(t, 2, return_indices=True),
                            gpupool.adaptive_max_pool(t, (3, 3), return_indices=True)):
        assert values.requires_grad and not indices.requires_grad
        assert indices.dtype == torch.int64
        want_values, want_indices = F.adaptive_max_pool2d(t.detach(), tuple(values.shape[2:]),
                                                          return_indices=True)
        np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


def test_torch_no_grad_and_detached_are_untracked():
    t = torch.tensor(_distinct(np.random.default_rng(2), (1, 2, 4, 4)), requires_grad=True)
    with torch.no_grad():
        y = gpupool.avg_pool(t, 2)
        values, indices = gpupool.max_pool(t, 2, return_indices=True)
        out = torch.empty((1, 2, 2, 2), dtype=torch.float64)
        assert gpupool.lp_pool(t, 2, 2, out=out) is out
    assert not y.requires_grad and not values.requires_grad and not out.requires_grad
    assert y.grad_fn is None
    np.testing.assert_array_equal(y.numpy(), gpupool.avg_pool(t.detach().numpy(), 2))
    detached = gpupool.avg_pool(t.detach(), 2)
    assert not detached.requires_grad
    np.testing.assert_array_equal(detached.numpy(), y.numpy())


def test_torch_float32_and_float16_keep_their_dtype():
    for dtype in (torch.float32, torch.float16):
        t = torch.ones((1, 1, 4, 4), dtype=dtype, requires_grad=True)
        y = gpupool.avg_pool(t, 2)
        assert y.dtype == dtype
        y.sum().backward()
        assert t.grad.dtype == dtype
        np.testing.assert_array_equal(t.grad.numpy(), np.full((1, 1, 4, 4), 0.25))


def test_torch_out_with_a_tracked_input_is_a_type_error():
    t = torch.ones((1, 1, 4, 4), requires_grad=True)
    with pytest.raises(TypeError, match="gpupool.max_pool: out .* autograd graph"):
        gpupool.max_pool(t, 2, out=torch.empty((1, 1, 2, 2)))


def test_torch_max_unpool_has_no_gradient():
    values, indices = gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, return_indices=True)
    with pytest.raises(TypeError, match="gpupool.max_unpool: x requires grad.*x.detach()"):
        gpupool.max_unpool(values.requires_grad_(), indices, 2)


def test_torch_backward_ops_take_tensors():
    """The backward ops take tensors as indices and x, as the autograd path calls them."""
    t = torch.tensor(_distinct(np.random.default_rng(4), (1, 2, 4, 4)))
    values, indices = gpupool.max_pool(t, 2, return_indices=True)
    grad = gpupool.max_pool_backward(torch.ones_like(values), indices=indices,
                                     input_shape=t.shape, kernel_size=2)
    assert isinstance(grad, torch.Tensor)
    np.testing.assert_array_equal(grad.numpy(), gpupool.max_pool_backward(
        np.ones(values.shape), indices.numpy(), t.shape, 2))
    grad = gpupool.lp_pool_backward(torch.ones_like(values), t, p=2, kernel_size=2)
    np.testing.assert_array_equal(grad.numpy(), gpupool.lp_pool_backward(
        np.ones(values.shape), t.numpy(), 2, 2))


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "adaptive_avg_pool",
                                  "adaptive_max_pool", "global_avg_pool"])
def test_torch_second_derivative_equals_pytorchs(name):
    """gh-33: a second derivative was silently zero: the gradient of a gradient (through the
    backward op, with respect to both its inputs) equals PyTorch's own."""
    a = _distinct(np.random.default_rng(5), (2, 2, 6, 6))
    ours, theirs = {
        "max_pool": (lambda t: gpupool.max_pool(t, 3, 2, 1), lambda t: F.max_pool2d(t, 3, 2, 1)),
        "avg_pool": (lambda t: gpupool.avg_pool(t, 3, 2, 1, count_include_pad=True),
                     lambda t: F.avg_pool2d(t, 3, 2, 1)),
        "adaptive_avg_pool": (lambda t: gpupool.adaptive_avg_pool(t, (4, 4)),
                              lambda t: F.adaptive_avg_pool2d(t, (4, 4))),
        "adaptive_max_pool": (lambda t: gpupool.adaptive_max_pool(t, (4, 4)),
                              lambda t: F.adaptive_max_pool2d(t, (4, 4))),
        "global_avg_pool": (gpupool.global_avg_pool, lambda t: t.mean((2, 3), keepdim=True)),
    }[name]
    results = []
    for pool in (ours, theirs):
        t = torch.tensor(a, requires_grad=True)
        y = pool(t)
        g = torch.tensor(np.random.default_rng(6).standard_normal(tuple(y.shape)),
                         requires_grad=True)
        (gx,) = torch.autograd.grad(y, t, g, create_graph=True)
        weights = torch.tensor(np.random.default_rng(7).standard_normal(a.shape))
        (gg,) = torch.autograd.grad((gx * weights).sum(), g)
        results.append(gg.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-12, atol=1e-12)


def test_torch_lp_pool_hessian_equals_pytorchs():
    """gh-33: torch.autograd.functional.hessian of lp_pool(...).sum() gave zeros."""
    a = np.abs(_distinct(np.random.default_rng(8), (1, 1, 5, 5))) + 0.1  # PyTorch: no abs
    for p in (2.0, 3.0):
        t = torch.tensor(a)
        ours = torch.autograd.functional.hessian(
            lambda t: gpupool.lp_pool(t, p, 2, 1).sum(), t)
        theirs = torch.autograd.functional.hessian(
            lambda t: F.lp_pool2d(t, p, 2, 1).sum(), t)
        assert ours.abs().max() > 0.1
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-10, atol=1e-12)


def test_torch_invalid_arguments_fail_as_without_grad():
    t = torch.ones((1, 1, 4, 4), requires_grad=True)
    with pytest.raises(ValueError, match="gpupool.avg_pool: .*kernel_size"):
        gpupool.avg_pool(t, 0)
    with pytest.raises(TypeError, match="gpupool.max_pool: return_indices"):
        gpupool.max_pool(t, 2, return_indices="yes")
    with pytest.raises(TypeError, match="gpupool.max_pool: .*unexpected keyword"):
        gpupool.max_pool(t, 2, kernel=3)
    with pytest.raises(TypeError, match="gpupool.avg_pool: x.* has dtype bfloat16"):
        gpupool.avg_pool(t.detach().bfloat16().requires_grad_(), 2)



@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "lp_pool", "global_max_pool",
                                  "adaptive_avg_pool"])
def test_torch_cuda_gradient_equals_the_cpus(name):
    """A CUDA tensor: forward and backward run on its GPU (CuPy), with the CPU's values."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    pytest.importorskip("cupy")
    f = {"max_pool": lambda t: gpupool.max_pool(t, 3, 2, 1),
         "avg_pool": lambda t: gpupool.avg_pool(t, 3, 2, 1, True),
         "lp_pool": lambda t: gpupool.lp_pool(t, 2, 3, 2),
         "global_max_pool": lambda t: gpupool.global_max_pool(t),
         "adaptive_avg_pool": lambda t: gpupool.adaptive_avg_pool(t, (3, 4))}[name]
    a = _distinct(np.random.default_rng(11), (2, 3, 7, 6)) + 0.003
    grads = []
    for device in ("cpu", "cuda"):
        t = torch.tensor(a, device=device, requires_grad=True)
        y = f(t)
        assert y.device == t.device and y.requires_grad
        (y * torch.arange(y.numel(), device=device).reshape(y.shape)).sum().backward()
        assert t.grad.device == t.device
        grads.append(t.grad.cpu().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-12)

# ----------------------------------------------------------------------------- JAX

@pytest.fixture
def jax():
    return pytest.importorskip("jax")


def _reduce_window(jax, t, init, reducer, kernel, stride, pads, dilation=None):
    """``jax.lax.reduce_window`` over the spatial dims of NCHW ``t``."""
    lead = t.ndim - len(kernel)
    dilation = dilation or (1,) * len(kernel)
    return jax.lax.reduce_window(t, init, reducer, (1,) * lead + tuple(kernel),
                                 (1,) * lead + tuple(stride), ((0, 0),) * lead + tuple(pads),
                                 window_dilation=(1,) * lead + tuple(dilation))


def _jax_case(seed):
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, nd))
    stride = tuple(int(s) for s in rng.integers(1, 4, nd))
    dilation = tuple(int(d) for d in rng.integers(1, 3, nd))
    pads = tuple((int(rng.integers(0, k)), int(rng.integers(0, k))) for k in kernel)
    spatial = tuple(int(d * (k - 1) + 1 + rng.integers(0, 5)) for k, d in zip(kernel, dilation))
    return (2, 3) + spatial, kernel, stride, pads, dilation


def _check_jax_grad(jax, ours, theirs, a, seed):
    """``jax.grad`` of ``(f(x) * g).sum()`` under ``jit``: ours against theirs."""
    jnp = jax.numpy
    x = jnp.asarray(a)
    y = theirs(x)
    g = jnp.asarray(np.random.default_rng(seed).standard_normal(y.shape), x.dtype)
    np.testing.assert_allclose(np.asarray(jax.jit(ours)(x)), np.asarray(y), rtol=1e-6, atol=1e-6)
    got = jax.jit(jax.grad(lambda t: (ours(t) * g).sum()))(x)
    want = jax.grad(lambda t: (theirs(t) * g).sum())(x)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_jax_max_pool_grad_equals_reduce_window(jax, seed):
    """Without dilation: JAX has no VJP of a dilated max reduce_window."""
    shape, k, s, p, _ = _jax_case(seed)
    d = (1,) * len(k)
    a = _distinct(np.random.default_rng(seed), shape, "float32")
    _check_jax_grad(jax, lambda t: gpupool.max_pool(t, k, s, p, d),
                    lambda t: _reduce_window(jax, t, -np.inf, jax.lax.max, k, s, p, d), a, seed)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_jax_avg_pool_grad_equals_reduce_window(jax, count_include_pad, seed):
    shape, k, s, p, _ = _jax_case(seed)
    p = tuple((min(b, kk // 2), min(e, kk // 2)) for (b, e), kk in zip(p, k))
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    def theirs(t):
        total = _reduce_window(jax, t, 0.0, jax.lax.add, k, s, p)
        if count_include_pad:
            return total / math.prod(k)
        count = _reduce_window(jax, jax.numpy.ones(t.shape[-len(k):], t.dtype), 0.0,
                               jax.lax.add, k, s, p)
        return total / count
    _check_jax_grad(jax, lambda t: gpupool.avg_pool(t, k, s, p,
                                                    count_include_pad=count_include_pad),
                    theirs, a, seed)


@pytest.mark.parametrize("seed", range(6))
def test_jax_lp_pool_grad_equals_reduce_window(jax, seed):
    shape, k, s, p, d = _jax_case(seed)
    a = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)
    a[np.abs(a) < 0.1] = 0.5

    def theirs(t):
        return _reduce_window(jax, abs(t) ** 3, 0.0, jax.lax.add, k, s, p, d) ** (1 / 3)
    _check_jax_grad(jax, lambda t: gpupool.lp_pool(t, 3, k, s, p, d), theirs, a, seed)


@pytest.mark.parametrize("op", ["avg", "max"])
def test_jax_global_pool_grad_equals_mean_and_max(jax, op):
    a = _distinct(np.random.default_rng(6), (2, 3, 5, 4), "float32")
    reduce = getattr(jax.numpy, "mean" if op == "avg" else "max")
    _check_jax_grad(jax, lambda t: getattr(gpupool, f"global_{op}_pool")(t),
                    lambda t: reduce(t, axis=(2, 3), keepdims=True), a, 6)


@pytest.mark.parametrize("op", ["avg", "max"])
def test_jax_adaptive_pool_grad_equals_reduce_window(jax, op):
    """Sizes that divide evenly: the adaptive windows are then kernel = stride = I / O."""
    a = _distinct(np.random.default_rng(7), (2, 3, 6, 8), "float32")
    init, reducer = (0.0, jax.lax.add) if op == "avg" else (-np.inf, jax.lax.max)

    def theirs(t):
        pooled = _reduce_window(jax, t, init, reducer, (3, 2), (3, 2), ((0, 0), (0, 0)))
        return pooled / 6 if op == "avg" else pooled
    _check_jax_grad(jax, lambda t: getattr(gpupool, f"adaptive_{op}_pool")(t, (2, 4)),
                    theirs, a, 7)


def test_jax_jit_forward_alone_and_indices(jax):
    a = _distinct(np.random.default_rng(8), (2, 3, 6, 6), "float32")
    x = jax.numpy.asarray(a)
    for f in (lambda t: gpupool.avg_pool(t, 3, 2, 1), lambda t: gpupool.lp_pool(t, 2, 2),
              lambda t: gpupool.global_max_pool(t), lambda t: gpupool.adaptive_avg_pool(t, 4)):
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), np.asarray(f(x)))
    values, indices = jax.jit(lambda t: gpupool.max_pool(t, 2, return_indices=True))(x)
    want_values, want_indices = gpupool.max_pool(a, 2, return_indices=True)
    assert indices.dtype == (np.int64 if jax.config.jax_enable_x64 else np.int32)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    grad = jax.grad(lambda t: gpupool.max_pool(t, 2, return_indices=True)[0].sum())(x)
    np.testing.assert_array_equal(np.asarray(grad), gpupool.max_pool_backward(
        np.ones_like(want_values), want_indices, a.shape, 2))


def test_jax_integer_max_under_jit(jax):
    a = np.arange(32, dtype=np.int8).reshape(1, 2, 4, 4)
    result = jax.jit(lambda t: gpupool.max_pool(t, 2))(jax.numpy.asarray(a))
    assert result.dtype == np.int8
    np.testing.assert_array_equal(np.asarray(result), gpupool.max_pool(a, 2))


def test_jax_vmap_of_grad_is_one_batched_call(jax):
    """A vmapped batch arrives as extra leading (plane) dims, along any axis."""
    a = _distinct(np.random.default_rng(9), (3, 2, 5, 6), "float32")
    x = jax.numpy.asarray(a)
    f = jax.grad(lambda t: (gpupool.max_pool(t, 2, 1) * np.arange(20.0).reshape(4, 5)).sum())
    looped = np.stack([np.asarray(f(x[:, i])) for i in range(2)], axis=1)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(f, in_axes=1, out_axes=1))(x)),
                                  looped)
    lp = jax.grad(lambda t: gpupool.lp_pool(t, 2, 3).sum())
    np.testing.assert_allclose(np.asarray(jax.vmap(lp)(x)),
                               np.stack([np.asarray(lp(x[i])) for i in range(3)]), rtol=1e-6)


def test_jax_jacrev_batches_the_cotangents(jax):
    a = _distinct(np.random.default_rng(10), (1, 1, 4, 4), "float32")
    jac = jax.jacrev(lambda t: gpupool.avg_pool(t, 2))(jax.numpy.asarray(a))
    assert jac.shape == (1, 1, 2, 2, 1, 1, 4, 4)
    np.testing.assert_array_equal(np.asarray(jac).reshape(4, 16).sum(axis=0), np.full(16, 0.25))


def test_jax_traced_errors(jax):
    x = jax.numpy.ones((1, 1, 4, 4))
    with pytest.raises(ValueError, match="gpupool.max_pool: .*kernel_size"):
        jax.jit(lambda t: gpupool.max_pool(t, 0))(x)
    with pytest.raises(TypeError, match="gpupool.avg_pool_backward: grad_output is a traced"):
        jax.jit(lambda g: gpupool.avg_pool_backward(g, (1, 1, 4, 4), 2))(
            jax.numpy.ones((1, 1, 2, 2)))
