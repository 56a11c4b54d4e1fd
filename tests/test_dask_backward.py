"""The backward ops on Dask arrays equal the in-memory op on the whole arrays bit for bit,
for any chunking (zero-size chunks, spatial chunks smaller than a window, uneven chunks,
chunked planes); arguments are validated when the graph is built, with the in-memory op's
errors; indices are checked when computed; nothing is computed before ``compute``."""
from __future__ import annotations

import re

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask  # noqa: E402
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numpy.testing import assert_array_equal  # noqa: E402

cloudpickle = pytest.importorskip("cloudpickle")

import gpupool  # noqa: E402

MAX_SIZE = {1: 14, 2: 9, 3: 5}


# ----------------------------------------------------------------------------- helpers

def same_bits(actual, expected):
    """Equal bit for bit: signed zeros and NaN payloads too."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    unsigned = f"u{actual.dtype.itemsize}"
    assert_array_equal(np.asarray(actual).view(unsigned), np.asarray(expected).view(unsigned))


def compute(result, scheduler="synchronous"):
    assert isinstance(result, da.Array) and type(result._meta) is np.ndarray
    return result.compute(scheduler=scheduler)


@st.composite
def chunkings(draw, shape):
    """Random chunks for ``shape``: cut points per dim, repeats giving zero-size chunks."""
    chunks = []
    for n in shape:
        cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
        bounds = [0] + cuts + [n]
        chunks.append(tuple(b - a for a, b in zip(bounds, bounds[1:])))
    return tuple(chunks)


@st.composite
def inputs(draw, nd, dtypes=("float32", "float64", "float16"), nan=True):
    """``(x, layout)``: a random float input, sometimes rounded (ties), zeros and NaN."""
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    lead = tuple(draw(st.integers(1, 2)) for _ in range(draw(st.integers(0, 2))))
    lead = lead[:1] if nd == 3 else lead
    spatial = tuple(draw(st.integers(1, MAX_SIZE[nd])) for _ in range(nd))
    shape = lead + spatial + ((draw(st.integers(1, 3)),) if layout == "NHWC" else ())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape).astype(draw(st.sampled_from(dtypes)))
    if draw(st.booleans()):
        x = np.round(x)
    if nan and draw(st.integers(0, 3)) == 0:
        x[rng.random(shape) < 0.1] = np.nan
    return x, layout


def grad_like(shape, dtype, seed):
    """A random gradient with signed zeros."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(shape).astype(dtype)
    g[rng.random(shape) < 0.1] = -0.0
    return g


def per_dim(draw, strategy, nd):
    return draw(strategy) if draw(st.booleans()) else tuple(draw(strategy) for _ in range(nd))


@st.composite
def window_args(draw, nd):
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    form = draw(st.sampled_from(["int", "pairs", "valid", "same", "same_lower", "big"]))
    padding = {"int": lambda: draw(st.integers(0, 2)),
               "pairs": lambda: tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3)))
                                      for _ in range(nd)),
               "big": lambda: tuple((draw(st.integers(0, 7)), draw(st.integers(0, 7)))
                                    for _ in range(nd))}.get(form, lambda: form)()
    stride = draw(st.none() | st.integers(1, 5) | st.tuples(*[st.integers(1, 5)] * nd))
    return dict(kernel_size=kernel, stride=stride, padding=padding,
                dilation=per_dim(draw, st.integers(1, 3), nd), ceil_mode=draw(st.booleans()))


def dask_of(a, chunks):
    return da.from_array(a, chunks=chunks)


# ----------------------------------------------------------------------------- window ops

