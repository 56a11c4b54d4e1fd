"""The paths for small calls: the direct gather for small blocks gives the general path's
bits, the plan cache gives the uncached call's results and errors, and the CUDA host path's
timing script runs."""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpupool
from gpupool import plans
from gpupool.cpu import numpy_backend, reduce


@st.composite
def tiny_inputs(draw):
    """An input of a few planes with NaN, signed zeros and (sometimes) infinities among its
    values."""
    nd = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    spatial = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    shape = (draw(st.integers(1, 2)),) + ((draw(st.integers(1, 3)),) if layout == "NCHW"
                                          else ()) + spatial
    shape += (draw(st.integers(1, 3)),) if layout == "NHWC" else ()
    dtype = np.dtype(draw(st.sampled_from(["float16", "float32", "float64"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape).astype(dtype)
    for value in (np.nan, 0.0, -0.0) + ((np.inf, -np.inf) if draw(st.booleans()) else ()):
        x[rng.random(shape) < draw(st.sampled_from([0.0, 0.1, 0.3]))] = value
    if draw(st.booleans()):  # ties
        x = np.round(x).astype(dtype)
    return x, layout, nd


@st.composite
def calls(draw):
    """``(call, infinite)``: a pooling call on a tiny input, every op, with padding, ceil mode
    and dilation; ``infinite``: whether the input holds an infinity."""
    x, layout, nd = draw(tiny_inputs())
    return draw(_call_on(x, layout, nd)), bool(np.isinf(x).any())


@st.composite
def _call_on(draw, x, layout, nd):
    ints = lambda low, high: tuple(draw(st.integers(low, high)) for _ in range(nd))  # noqa: E731
    kernel, stride, dilation = ints(1, 4), ints(1, 3), ints(1, 2)
    padding = tuple(draw(st.integers(0, (k - 1) * d // 2)) for k, d in zip(kernel, dilation))
    ceil_mode = draw(st.booleans())
    window = dict(stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode,
                  layout=layout)
    op = draw(st.sampled_from(["max", "max indices", "avg", "lp", "adaptive avg",
                               "adaptive max", "adaptive max indices", "global avg",
                               "global max"]))
    output_size = ints(1, 5)
    if op.startswith("max"):
        return lambda: gpupool.max_pool(x, kernel, return_indices=op.endswith("indices"),
                                        **window)
    if op == "avg":
        count_include_pad = draw(st.booleans())
        divisor = draw(st.sampled_from([None, 1, 3]))
        return lambda: gpupool.avg_pool(x, kernel, count_include_pad=count_include_pad,
                                        divisor_override=divisor, **window)
    if op == "lp":
        p = draw(st.sampled_from([1.0, 2.0, 3.0, 0.5]))
        return lambda: gpupool.lp_pool(x, p, kernel, **window)
    if op.startswith("adaptive"):
        f = gpupool.adaptive_avg_pool if op == "adaptive avg" else gpupool.adaptive_max_pool
        extra = {"return_indices": True} if op.endswith("indices") else {}
        return lambda: f(x, output_size, layout=layout, **extra)
    f = gpupool.global_avg_pool if op == "global avg" else gpupool.global_max_pool
    return lambda: f(x, spatial_dims=nd, layout=layout)


def _bits(result, any_nan=False):
    """dtype, shape and bytes of each array of a result; with ``any_nan``, every NaN as one
    (a sum that meets +inf and -inf makes a NaN whose sign the order of NaN operands in
    NumPy's loops decides, on every path alike)."""
    arrays = result if isinstance(result, tuple) else (result,)
    return [(a.dtype, a.shape, (np.where(np.isnan(a), np.nan, a) if any_nan and a.dtype.kind == "f"
                                else a).tobytes()) for a in arrays]


def _uncached(call, small: bool = True, gather: bool = True):
    """``call()`` with no plan kept from before, with the small-input window path and the
    one-gather path each on or off."""
    with pytest.MonkeyPatch.context() as m:
        if not small:
            m.setattr(numpy_backend, "DIRECT_BYTES", -1)
        if not gather:
            m.setattr(reduce, "DIRECT_BYTES", -1)
        plans.clear()
        numpy_backend.prepare_window.cache_clear()
        try:
            return call()
        finally:
            plans.clear()
            numpy_backend.prepare_window.cache_clear()


@settings(max_examples=400)
@given(calls(), st.booleans())
def test_direct_paths_give_the_general_paths_bits(drawn, small):
    """Bit for bit, NaN payloads included where no infinities can make NaNs of their own: the
    small-input window path (:func:`reduce.reduce_taps`), or with it off the one-gather path
    (:func:`reduce.gather_reduce`), against neither."""
    call, infinite = drawn
    try:
        fast = _uncached(call, small=small)
    except ValueError:  # an output size below 1
        return
    general = _uncached(call, small=False, gather=False)
    assert _bits(fast, infinite) == _bits(general, infinite)


def test_small_inputs_take_the_direct_paths_and_large_ones_do_not(monkeypatch):
    seen = []
    for module, name in ((reduce, "gather_reduce"), (numpy_backend, "gather_reduce"),
                         (numpy_backend, "reduce_taps")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, name=name, f=original:
                            seen.append((name, a[0].nbytes)) or f(*a))
    plans.clear()
    numpy_backend.prepare_window.cache_clear()
    gpupool.max_pool(np.ones((1, 4, 8, 8), np.float32), 2)
    gpupool.avg_pool(np.ones((1, 4, 8, 8), np.float32), 3, 2, 1)
    gpupool.adaptive_avg_pool(np.ones((1, 4, 8, 8), np.float32), (3, 3))
    assert seen == [("reduce_taps", 1024), ("reduce_taps", 1024), ("gather_reduce", 1024)]
    gpupool.avg_pool(np.ones((1, 64, 64, 64), np.float32), 2)  # too many bytes
    gpupool.max_pool(np.ones((1, 1, 40, 40), np.float32), 20, 1)  # many taps: small all the same
    gpupool.lp_pool(np.ones((1, 4, 8, 8), np.float32), 2, 2)  # Lp: the gather
    assert seen[3:] == [("reduce_taps", 6400), ("gather_reduce", 1024)]


def test_cached_call_matches_a_fresh_one_and_keeps_its_errors():
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    first = gpupool.avg_pool(x, 3, 2, 1)
    plans._plans.clear()
    assert _bits(gpupool.avg_pool(x, 3, 2, 1)) == _bits(first)
    assert _bits(gpupool.avg_pool(x, 3, 2, 1)) == _bits(first)  # warm: from the cache
    with pytest.raises(TypeError, match=r"gpupool.avg_pool: kernel_size=3.0 must be an int"):
        gpupool.avg_pool(x, 3.0, 2, 1)
    with pytest.raises(TypeError, match=r"gpupool.avg_pool: ceil_mode=1 must be a bool"):
        gpupool.avg_pool(x, 3, 2, 1, 1)
    with pytest.raises(ValueError, match=r"gpupool.avg_pool: padding=-1 must be >= 0"):
        gpupool.avg_pool(x, 3, 2, -1)
    with pytest.raises(ValueError, match=r"gpupool.avg_pool: padding=-1 must be >= 0"):
        gpupool.avg_pool(x, 3, 2, -1)  # a failed call stores nothing
    assert len(plans._plans) == 1


def test_cache_keys_hold_argument_types_and_odd_arguments_bypass_it():
    plans._plans.clear()
    x = np.ones((1, 1, 4, 4), np.float32)
    gpupool.max_pool(x, 2)
    gpupool.max_pool(x, (2, 2))
    gpupool.max_pool(x, [2, 2])
    assert len(plans._plans) == 3
    gpupool.max_pool(x, np.int64(2))  # a NumPy int: validated on every call, not cached
    gpupool.max_pool(x, 2, padding=np.array(0))
    assert len(plans._plans) == 3
    with pytest.raises(TypeError, match="must be an int"):
        gpupool.max_pool(x, (2, True))


def test_cache_is_bounded_and_keyed_by_input_strides_and_threads(monkeypatch):
    plans._plans.clear()
    monkeypatch.setattr(plans, "CACHE_SIZE", 3)
    for n in range(1, 6):
        gpupool.max_pool(np.ones((n, 1, 4, 4), np.float32), 2)
    assert len(plans._plans) == 3
    assert sorted(key[2][0] for key in plans._plans) == [3, 4, 5]  # the latest kept
    plans._plans.clear()
    x = np.ones((2, 4, 4, 4), np.float32)
    gpupool.max_pool(x, 2)
    gpupool.max_pool(x[:, ::2], 2)
    threads = gpupool.get_num_threads()
    try:
        gpupool.set_num_threads(threads + 1)
        gpupool.max_pool(x, 2)
    finally:
        gpupool.set_num_threads(threads)
    assert len(plans._plans) == 3


def test_cached_calls_from_many_threads_agree():
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 4, 5 + i % 3, 8)).astype(np.float32) for i in range(12)]
    want = [_bits(gpupool.lp_pool(x, 2, 3, 2, 1, ceil_mode=True)) for x in inputs]
    plans._plans.clear()
    got = [None] * len(inputs)

    def work(i):
        for _ in range(20):
            got[i] = _bits(gpupool.lp_pool(inputs[i], 2, 3, 2, 1, ceil_mode=True))
    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert got == want


def test_host_time_script_times_every_op_with_launches_stubbed():
    """``bench/host.py`` (the host-path figures of docs/performance.md) runs, without a GPU or a compiler,
    and prints a time for each op."""
    script = Path(__file__).resolve().parent.parent / "bench" / "host.py"
    done = subprocess.run([sys.executable, str(script), "--calls", "3", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    timed = [line for line in done.stdout.splitlines() if line.endswith(" us")]
    assert len(timed) == 15 and any("int8 global avg" in line for line in timed), done.stdout
    assert any("max unpool 2x2" in line for line in timed), done.stdout
