"""bfloat16 against PyTorch's and JAX's own bfloat16 pooling, and gpupool's rounding rule.

The rule (docs/api.md, "dtypes"): the taps widened to float32, float32 arithmetic, each result
rounded once to bfloat16 to nearest even as CUDA's ``__float2bfloat16_rn`` (every NaN
becomes 0x7FFF). PyTorch's CPU bfloat16 pooling accumulates in float32 and rounds once too, so
max, average and adaptive pooling agree with it bit for bit (NaNs: any NaN); its Lp pooling
rounds ``x**p``, the average and the root each to bfloat16, so Lp agrees to two bfloat16
units. ``lax.reduce_window`` of bfloat16 in float32 then cast agrees bit for bit. The bodies
run on every backend: NumPy arrays of ``ml_dtypes.bfloat16`` and CuPy (the CUDA kernels'
``__nv_bfloat16`` instantiations); PyTorch tensors and JAX arrays go through DLPack.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import gpupool
from gpupool import quantized as Q
from dtypes import BFLOAT16

torch = pytest.importorskip("torch")
F = torch.nn.functional
UNIT = 2.0**-7  # a bfloat16 unit in the last place, relative to values in [1, 2)


def torch_of(a) -> "torch.Tensor":
    """The bfloat16 NumPy array ``a`` as a torch.bfloat16 tensor (a copy of its bits)."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)


def numpy_of(t) -> np.ndarray:
    """The torch.bfloat16 tensor ``t`` as a NumPy array of ml_dtypes.bfloat16."""
    return t.detach().contiguous().view(torch.int16).numpy().view(BFLOAT16)


def assert_same_bits(got, want) -> None:
    """Equal bfloat16 bits, except that any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == BFLOAT16 and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def random_bfloat16(shape, seed, specials=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(BFLOAT16)
    if specials:
        u = rng.random(shape)
        x[u < 0.03] = np.nan
        x[(u >= 0.03) & (u < 0.05)] = np.inf
        x[(u >= 0.05) & (u < 0.07)] = -np.inf
    return x


# op id -> (gpupool call, PyTorch's call, input shape, NaN/inf in the input)
TORCH_OPS = {
    "max1d-k3-s2-p1-ceil": (lambda x: gpupool.max_pool(x, (3,), 2, 1, ceil_mode=True,
                                                       return_indices=True),
                            lambda t: F.max_pool1d(t, 3, 2, 1, ceil_mode=True,
                                                   return_indices=True), (2, 3, 17), True),
    "max2d-k3-s2-p1": (lambda x: gpupool.max_pool(x, 3, 2, 1, return_indices=True),
                       lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), (2, 3, 11, 12),
                       True),
    "max2d-k2-d2": (lambda x: gpupool.max_pool(x, 2, 1, 0, 2),
                    lambda t: F.max_pool2d(t, 2, 1, 0, 2), (2, 3, 9, 8), True),
    "max3d-k2": (lambda x: gpupool.max_pool(x, (2, 2, 2), return_indices=True),
                 lambda t: F.max_pool3d(t, 2, return_indices=True), (1, 3, 4, 6, 6), True),
    "avg2d-k3-s2-p1-ceil": (lambda x: gpupool.avg_pool(x, 3, 2, 1, True, True),
                            lambda t: F.avg_pool2d(t, 3, 2, 1, True, True), (2, 3, 12, 11),
                            False),
    "avg2d-k3-valid-taps": (lambda x: gpupool.avg_pool(x, 3, 1, 1),
                            lambda t: F.avg_pool2d(t, 3, 1, 1, count_include_pad=False),
                            (2, 3, 9, 10), False),
    "avg2d-k2-div3": (lambda x: gpupool.avg_pool(x, 2, divisor_override=3),
                      lambda t: F.avg_pool2d(t, 2, divisor_override=3), (2, 3, 8, 8), False),
    "avg1d-k4-s3-p2": (lambda x: gpupool.avg_pool(x, (4,), 3, 2, count_include_pad=True),
                       lambda t: F.avg_pool1d(t, 4, 3, 2), (2, 3, 20), False),
    "adaptive-avg-7x9to3x4": (lambda x: gpupool.adaptive_avg_pool(x, (3, 4)),
                              lambda t: F.adaptive_avg_pool2d(t, (3, 4)), (2, 3, 7, 9), False),
    "adaptive-max-7x9to3x4": (lambda x: gpupool.adaptive_max_pool(x, (3, 4),
                                                                  return_indices=True),
                              lambda t: F.adaptive_max_pool2d(t, (3, 4), return_indices=True),
                              (2, 3, 7, 9), True),
    "global-avg": (lambda x: gpupool.global_avg_pool(x),
                   lambda t: F.adaptive_avg_pool2d(t, 1), (2, 3, 6, 7), False),
    "global-max": (lambda x: gpupool.global_max_pool(x),
                   lambda t: F.adaptive_max_pool2d(t, 1), (2, 3, 6, 7), True),
}


@pytest.mark.parametrize("op", TORCH_OPS)
def test_matches_pytorch_bfloat16_pooling(backend, op):
    """Values bit for bit (any NaN for a NaN) and indices equal to PyTorch's CPU bfloat16
    pooling, on NumPy arrays of ml_dtypes.bfloat16 and on CuPy."""
    ours, theirs, shape, specials = TORCH_OPS[op]
    x = random_bfloat16(shape, sum(map(ord, op)), specials)
    got, want = ours(backend.to_backend(x)), theirs(torch_of(x))
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert backend.is_native(got[0])
    assert_same_bits(backend.to_numpy(got[0]), numpy_of(want[0]))
    for g, w in zip(got[1:], want[1:]):
        assert_array_equal(backend.to_numpy(g), w.numpy())


def test_torch_bfloat16_without_ml_dtypes_is_a_type_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    with pytest.raises(TypeError, match=r"gpupool\.max_pool: x is bfloat16.*gpupool\[bfloat16\]"):
        gpupool.max_pool(torch.ones((1, 1, 2, 2), dtype=torch.bfloat16), 2)


def test_torch_bfloat16_tensors_run_and_come_back_as_bfloat16():
    """torch.bfloat16 in (through DLPack as its bits, read in place), torch.bfloat16 out, as
    PyTorch's own op; out= is written in place."""
    x = random_bfloat16((2, 3, 10, 10), 5, specials=True)
    t = torch_of(x).transpose(2, 3)  # a strided view, read in place
    got = gpupool.max_pool(t, 3, 2, 1)
    assert got.dtype == torch.bfloat16
    assert_same_bits(numpy_of(got), numpy_of(F.max_pool2d(t, 3, 2, 1)))
    out = torch.empty((2, 3, 5, 5), dtype=torch.bfloat16)
    assert gpupool.avg_pool(t, 2, out=out) is out
    assert_same_bits(numpy_of(out), numpy_of(F.avg_pool2d(t, 2)))


