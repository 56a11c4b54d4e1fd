"""Gradients through the float ops (:mod:`gpupool.interop.torch_ops`,
:mod:`gpupool.interop.autograd`): PyTorch autograd against
PyTorch's own pooling on random geometry within PyTorch's rules, ``gradcheck``, the graph,
``no_grad`` and the refusals (JAX: tests/test_jax.py)."""
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
    with pytest.raises(TypeError, match="gpupool.avg_pool: x.* has dtype complex64"):
        gpupool.avg_pool(t.detach().to(torch.complex64).requires_grad_(), 2)



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
