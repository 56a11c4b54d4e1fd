"""The CUDA backend's host code: how it compiles, caches and launches, devices and streams.

Runs on real CuPy with a GPU, else on the CPU executor (tests/cudacpu). Tests that inspect the
executor's record of compiles need it; tests needing two devices skip with one.
"""
from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import conftest
import gpupool
import reference as ref
from gpupool import quantized as Q
from gpupool.cuda.names import FAMILY_FILES

pytestmark = pytest.mark.gpu
executor_only = pytest.mark.skipif(conftest.GPU_RUNTIME != "executor",
                                   reason="inspects the CPU executor's compile record")


@pytest.fixture
def cupy():
    import cupy
    return cupy


def _two_devices(cupy):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two devices")


@executor_only
def test_kernels_are_compiled_without_flush_to_zero(cupy):
    """CuPy's RawModule appends -ftz=true (float32 subnormals become 0 on the GPU); the
    backend compiles through NVRTC itself, asking for IEEE float32. Every compile of the
    backend's kernels in this process is checked (other tests compile kernels of their own)."""
    gpupool.avg_pool(cupy.asarray(np.ones((1, 1, 5, 5), np.float32)), 5, padding=2,
                     count_include_pad=True)
    backend_compiles = [options for options, names in cupy.calls
                        if names and all(n.split("<", 1)[0] in FAMILY_FILES for n in names)]
    assert backend_compiles
    for options in backend_compiles:
        normalised = [o.replace("--", "-") for o in options]
        assert "-ftz=false" in normalised and "-ftz=true" not in normalised, options


