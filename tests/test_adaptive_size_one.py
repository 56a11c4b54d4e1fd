"""adaptive_avg_pool to output size 1 sums in window order, as at every other output size: one
order, so the same bits on both backends, in both layouts and for any Dask chunking
(global_avg_pool's tree sums of values times 1/n agree to rounding only)."""
from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import gpupool as gp


def window_order_mean(x, nd: int, layout: str) -> np.ndarray:
    """The documented order (docs/semantics.md), by direct loops: in the working dtype (float32 for float16), the
    taps of each plane summed along the first spatial dim, in order, then those sums along
    the next, ...; then divided by the count."""
    acc = np.float32 if x.dtype == np.float16 else x.dtype.type
    planes = np.moveaxis(x, -1, -1 - nd) if layout == "NHWC" else x
    lead = planes.shape[:-nd]
    planes = planes.reshape((-1,) + planes.shape[-nd:]).astype(acc)
    means = []
    for plane in planes:
        cur = plane
        for _ in range(nd):  # the leading remaining dim is the next spatial dim
            total = cur[0].copy()
            for tap in cur[1:]:
                total = total + tap
            cur = total
        means.append(acc(cur) / acc(plane.size))
    out = np.array(means, acc).astype(x.dtype).reshape(lead + (1,) * nd)
    return np.moveaxis(out, -1 - nd, -1) if layout == "NHWC" else out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
# (3000,) and (3, 1500): dims longer than the NumPy backend's tap loops take
@pytest.mark.parametrize("spatial", [(29,), (7, 9), (3, 4, 5), (40, 41), (3000,), (3, 1500)])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_adaptive_avg_to_size_one_sums_in_window_order(backend, spatial, layout, dtype):
    """Regression: output size 1 took the global average's path (values times 1/n, summed
    pairwise, by BLAS or in warp trees), whose bits differ between NumPy and CUDA and
    between NCHW and NHWC."""
    nd = len(spatial)
    lead = (2, 3)
    shape = lead + spatial if layout == "NCHW" else lead[:1] + spatial + lead[1:]
    x = (np.random.default_rng(len(spatial)).standard_normal(shape) * 100).astype(dtype)
    got = backend.to_numpy(gp.adaptive_avg_pool(backend.to_backend(x), (1,) * nd,
                                                 layout=layout))
    expected = window_order_mean(x, nd, layout)
    assert_array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))


def test_adaptive_avg_to_size_one_on_dask_is_the_in_memory_result():
    da = pytest.importorskip("dask.array")
    x = np.random.default_rng(5).standard_normal((2, 3, 40, 41)).astype(np.float32)
    lazy = gp.adaptive_avg_pool(da.from_array(x, chunks=(1, 2, 15, 20)), 1)
    assert_array_equal(lazy.compute(scheduler="synchronous").view(np.uint32),
                       gp.adaptive_avg_pool(x, 1).view(np.uint32))
