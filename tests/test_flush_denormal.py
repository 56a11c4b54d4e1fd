"""float16 averages in a thread that flushes subnormals (``torch.set_flush_denormal(True)``,
common in inference servers, sets flush-to-zero and denormals-are-zero on x86).

float16 subnormals are float32 normals, so a float16 average, summed in float32, keeps them
whatever the floating-point mode: the results must equal the float64 reference rounded to
float16, as PyTorch's own float16 averages do in the same mode.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numpy.testing import assert_allclose, assert_array_equal

import gpupool as gp
import reference as ref

HALF_STEP = 2.0 ** -24  # the smallest float16 subnormal: float16's spacing below 2**-14


@contextlib.contextmanager
def flush_denormal():
    """Flush-to-zero and denormals-are-zero in this thread, restored after."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        assert np.float32(2.0 ** -149) * np.float32(2.0 ** 24) == 0  # the mode is on
        yield
    finally:
        torch.set_flush_denormal(False)


def subnormal_halves(shape, layout="NCHW"):
    """float16 subnormals of both signs with a few normals among them."""
    rng = np.random.default_rng(7)
    x = rng.integers(-1023, 1024, size=shape) * HALF_STEP
    x[rng.random(shape) < 0.05] = 2.0 ** -13
    x = x.astype(np.float16)
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if layout == "NHWC" else x


def assert_rounded_reference(got, expected):
    """``got`` (float16) equals the float64 ``expected`` to float16's tolerance (STYLE.md's
    table), and to one subnormal step where ``expected`` is subnormal: nothing flushed."""
    assert got.dtype == np.float16
    assert_allclose(got.astype(np.float64), expected, rtol=1e-3, atol=HALF_STEP)
    assert np.count_nonzero(got) >= 0.9 * got.size


# (name, gpupool op, float64 reference, PyTorch's float16 op or None) on NCHW 2-D input
OPS = [
    ("avg_pool", lambda x, **kw: gp.avg_pool(x, 3, 2, 1, **kw),
     lambda x, **kw: ref.avg_pool(x, 3, 2, 1, **kw),
     lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)),
    ("global_avg_pool", lambda x, **kw: gp.global_avg_pool(x, **kw),
     lambda x, **kw: ref.global_avg_pool(x, 2, **kw),
     lambda t: F.adaptive_avg_pool2d(t, 1)),
    ("adaptive_avg_pool", lambda x, **kw: gp.adaptive_avg_pool(x, (5, 3), **kw),
     lambda x, **kw: ref.adaptive_avg_pool(x, (5, 3), **kw),
     lambda t: F.adaptive_avg_pool2d(t, (5, 3))),
    ("adaptive_avg_pool to 1", lambda x, **kw: gp.adaptive_avg_pool(x, 1, **kw),
     lambda x, **kw: ref.adaptive_avg_pool(x, (1, 1), **kw),
     lambda t: F.adaptive_avg_pool2d(t, 1)),
    ("lp_pool p=1", lambda x, **kw: gp.lp_pool(x, 1, 2, **kw),
     lambda x, **kw: ref.lp_pool(x, 1, 2, **kw), None),
    ("lp_pool p=2", lambda x, **kw: gp.lp_pool(x, 2, 2, **kw),
     lambda x, **kw: ref.lp_pool(x, 2, 2, **kw), None),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
# (2, 3, 8, 10): the small-input paths; (2, 8, 40, 48): the separable and blocked ones
@pytest.mark.parametrize("shape", [(2, 3, 8, 10), (2, 8, 40, 48)])
@pytest.mark.parametrize("name, op, reference, torch_op", OPS, ids=[o[0] for o in OPS])
def test_float16_averages_keep_subnormals_when_the_thread_flushes_them(
        name, op, reference, torch_op, shape, layout):
    """Regression: the float16 -> float32 widening made float32 subnormals (the half's bits
    moved into float32 fields, value * 2**-112), which a flushing thread read as 0, so every
    one of these averages gave 0."""
    x = subnormal_halves(shape, layout)
    expected = reference(x, layout=layout)
    with flush_denormal():
        got = op(x, layout=layout)
        theirs = None if torch_op is None or layout == "NHWC" else (
            torch_op(torch.from_numpy(x)).numpy())
    assert_rounded_reference(got, expected)
    assert_array_equal(got.view(np.int16), op(x, layout=layout).view(np.int16))  # as unflushed
    if theirs is not None:
        assert_rounded_reference(theirs, expected)  # PyTorch keeps them too
        assert_allclose(got, theirs, rtol=1e-3, atol=HALF_STEP)