@settings(max_examples=120)
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("op", ["max", "avg", "lp"])
@given(data=st.data())
def test_window_backward_matches_whole_array(data, nd, op):
    x, layout = data.draw(inputs(nd, ("float32", "float64") if op == "lp" else
                                 ("float32", "float64", "float16")))
    args = data.draw(window_args(nd))
    if op == "max":
        try:
            y, indices = gpupool.max_pool(x, layout=layout, return_indices=True, **args)
        except ValueError:
            assume(False)
    else:
        try:
            y = gpupool.avg_pool(x, layout=layout, **args)
        except ValueError:
            assume(False)
    g = grad_like(y.shape, x.dtype, data.draw(st.integers(0, 2**32 - 1)))
    dg = dask_of(g, data.draw(chunkings(g.shape)))
    if op == "max":
        expected = gpupool.max_pool_backward(g, indices, x.shape, layout=layout, **args)
        result = gpupool.max_pool_backward(dg, dask_of(indices, data.draw(chunkings(g.shape))),
                                           x.shape, layout=layout, **args)
    elif op == "lp":
        p = data.draw(st.sampled_from([1.0, 2.0, 3.0, 1.5]))
        expected = gpupool.lp_pool_backward(g, x, p, layout=layout, **args)
        result = gpupool.lp_pool_backward(dg, dask_of(x, data.draw(chunkings(x.shape))), p,
                                          layout=layout, **args)
    else:
        options = dict(count_include_pad=data.draw(st.booleans()),
                       divisor_override=data.draw(st.none() | st.integers(1, 7)))
        expected = gpupool.avg_pool_backward(g, x.shape, layout=layout, **options, **args)
        result = gpupool.avg_pool_backward(dg, x.shape, layout=layout, **options, **args)
    same_bits(compute(result), expected)