def test_lp_pool_agrees_with_pytorch_to_its_own_roundings():
    """PyTorch's bfloat16 Lp pooling rounds x**p, the average and the root each to bfloat16
    (and omits the abs: the input is positive); gpupool rounds once, so they agree to two
    bfloat16 units."""
    x = np.abs(random_bfloat16((2, 3, 11, 10), 7))
    for p in (1, 2, 3.5):
        got = gpupool.lp_pool(x, p, 3, 2)
        want = numpy_of(F.lp_pool2d(torch_of(x), p, 3, 2))
        assert got.dtype == BFLOAT16
        assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 * UNIT)


# backward op id -> (gpupool forward on a tracked tensor, PyTorch's own, input shape)
TORCH_GRADIENTS = {
    "max2d-k2": (lambda t: gpupool.max_pool(t, 2), lambda t: F.max_pool2d(t, 2), (2, 3, 8, 8)),
    "avg2d-k2": (lambda t: gpupool.avg_pool(t, 2), lambda t: F.avg_pool2d(t, 2), (2, 3, 8, 8)),
    "avg2d-k3-s2-p1": (lambda t: gpupool.avg_pool(t, 3, 2, 1, count_include_pad=True),
                       lambda t: F.avg_pool2d(t, 3, 2, 1), (2, 3, 9, 9)),
    "adaptive-avg": (lambda t: gpupool.adaptive_avg_pool(t, (3, 4)),
                     lambda t: F.adaptive_avg_pool2d(t, (3, 4)), (2, 3, 7, 9)),
    "adaptive-max": (lambda t: gpupool.adaptive_max_pool(t, (3, 4)),
                     lambda t: F.adaptive_max_pool2d(t, (3, 4)), (2, 3, 7, 9)),
    "global-avg": (lambda t: gpupool.global_avg_pool(t), lambda t: F.adaptive_avg_pool2d(t, 1),
                   (2, 3, 6, 7)),
    "lp2": (lambda t: gpupool.lp_pool(t, 2, 2), lambda t: F.lp_pool2d(t, 2, 2), (2, 3, 8, 8)),
}