def test_float32_subnormals_are_kept(cupy):
    """Max over subnormals picks the right element and index; averages and Lp of subnormal
    values are not flushed to zero (they were under CuPy's -ftz=true)."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    x = (np.arange(1, 2 * 3 * 6 * 6 + 1, dtype=np.float32) % 97 * tiny).reshape(2, 3, 6, 6)
    x[0, 0, 0, 0] = -5 * tiny
    xg = cupy.asarray(x)
    values, indices = gpupool.max_pool(xg, 2, return_indices=True)
    ev, ei = ref.max_pool(x, 2, 2, 0, 1, False, "NCHW")
    assert_array_equal(values.get(), ev.astype(np.float32))
    assert_array_equal(indices.get(), ei)
    # atol: the rounding of a subnormal result, and in the global mean one per term (each
    # value times 1/36 lands on the subnormal grid)
    for got, expected, roundings in (
            (gpupool.avg_pool(xg, 3, 1, 1), ref.avg_pool(x, 3, 1, 1), 1),
            (gpupool.lp_pool(xg, 1, 2), ref.lp_pool(x, 1, 2), 1),
            (gpupool.global_avg_pool(xg), ref.global_avg_pool(x, 2, "NCHW"), 36)):
        got = got.get()
        assert (got != 0).all() and np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=roundings * float(tiny))


@executor_only
def test_a_new_process_loads_compiled_kernels_from_disk(cupy, monkeypatch):
    """The compiled image is kept on disk: with the in-process memos empty (as in a new
    process), the same op does not compile again."""
    from gpupool.cuda import kernels, launching
    x = cupy.asarray(np.ones((1, 2, 9, 9), np.float64))
    gpupool.max_pool(x, (2, 3), 2)
    for memo in (kernels.kernel, kernels.load_module):
        memo.cache_clear()
    launching.clear_launches()
    before = len(cupy.calls)
    assert_array_equal(gpupool.max_pool(x, (2, 3), 2).get(), np.ones((1, 2, 4, 4)))
    assert len(cupy.calls) == before


def test_warm_calls_run_on_the_input_device_whichever_is_current(cupy):
    """The plan cache is not keyed by device: a warm call with an input on another device than
    the current one (and than the first call's) still runs there and returns its result there,
    for the float ops (values and indices) and the quantized ones; the current device is
    left as it was."""
    _two_devices(cupy)
    x = np.arange(2 * 4 * 8 * 8, dtype=np.float32).reshape(2, 4, 8, 8) % 13
    q = np.arange(2 * 4 * 8 * 8).reshape(2, 4, 8, 8).astype(np.int8)
    expected = [gpupool.max_pool(x, 2, return_indices=True), gpupool.avg_pool(x, 3, 2, 1),
                Q.max_pool(Q.QArray(q, 0.5), 2).data, Q.avg_pool(Q.QArray(q, 0.5), 2).data,
                Q.adaptive_avg_pool(Q.QArray(q, 0.5), 3).data]
    for home, current in ((0, 0), (1, 0), (0, 1), (1, 1)):
        with cupy.cuda.Device(home):
            xg, qg = cupy.asarray(x), Q.QArray(cupy.asarray(q), 0.5)
        with cupy.cuda.Device(current):
            got = [gpupool.max_pool(xg, 2, return_indices=True), gpupool.avg_pool(xg, 3, 2, 1),
                   Q.max_pool(qg, 2).data, Q.avg_pool(qg, 2).data,
                   Q.adaptive_avg_pool(qg, 3).data]
            assert cupy.cuda.runtime.getDevice() == current
        flat = [a for r in got for a in (r if isinstance(r, tuple) else (r,))]
        assert all(a.device.id == home for a in flat), (home, current)
        want = [a for r in expected for a in (r if isinstance(r, tuple) else (r,))]
        for a, e in zip(flat, want):
            assert_array_equal(a.get(), e)


def test_max_unpool_runs_on_the_input_device(cupy):
    """Regression: max_unpool checked the index range on the current device, before entering
    the input's device, and never checked that indices lives on the input's device."""
    _two_devices(cupy)
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    with cupy.cuda.Device(1):
        y, i = gpupool.max_pool(cupy.asarray(x), 2, return_indices=True)
    with cupy.cuda.Device(0):
        up = gpupool.max_unpool(y, i, 2)
        assert up.device == y.device
        expected = np.where(np.isin(np.arange(16), [5, 7, 13, 15]), np.arange(16), 0)
        assert_array_equal(up.get().reshape(-1), expected)
        i0 = cupy.asarray(i.get())
        with pytest.raises(ValueError, match="gpupool.max_unpool: indices is on device"):
            gpupool.max_unpool(y, i0, 2)


def test_requantization_table_is_ready_on_every_stream(cupy):
    """Regression: the table of a quantized average was uploaded on the first caller's stream
    and reused from others unordered (a race on a GPU; the executor refuses it)."""
    x = np.random.default_rng(3).integers(-128, 128, (2, 3, 8, 8)).astype(np.int8)
    expected = Q.avg_pool(Q.QArray(x, 0.031, 3), 3, 2, 1, out_scale=0.047).data
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    results = []
    for stream in (first, second):
        with stream:
            q = Q.QArray(cupy.asarray(x), 0.031, 3)
            results.append((stream, Q.avg_pool(q, 3, 2, 1, out_scale=0.047).data))
    for stream, got in results:
        stream.synchronize()
        assert_array_equal(cupy.asnumpy(got, stream=stream), expected)


def test_quantized_nhwc_global_average_spreads_positions_over_threads(cupy, monkeypatch):
    """Regression: one thread per (batch row, channel) summed every position: (1, 224, 224,
    3) ran 3 threads reading 50,176 codes each."""
    from gpupool.cuda import kernels
    launches, real = [], kernels.kernel

    def spy(name):
        fn = real(name)
        return lambda grid, block, args: (launches.append((name, grid, block)),
                                          fn(grid, block, args))
    monkeypatch.setattr(kernels, "kernel", spy)
    x = np.random.default_rng(5).integers(-128, 128, (1, 224, 224, 3)).astype(np.int8)
    got = Q.global_avg_pool(Q.QArray(cupy.asarray(x), 0.1, 4), layout="NHWC").data
    expected = Q.global_avg_pool(Q.QArray(x, 0.1, 4), layout="NHWC").data
    assert_array_equal(cupy.asnumpy(got), expected)
    assert [name.split("<")[0] for name, _, _ in launches] == ["qavg_global_channels"] * 2
    assert all(np.prod(block) >= 64 for _, _, block in launches), launches