@pytest.mark.parametrize("chunks", [
    1,  # spatial chunks smaller than the windows
    (2, 3, (3, 5, 8), (7, 9)),  # uneven
    (1, 1, 16, 16),  # chunked planes, whole spatial dims
    (2, (1, 3), 9, (3, 13)),
])
def test_resnet_stem_backward_with_halos(chunks):
    """The stem's max 3x3 s2 p1 and an avg with overlapping windows: every block holds all of
    the windows of its positions."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 32, 32)).astype(np.float32)
    y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
    g = grad_like(y.shape, np.float32, 2)
    dg, di = dask_of(g, chunks), dask_of(indices, chunks)
    result = gpupool.max_pool_backward(dg, di, x.shape, 3, 2, 1)
    same_bits(compute(result), gpupool.max_pool_backward(g, indices, x.shape, 3, 2, 1))
    for options in ({}, {"count_include_pad": True}, {"divisor_override": 4}):
        result = gpupool.avg_pool_backward(dg, x.shape, 3, 2, 1, **options)
        same_bits(compute(result, "threads"),
                  gpupool.avg_pool_backward(g, x.shape, 3, 2, 1, **options))


@pytest.mark.parametrize("chunks", [1, 2, (1, 2, (4, 1, 6))])
def test_lp_backward_where_blocks_reach_past_their_windows(chunks):
    """Strides longer than the windows leave positions no window covers, whose gradient is
    +0 whatever x holds there (negative, NaN): the block's windows grow until their slice
    holds the whole block."""
    x = np.array([[-1.0, 2.0, -0.0, np.nan, -3.0, 0.5, -2.0, 4.0, -5.0, np.nan, 1.0]],
                 np.float32)[None].repeat(2, axis=1)
    for p, kernel, stride, padding in [(3.0, 1, 3, 0), (2.0, 2, 4, 1), (1.5, (2,), (5,), 2)]:
        y = gpupool.lp_pool(x, p, kernel, stride, padding)
        g = grad_like(y.shape, np.float32, 3)
        expected = gpupool.lp_pool_backward(g, x, p, kernel, stride, padding)
        assert not np.signbit(expected[expected == 0]).any()
        result = gpupool.lp_pool_backward(dask_of(g, 1), dask_of(x, chunks), p, kernel, stride,
                                          padding)
        assert result.chunks == dask_of(x, chunks).chunks
        same_bits(compute(result), expected)


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_max_backward_of_a_lone_window_in_a_block_keeps_the_sum_from_plus_zero(chunks):
    """Overlapping windows: the whole op sums each position's gradients from +0, so a -0
    gradient gives +0; a block that holds a single window gives the same."""
    x = np.array([[[5.0, 1.0, 0.0, 2.0, 3.0, -1.0, 4.0]]], np.float32)
    y, indices = gpupool.max_pool(x, (3,), (2,), return_indices=True)
    g = np.full(y.shape, -0.0, np.float32)
    expected = gpupool.max_pool_backward(g, indices, x.shape, (3,), (2,))
    assert not np.signbit(expected).any()
    result = gpupool.max_pool_backward(dask_of(g, chunks), dask_of(indices, chunks), x.shape,
                                       (3,), (2,))
    same_bits(compute(result), expected)
    disjoint = gpupool.max_pool_backward(dask_of(g, chunks), dask_of(indices, chunks),
                                         x.shape, (3,), (3,), ceil_mode=True)
    same_bits(compute(disjoint), gpupool.max_pool_backward(g, indices, x.shape, (3,), (3,),
                                                           ceil_mode=True))


# ----------------------------------------------------------------------------- adaptive and global

@settings(max_examples=150)
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("op", ["max", "avg"])
@given(data=st.data())
def test_adaptive_backward_matches_whole_array(data, nd, op):
    x, layout = data.draw(inputs(nd))
    spatial = x.shape[-nd - 1:-1] if layout == "NHWC" else x.shape[-nd:]
    output_size = tuple(data.draw(st.integers(1, n + 3)) for n in spatial)
    g = grad_like(gpupool.adaptive_avg_pool(x, output_size, layout=layout).shape, x.dtype,
                  data.draw(st.integers(0, 2**32 - 1)))
    dg = dask_of(g, data.draw(chunkings(g.shape)))
    if op == "max":
        _, indices = gpupool.adaptive_max_pool(x, output_size, return_indices=True,
                                               layout=layout)
        di = dask_of(indices, data.draw(chunkings(g.shape)))
        expected = gpupool.adaptive_max_pool_backward(g, indices, x.shape, output_size,
                                                      layout=layout)
        result = gpupool.adaptive_max_pool_backward(dg, di, x.shape, output_size, layout=layout)
    else:
        expected = gpupool.adaptive_avg_pool_backward(g, x.shape, output_size, layout=layout)
        result = gpupool.adaptive_avg_pool_backward(dg, x.shape, output_size, layout=layout)
    same_bits(compute(result), expected)


def test_adaptive_blocks_are_whole_periods():
    """224 -> 7 has a period of one window of 32: the blocks follow grad_output's chunks; 10 -> 4
    has a period of 2 windows over 5 positions."""
    g = grad_like((1, 2, 7, 4), np.float32, 4)
    result = gpupool.adaptive_avg_pool_backward(dask_of(g, (1, 1, (2, 5), (2, 2))),
                                                (1, 2, 224, 10), (7, 4))
    assert result.chunks == ((1,), (1, 1), (64, 160), (5, 5))
    same_bits(compute(result), gpupool.adaptive_avg_pool_backward(g, (1, 2, 224, 10), (7, 4)))


@settings(max_examples=80)
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("op", ["max", "avg"])
@given(data=st.data())
def test_global_backward_matches_whole_array(data, nd, op):
    x, layout = data.draw(inputs(nd))
    g = grad_like(gpupool.global_avg_pool(x, spatial_dims=nd, layout=layout).shape, x.dtype,
                  data.draw(st.integers(0, 2**32 - 1)))
    dg = dask_of(g, data.draw(chunkings(g.shape)))
    if op == "max":
        dx = dask_of(x, data.draw(chunkings(x.shape)))
        expected = gpupool.global_max_pool_backward(g, x, spatial_dims=nd, layout=layout)
        result = gpupool.global_max_pool_backward(dg, dx, spatial_dims=nd, layout=layout)
        assert result.chunks == dx.chunks
    else:
        expected = gpupool.global_avg_pool_backward(g, x.shape, spatial_dims=nd, layout=layout)
        result = gpupool.global_avg_pool_backward(dg, x.shape, spatial_dims=nd, layout=layout)
    same_bits(compute(result), expected)


# ----------------------------------------------------------------------------- errors, laziness

def poisoned(a, chunks):
    """A Dask array of ``a``'s shape and dtype whose every block raises when computed."""
    def explode(block):
        raise AssertionError("a block was computed")
    return da.from_array(a, chunks=chunks).map_blocks(explode, dtype=a.dtype)


