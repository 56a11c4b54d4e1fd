"""What the NumPy backend keeps between calls is small: memos of the arrays it derives from a
spec or a shape are bounded in bytes, and a large call leaves nothing large behind."""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

import gpupool as gp
from gpupool import quantized as Q
from gpupool.cpu import memo

LARGE = (1, 1, 2048, 2048)  # 4 Mi input positions
MiB = 1 << 20


@pytest.mark.parametrize("name, op, dtype", [
    ("max_pool with indices", lambda x: gp.max_pool(x, 2, return_indices=True), np.uint8),
    ("max_pool with indices, 8-byte", lambda x: gp.max_pool(x, 2, return_indices=True),
     np.float64),
    ("avg_pool padded", lambda x: gp.avg_pool(x, 3, 1, 1), np.float32),
    ("global_avg_pool", gp.global_avg_pool, np.float32),
    ("adaptive_avg_pool", lambda x: gp.adaptive_avg_pool(x, (500, 700)), np.float32),
    ("quantized avg_pool padded", lambda x: Q.avg_pool(Q.QArray(x, 1.0), 3, 1, 1), np.uint8),
    ("quantized adaptive_avg_pool", lambda x: Q.adaptive_avg_pool(Q.QArray(x, 1.0),
                                                                  (1000, 2000)), np.uint8),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_large_call_leaves_little_behind(name, op, dtype):
    """Regression: max_pool(..., return_indices=True) kept 8 bytes per input position for each
    of up to 64 plane shapes (32 MiB after this call, 513 MiB after an 8192 x 8192 one);
    padded averages kept a divisor per output position and global averages a weight per
    input position, and quantized averages (in up to 256 requantization plans) a table row
    and a tap count per output position, whatever the size. What stays (tracemalloc, which
    sees NumPy's buffers) must be under 2 bytes per input position: the memos' and the
    per-thread scratch buffers' bounds."""
    op(np.zeros((1, 1, 9, 9), dtype))  # first-call set-up outside the measure
    x = np.zeros(LARGE, dtype)
    kept = memo.memo_bytes()  # other tests' entries, each memo within its bound
    tracemalloc.start()
    try:
        result = op(x)
        del result
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 2 * x.size, f"{name}: {held / MiB:.1f} MiB kept"
    assert memo.memo_bytes() - kept <= 4 * MiB


def test_an_array_memo_keeps_at_most_its_bytes_least_recent_out_first():
    built = []

    def build(n):
        built.append(n)
        return np.zeros(n, np.uint8), (np.zeros(n, np.uint8), "not an array")

    cache = memo.ArrayMemo(build, max_entries=3, max_bytes=1000)
    assert memo.held_bytes(cache(100)) == 200 and cache.nbytes == 200
    cache(300)
    assert cache.nbytes == 800
    cache(100)  # a hit: 100 is now the most recent
    assert built == [100, 300]
    cache(200)  # 1200 bytes: 300, the least recent, goes
    assert cache.nbytes == 600
    cache(100)
    cache(300)
    assert built == [100, 300, 200, 300]
    assert cache(600)[0].size == 600 and cache.nbytes <= 1000  # larger than the bound: not kept
    cache(600)
    assert built[-2:] == [600, 600]
    for n in (1, 2, 3, 4):  # and at most max_entries entries
        cache(n)
    assert len(cache) == 3


@pytest.mark.gpu
def test_quantized_averages_leave_no_device_rows_behind():
    """Regression: a quantized average on a GPU kept its plan's table row per output position
    on the device (4 bytes each, in up to 256 plans per device and in the prepared launches),
    whatever the size: 8 MiB after this call. What stays in CuPy's pool must be within the
    memo's bound."""
    import cupy
    pool, before = cupy.get_default_memory_pool(), cupy.cuda.get_allocator()
    try:
        cupy.cuda.set_allocator(pool.malloc)
        q = Q.QArray(cupy.zeros((1, 1, 1024, 2048), np.uint8), 1.0)
        Q.avg_pool(Q.QArray(cupy.zeros((1, 1, 9, 9), np.uint8), 1.0), 3, 1, 1)  # set-up
        used = pool.used_bytes()
        result = Q.avg_pool(q, 3, 1, 1)
        assert result.data.shape == q.data.shape
        del result
        assert pool.used_bytes() - used <= 4 * MiB
    finally:
        cupy.cuda.set_allocator(before)
