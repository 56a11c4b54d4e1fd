"""PyTorch as a second oracle, on random configurations PyTorch accepts (skipped without torch).

Where the semantics differ by design, the comparison adapts: gpupool's avg default is
``count_include_pad=False`` (passed explicitly here), and PyTorch's LpPool omits the abs (inputs
are non-negative here). NHWC is checked by transposing PyTorch's NCHW result.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import gpupool

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOL = dict(rtol=1e-12, atol=1e-12)  # float64 throughout


@st.composite
def torch_cases(draw, avg=False):
    nd = draw(st.integers(1, 3))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    spatial = tuple(draw(st.integers(k, k + {1: 7, 2: 4, 3: 2}[nd])) for k in kernel)
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    # PyTorch: pad <= kernel // 2, one symmetric pad per dim
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    dilation = (1,) * nd if avg else tuple(draw(st.integers(1, 2)) for _ in range(nd))
    if not avg:  # keep the dilated window inside the padded input
        dilation = tuple(d if (k - 1) * d + 1 <= i + 2 * p else 1
                         for d, k, i, p in zip(dilation, kernel, spatial, padding))
    return dict(nd=nd, shape=(n, c) + spatial, kernel=kernel, stride=stride, padding=padding,
                dilation=dilation, ceil_mode=draw(st.booleans()),
                layout=draw(st.sampled_from(["NCHW", "NHWC"])),
                seed=draw(st.integers(0, 2**32 - 1)))


def _input(case, nonneg=False):
    x = np.random.default_rng(case["seed"]).standard_normal(case["shape"])
    return np.abs(x) if nonneg else x


def _gp_input(x, layout):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if layout == "NHWC" else x


def _from_torch(t, layout):
    a = t.numpy()
    return np.moveaxis(a, 1, -1) if layout == "NHWC" else a


@settings(max_examples=100)
@given(case=torch_cases())
def test_max_pool_agrees_with_pytorch(backend, case):
    x = _input(case)
    nd, layout = case["nd"], case["layout"]
    fn = getattr(F, f"max_pool{nd}d")
    tv, ti = fn(torch.from_numpy(x), case["kernel"], case["stride"], case["padding"],
                case["dilation"], ceil_mode=case["ceil_mode"], return_indices=True)
    y, i = gpupool.max_pool(backend.to_backend(_gp_input(x, layout)), case["kernel"],
                            case["stride"], case["padding"], case["dilation"], case["ceil_mode"],
                            return_indices=True, layout=layout)
    assert_array_equal(backend.to_numpy(y), _from_torch(tv, layout))
    assert_array_equal(backend.to_numpy(i), _from_torch(ti, layout))


def test_max_pool_window_missed_by_dilation_differs_from_pytorch_only_in_the_index(backend):
    """PyTorch allows a window with no valid tap when dilation steps over the input (its
    padding is at most k/2): -inf as here, but an index outside the plane, where gpupool
    gives -1 (docs/semantics.md)."""
    x = np.full((1, 1, 1, 1), 3.0)
    tv, ti = F.max_pool2d(torch.from_numpy(x), 2, 1, 1, 2, return_indices=True)
    y, i = gpupool.max_pool(backend.to_backend(x), 2, 1, 1, 2, return_indices=True)
    assert_array_equal(backend.to_numpy(y), tv.numpy())
    assert tv.shape == (1, 1, 1, 1) and tv.item() == -np.inf and ti.item() >= x.size
    assert_array_equal(backend.to_numpy(i), [[[[-1]]]])


@settings(max_examples=100)
@given(case=torch_cases(avg=True), count_include_pad=st.booleans(),
       divisor_override=st.none() | st.integers(1, 5))
def test_avg_pool_agrees_with_pytorch(backend, case, count_include_pad, divisor_override):
    x = _input(case)
    nd, layout = case["nd"], case["layout"]
    fn = getattr(F, f"avg_pool{nd}d")
    if nd == 1:
        divisor_override = None  # avg_pool1d has none
    extra = {} if nd == 1 else dict(divisor_override=divisor_override)
    expected = fn(torch.from_numpy(x), case["kernel"], case["stride"], case["padding"],
                  case["ceil_mode"], count_include_pad, **extra)
    y = gpupool.avg_pool(backend.to_backend(_gp_input(x, layout)), case["kernel"], case["stride"],
                         case["padding"], case["ceil_mode"], count_include_pad, divisor_override,
                         layout=layout)
    assert_allclose(backend.to_numpy(y), _from_torch(expected, layout), **TOL)


@settings(max_examples=80)
@given(case=torch_cases(avg=True), p=st.sampled_from([1.0, 2.0, 3.0, 0.5, 1.7]))
def test_lp_pool_agrees_with_pytorch_on_non_negative_input(backend, case, p):
    # PyTorch's LpPool: no padding, and with ceil_mode it rescales partial windows, so neither
    x = _input(case, nonneg=True)
    nd, layout = case["nd"], case["layout"]
    k, s = (case["kernel"][0], case["stride"][0]) if nd == 1 else (case["kernel"], case["stride"])
    expected = getattr(F, f"lp_pool{nd}d")(torch.from_numpy(x), p, k, s)  # 1d takes ints
    y = gpupool.lp_pool(backend.to_backend(_gp_input(x, layout)), p, case["kernel"],
                        case["stride"], layout=layout)
    assert_allclose(backend.to_numpy(y), _from_torch(expected, layout), **TOL)


@settings(max_examples=100)
@given(nd=st.integers(1, 3), data=st.data(), layout=st.sampled_from(["NCHW", "NHWC"]),
       seed=st.integers(0, 2**32 - 1))
def test_adaptive_pools_agree_with_pytorch(backend, nd, data, layout, seed):
    spatial = tuple(data.draw(st.integers(1, {1: 12, 2: 7, 3: 5}[nd])) for _ in range(nd))
    output_size = tuple(data.draw(st.integers(1, i + 3)) for i in spatial)
    x = np.random.default_rng(seed).standard_normal((2, 3) + spatial)
    xt, xb = torch.from_numpy(x), backend.to_backend(_gp_input(x, layout))
    ev = getattr(F, f"adaptive_avg_pool{nd}d")(xt, output_size)
    assert_allclose(backend.to_numpy(gpupool.adaptive_avg_pool(xb, output_size, layout=layout)),
                    _from_torch(ev, layout), **TOL)
    mv, mi = getattr(F, f"adaptive_max_pool{nd}d")(xt, output_size, return_indices=True)
    y, i = gpupool.adaptive_max_pool(xb, output_size, return_indices=True, layout=layout)
    assert_array_equal(backend.to_numpy(y), _from_torch(mv, layout))
    assert_array_equal(backend.to_numpy(i), _from_torch(mi, layout))
    gv = getattr(F, f"adaptive_avg_pool{nd}d")(xt, (1,) * nd)
    assert_allclose(backend.to_numpy(gpupool.global_avg_pool(xb, spatial_dims=nd, layout=layout)),
                    _from_torch(gv, layout), **TOL)


@settings(max_examples=60)
@given(case=torch_cases())
def test_max_unpool_agrees_with_pytorch(backend, case):
    nd = case["nd"]
    x = _input(case)
    kernel, stride, padding = case["kernel"], case["stride"], case["padding"]
    tv, ti = getattr(F, f"max_pool{nd}d")(torch.from_numpy(x), kernel, stride, padding,
                                          return_indices=True)
    size = case["shape"][2:]
    expected = getattr(F, f"max_unpool{nd}d")(tv, ti, kernel, stride, padding, output_size=size)
    y = gpupool.max_unpool(backend.to_backend(tv.numpy()), backend.to_backend(ti.numpy()), kernel,
                           stride, padding, output_size=size)
    assert_array_equal(backend.to_numpy(y), expected.numpy())