def backward_calls(g, indices, x, gg):
    """Every backward op on ``g`` (a 3x3 s2 p1 pooling of ``x``'s 2x2 blocks), ``indices``,
    ``x`` and ``gg`` (a global pooling's gradient)."""
    shape = (1, 2, 8, 8)
    return [gpupool.max_pool_backward(g, indices, shape, 3, 2, 1),
            gpupool.avg_pool_backward(g, shape, 3, 2, 1),
            gpupool.lp_pool_backward(g, x, 2.0, 3, 2, 1),
            gpupool.adaptive_avg_pool_backward(g, shape, (4, 4)),
            gpupool.adaptive_max_pool_backward(g, indices, shape, (4, 4)),
            gpupool.global_avg_pool_backward(gg, shape),
            gpupool.global_max_pool_backward(gg, x)]


def test_graphs_are_lazy_and_picklable():
    x = np.zeros((1, 2, 8, 8), np.float32)
    g, indices = np.zeros((1, 2, 4, 4), np.float32), np.zeros((1, 2, 4, 4), np.int64)
    results = backward_calls(poisoned(g, 2), poisoned(indices, 3), poisoned(x, 3),
                             poisoned(np.zeros((1, 2, 1, 1), np.float32), 1))
    for r in results:
        assert isinstance(r, da.Array) and r.shape == x.shape and r.dtype == np.float32
        cloudpickle.dumps(dict(r.__dask_graph__()))
    with pytest.raises(AssertionError, match="a block was computed"):
        results[0].compute(scheduler="synchronous")


def test_validation_is_eager_with_the_in_memory_errors():
    x = np.zeros((1, 2, 8, 8), np.float32)
    g, indices = np.zeros((1, 2, 4, 4), np.float32), np.zeros((1, 2, 4, 4), np.int64)
    bad = [lambda g, i, x: gpupool.max_pool_backward(g, i, (1, 2, 9, 9), 3, 2, 1),
           lambda g, i, x: gpupool.max_pool_backward(g, i[..., :3], (1, 2, 8, 8), 3, 2, 1),
           lambda g, i, x: gpupool.max_pool_backward(g, i.astype(np.float32), (1, 2, 8, 8), 2),
           lambda g, i, x: gpupool.avg_pool_backward(g.astype(np.int32), (1, 2, 8, 8), 2),
           lambda g, i, x: gpupool.avg_pool_backward(g, [1, 2, 8.5, 8], 2),
           lambda g, i, x: gpupool.avg_pool_backward(g, (1, 2, 8, 8), 2, padding="bogus"),
           lambda g, i, x: gpupool.lp_pool_backward(g, x[..., :7], 2.0, 2),
           lambda g, i, x: gpupool.lp_pool_backward(g, x.astype(np.float64), 2.0, 2),
           lambda g, i, x: gpupool.lp_pool_backward(g, x, -1.0, 2),
           lambda g, i, x: gpupool.adaptive_avg_pool_backward(g, (1, 2, 8, 8), (4, 3)),
           lambda g, i, x: gpupool.adaptive_max_pool_backward(g, i, (1, 2, 8, 8), (0, 4)),
           lambda g, i, x: gpupool.global_avg_pool_backward(g, (1, 2, 8, 8)),
           lambda g, i, x: gpupool.global_max_pool_backward(g, x, spatial_dims=3)]
    for call in bad:
        with pytest.raises((ValueError, TypeError)) as in_memory:
            call(g, indices, x)
        with pytest.raises(type(in_memory.value)) as lazy:
            call(poisoned(g, 2), poisoned(indices, 3), poisoned(x, 3))
        assert str(lazy.value) == str(in_memory.value)