@pytest.mark.parametrize("op", TORCH_GRADIENTS)
def test_gradients_agree_with_pytorch_bfloat16_autograd(op):
    """torch.autograd through gpupool's bfloat16 backward ops against PyTorch's own pooling
    gradients of the same values in float32, rounded to bfloat16: equal to a bfloat16 unit
    (the float32 sums may round differently). (PyTorch's bfloat16 backward adds overlapping
    windows' gradients in bfloat16, and its Lp composite rounds each step, so it is no
    oracle here.)"""
    ours, theirs, shape = TORCH_GRADIENTS[op]
    x = np.abs(random_bfloat16(shape, sum(map(ord, op)))) + BFLOAT16.type(0.5)
    upstream = torch_of(random_bfloat16(theirs(torch_of(x)).shape, 3))
    t = torch_of(x).requires_grad_()
    (ours(t) * upstream).sum().backward()
    assert t.grad.dtype == torch.bfloat16
    t32 = torch_of(x).float().requires_grad_()
    (theirs(t32) * upstream.float()).sum().backward()
    assert_allclose(t.grad.float().numpy(), t32.grad.bfloat16().float().numpy(), rtol=UNIT,
                    atol=UNIT * 2.0**-4)


# ----------------------------------------------------------------------------- JAX

@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax")


def lax_pool(jax, x, op, k, s, pad):
    """PyTorch-free reference: ``lax.reduce_window`` over a bfloat16 NCHW array, max in
    bfloat16 (exact), the sum in float32 divided by the full window, then cast (XLA rounds to
    nearest even)."""
    lax, jnp = jax.lax, jax.numpy
    window, strides = (1, 1) + (k,) * 2, (1, 1) + (s,) * 2
    padding = ((0, 0), (0, 0)) + ((pad, pad),) * 2
    if op == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
    total = lax.reduce_window(x.astype(jnp.float32), 0.0, lax.add, window, strides, padding)
    return (total / (k * k)).astype(jnp.bfloat16)


@pytest.mark.parametrize("op, k, s, pad", [("max", 3, 2, 1), ("max", 2, 2, 0),
                                           ("avg", 3, 2, 1), ("avg", 2, 2, 0)])
def test_matches_lax_reduce_window_on_jax_bfloat16(jax, op, k, s, pad):
    """jnp.bfloat16 arrays (concrete, and traced under jit) against lax.reduce_window:
    bit for bit (any NaN for a NaN); the gradient of the average as JAX's of its own."""
    jnp = jax.numpy
    x = jnp.asarray(random_bfloat16((2, 3, 10, 9), k * 10 + pad, specials=op == "max"))
    assert x.dtype == jnp.bfloat16

    def ours(a):
        if op == "max":
            return gpupool.max_pool(a, k, s, pad)
        return gpupool.avg_pool(a, k, s, pad, count_include_pad=True)

    want = np.asarray(lax_pool(jax, x, op, k, s, pad))
    for got in (ours(x), jax.jit(ours)(x)):
        assert got.dtype == jnp.bfloat16
        assert_same_bits(np.asarray(got), want)
    if op == "avg":
        def loss(f):
            return lambda a: (f(a).astype(jnp.float32) ** 2).sum()
        got = jax.grad(loss(ours))(x)
        want = jax.grad(loss(lambda a: lax_pool(jax, a, op, k, s, pad)))(x)
        assert got.dtype == jnp.bfloat16
        assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                        rtol=UNIT, atol=UNIT * 2.0**-4)


# ----------------------------------------------------------------------------- the rule

def bfloat16_bits(*bits) -> np.ndarray:
    return np.array(bits, np.uint16).view(BFLOAT16)