def test_operands_must_all_be_dask_arrays_and_out_is_refused():
    x = np.zeros((1, 2, 8, 8), np.float32)
    g, indices = np.zeros((1, 2, 4, 4), np.float32), np.zeros((1, 2, 4, 4), np.int64)
    dg = dask_of(g, 2)
    with pytest.raises(TypeError, match=r"gpupool\.max_pool_backward: indices is a "
                                        r"numpy\.ndarray but grad_output is a Dask array"):
        gpupool.max_pool_backward(dg, indices, x.shape, 2)
    with pytest.raises(TypeError, match=r"gpupool\.lp_pool_backward: x is a numpy\.ndarray"):
        gpupool.lp_pool_backward(dg, x, 2.0, 2)
    with pytest.raises(TypeError, match=r"gpupool\.global_max_pool_backward: x is a"):
        gpupool.global_max_pool_backward(dask_of(np.zeros((1, 2, 1, 1), np.float32), 1), x)
    with pytest.raises(TypeError, match=r"gpupool\.adaptive_max_pool_backward: indices is a"):
        gpupool.adaptive_max_pool_backward(dg, list(indices), x.shape, (4, 4))
    with pytest.raises(TypeError, match=r"gpupool\.avg_pool_backward: out .*immutable"):
        gpupool.avg_pool_backward(dg, x.shape, 2, out=np.empty_like(x))
    unknown = dask_of(indices, 2)[dask_of(indices, 2)[:, 0, 0, 0] >= 0]
    with pytest.raises(ValueError, match=r"max_pool_backward: indices has unknown chunk sizes"):
        gpupool.max_pool_backward(dg, unknown, x.shape, 2)
    with pytest.raises(ValueError, match=r"avg_pool_backward: grad_output has unknown chunk"):
        gpupool.avg_pool_backward(dg[dg[:, 0, 0, 0] >= 0], x.shape, 2)


@pytest.mark.parametrize("adaptive", [False, True])
def test_indices_are_checked_when_computed(adaptive):
    """An index outside its window, or outside the plane, raises the in-memory op's error on
    the block that holds it; -1 passes nothing."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 2, 12, 12)).astype(np.float32)
    if adaptive:
        y, indices = gpupool.adaptive_max_pool(x, (6, 6), return_indices=True)

        def backward(g, i):
            return gpupool.adaptive_max_pool_backward(g, i, x.shape, (6, 6))
    else:
        y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)

        def backward(g, i):
            return gpupool.max_pool_backward(g, i, x.shape, 3, 2, 1)
    g = grad_like(y.shape, np.float32, 9)
    skipped = indices.copy()
    skipped[0, 1, 2, 3] = -1
    same_bits(compute(backward(dask_of(g, 2), dask_of(skipped, 3))), backward(g, skipped))
    for value, message in [(0, "outside the pooling window of its position"),
                           (144, r"indices span \[.*outside the input plane"),
                           (-2, r"indices span \[-2, ")]:
        wrong = indices.copy()
        wrong[0, 1, 5, 4] = value
        with pytest.raises(ValueError, match=message) as in_memory:
            backward(g, wrong)
        with pytest.raises(ValueError, match=message) as lazy:
            compute(backward(dask_of(g, 2), dask_of(wrong, 3)))
        span = re.compile(r"span \[-?\d+, ")  # the smallest index: the block's
        assert span.sub("", str(lazy.value)) == span.sub("", str(in_memory.value))


def test_byte_swapped_operands_give_the_native_dtype():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
    g = grad_like(y.shape, np.float32, 11)
    swapped = dask_of(g.astype(">f4"), 2)
    for result, expected in [
            (gpupool.max_pool_backward(swapped, dask_of(indices.astype(">i8"), 3), x.shape, 3,
                                       2, 1),
             gpupool.max_pool_backward(g, indices, x.shape, 3, 2, 1)),
            (gpupool.lp_pool_backward(swapped, dask_of(x.astype(">f4"), 4), 2.0, 3, 2, 1),
             gpupool.lp_pool_backward(g, x, 2.0, 3, 2, 1))]:
        assert result.dtype == np.float32 and result.dtype.isnative
        same_bits(compute(result), expected)


def test_threaded_scheduler_large_blocks():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 130, 97)).astype(np.float32)
    y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
    g = grad_like(y.shape, np.float32, 13)
    dg, di, dx = dask_of(g, (1, 2, 17, 20)), dask_of(indices, (2, 3, 30, 11)), \
        dask_of(x, (1, 2, 33, 40))
    got = dask.compute(gpupool.max_pool_backward(dg, di, x.shape, 3, 2, 1),
                       gpupool.avg_pool_backward(dg, x.shape, 3, 2, 1, count_include_pad=True),
                       gpupool.lp_pool_backward(dg, dx, 2.0, 3, 2, 1), scheduler="threads")
    expected = (gpupool.max_pool_backward(g, indices, x.shape, 3, 2, 1),
                gpupool.avg_pool_backward(g, x.shape, 3, 2, 1, count_include_pad=True),
                gpupool.lp_pool_backward(g, x, 2.0, 3, 2, 1))
    for a, e in zip(got, expected):
        same_bits(a, e)


# ----------------------------------------------------------------------------- CuPy chunks

@pytest.mark.gpu
def test_cupy_chunks_run_on_the_gpu_and_stay_cupy():
    """CuPy blocks run the CuPy backward ops: the same bits as the in-memory CuPy op on the
    whole arrays."""
    import cupy
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 2, 20, 18)).astype(np.float32)
    y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
    g = grad_like(y.shape, np.float32, 15)
    gg = grad_like((1, 2, 1, 1), np.float32, 16)

    def on_gpu(a, chunks):
        return dask_of(a, chunks).map_blocks(cupy.asarray)
    dg, di, dx = on_gpu(g, (1, 1, 4, 3)), on_gpu(indices, (1, 2, 3, 9)), on_gpu(x, (1, 1, 7, 9))
    results = [gpupool.max_pool_backward(dg, di, x.shape, 3, 2, 1),
               gpupool.avg_pool_backward(dg, x.shape, 3, 2, 1, count_include_pad=True),
               gpupool.adaptive_avg_pool_backward(dg, x.shape, y.shape[2:]),
               gpupool.global_avg_pool_backward(on_gpu(gg, 1), x.shape),
               gpupool.global_max_pool_backward(on_gpu(gg, 1), dx)]
    g, indices, gg, x = (cupy.asarray(a) for a in (g, indices, gg, x))
    expected = [gpupool.max_pool_backward(g, indices, x.shape, 3, 2, 1),
                gpupool.avg_pool_backward(g, x.shape, 3, 2, 1, count_include_pad=True),
                gpupool.adaptive_avg_pool_backward(g, x.shape, y.shape[2:]),
                gpupool.global_avg_pool_backward(gg, x.shape),
                gpupool.global_max_pool_backward(gg, x)]
    for r in results:
        assert isinstance(r._meta, cupy.ndarray)
    for got, want in zip(dask.compute(*results, scheduler="synchronous"), expected):
        assert isinstance(got, cupy.ndarray)
        same_bits(cupy.asnumpy(got), cupy.asnumpy(want))