# (call, input bits, expected output bits): each written out from the rule by hand
ROUNDING = {
    # 1 + 3 * 2**-9 over 4 = 0.25 + 0.75 units of 0.25: rounded once, up (0x3E81); rounding
    # each partial sum to bfloat16 would give 0.25 (0x3E80)
    "once": (lambda x: gpupool.avg_pool(x, (4,)), (0x3F80, 0x3B00, 0x3B00, 0x3B00), (0x3E81,)),
    # means exactly halfway between two bfloat16s: to the even one, down and up
    "tie-down": (lambda x: gpupool.avg_pool(x, (2,)), (0x3F80, 0x3F81), (0x3F80,)),
    "tie-up": (lambda x: gpupool.avg_pool(x, (2,)), (0x3F81, 0x3F82), (0x3F82,)),
    # the smallest subnormal is kept; the largest finite twice overflows to inf
    "subnormal": (lambda x: gpupool.avg_pool(x, (2,)), (0x0001, 0x0001), (0x0001,)),
    "overflow": (lambda x: gpupool.lp_pool(x, 1, (2,)), (0x7F7F, 0x7F7F), (0x7F80,)),
    # every NaN (payloads, sign) comes out as 0x7FFF, from a max and from a sum
    "nan-max": (lambda x: gpupool.max_pool(x, (2,)), (0x7FC1, 0x3F80, 0x3F80, 0xFFC0),
                (0x7FFF, 0x7FFF)),
    "nan-max-indices": (lambda x: gpupool.max_pool(x, (2,), return_indices=True)[0],
                        (0x7F81, 0x3F80), (0x7FFF,)),
    "nan-sum": (lambda x: gpupool.avg_pool(x, (2,)), (0xFFC1, 0x3F80), (0x7FFF,)),
    "nan-global": (lambda x: gpupool.global_max_pool(x, spatial_dims=1), (0x3F80, 0xFFFF),
                   (0x7FFF,)),
    # a max returns the winning element: -0 before +0 keeps -0, -inf stays -inf
    "signed-zero": (lambda x: gpupool.max_pool(x, (2,), return_indices=True)[0],
                    (0x8000, 0x0000, 0xFF80, 0xFF80), (0x8000, 0xFF80)),
}


@pytest.mark.parametrize("case", ROUNDING)
def test_results_are_rounded_once_to_nearest_even_with_nan_0x7fff(backend, case):
    call, given, expected = ROUNDING[case]
    x = backend.to_backend(bfloat16_bits(*given).reshape(1, -1))
    got = backend.to_numpy(call(x))
    assert got.dtype == BFLOAT16
    assert_array_equal(got.view(np.uint16).reshape(-1), np.array(expected, np.uint16))


def test_backward_rounds_each_gradient_once(backend):
    """The one input position, covered by all four windows (kernel 4, padding 3), sums their
    gradients 1, 2**-9, 2**-9, 2**-9 in float32 and rounds once: 1 + 0.75 units, up to
    0x3F81 (adding in bfloat16 would stay at 1.0 after each step)."""
    grad = backend.to_backend(bfloat16_bits(0x3F80, 0x3B00, 0x3B00, 0x3B00).reshape(1, 4))
    got = gpupool.avg_pool_backward(grad, (1, 1), (4,), 1, 3, divisor_override=1)
    assert backend.to_numpy(got).dtype == BFLOAT16
    assert backend.to_numpy(got).view(np.uint16).tolist() == [[0x3F81]]


def test_quantized_ops_refuse_bfloat16():
    x = random_bfloat16((1, 1, 4, 4), 0)
    with pytest.raises(TypeError, match=r"gpupool\.quantized\.quantize: x has dtype bfloat16"):
        Q.quantize(x, 0.1)
    with pytest.raises(TypeError, match=r"gpupool\.quantized\.QArray: dtype bfloat16"):
        Q.QArray(x, 0.1, 0)


def test_dask_arrays_of_bfloat16_equal_the_in_memory_ops():
    """Lazy pooling of bfloat16 chunks: bit for bit the in-memory result, for any chunking
    (NaNs too: the blocks round as the in-memory ops)."""
    da = pytest.importorskip("dask.array")
    x = random_bfloat16((2, 3, 20, 20), 11)
    x[0, 0, 3, 4:9] = np.nan
    chunked = da.from_array(x, chunks=(1, 3, 7, 9))
    for call in (lambda a: gpupool.max_pool(a, 3, 2, 1), lambda a: gpupool.avg_pool(a, 3, 2, 1),
                 lambda a: gpupool.lp_pool(a, 2, 3, 2),
                 lambda a: gpupool.adaptive_avg_pool(a, (5, 6)), gpupool.global_max_pool):
        got = call(chunked).compute()
        assert_array_equal(got.view(np.uint16), call(x).view(np.uint16))
    grad = random_bfloat16((2, 3, 10, 10), 12)
    got = gpupool.avg_pool_backward(da.from_array(grad, chunks=(1, 3, 4, 4)), x.shape, 3, 2, 1)
    assert_array_equal(got.compute().view(np.uint16),
                       gpupool.avg_pool_backward(grad, x.shape, 3, 2, 1).view(np.uint16))
