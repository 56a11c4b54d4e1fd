"""Dask arrays: every op on a chunked array equals the op on the whole in-memory array.

Expected values come from the NumPy backend on ``x.compute()`` (itself tested against
``reference.py``; a few cases here also check the reference directly). Max values, indices,
unpool and every quantized result must be equal exactly; float averages (the sum order
differs between a block and the whole array) to ``rtol=1e-5`` plus an absolute ``1e-5`` times
the largest ``|x|`` (cancellation) for float32/float64, ``rtol=atol=2e-3`` (times max |x|) for
float16. Chunkings are drawn at random, zero-size chunks included.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numpy.testing import assert_array_equal  # noqa: E402

import gpupool  # noqa: E402
import reference as ref  # noqa: E402
from gpupool import quantized as Q  # noqa: E402

MAX_SIZE = {1: 14, 2: 9, 3: 5}


# ----------------------------------------------------------------------------- helpers

@st.composite
def chunkings(draw, shape):
    """Random chunks for ``shape``: cut points per dim, repeats giving zero-size chunks."""
    chunks = []
    for n in shape:
        cuts = sorted(draw(st.lists(st.integers(0, n), max_size=2)))
        bounds = [0] + cuts + [n]
        chunks.append(tuple(b - a for a, b in zip(bounds, bounds[1:])))
    return tuple(chunks)


@st.composite
def arrays(draw, nd, dtypes=("float32", "float64", "float16"), nan=True, min_size=1):
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    lead = tuple(draw(st.integers(1, 2)) for _ in range(draw(st.integers(0, 2))))
    lead = lead[:1] if nd == 3 else lead
    spatial = tuple(draw(st.integers(min_size, MAX_SIZE[nd])) for _ in range(nd))
    shape = lead + spatial + ((draw(st.integers(1, 3)),) if layout == "NHWC" else ())
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "f":
        x = rng.standard_normal(shape).astype(dtype)
        if draw(st.booleans()):
            x = np.round(x).astype(dtype)  # ties
        if nan and draw(st.integers(0, 3)) == 0:
            x[rng.random(shape) < 0.1] = np.nan
    else:
        x = rng.integers(-5, 5, shape).astype(dtype)
    return x, layout, draw(chunkings(shape))


def per_dim(draw, strategy, nd):
    return draw(strategy) if draw(st.booleans()) else tuple(draw(strategy) for _ in range(nd))


@st.composite
def window_args(draw, nd, dilation=True):
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    form = draw(st.sampled_from(["int", "pairs", "valid", "same", "same_lower", "big"]))
    padding = {"int": lambda: draw(st.integers(0, 2)),
               "pairs": lambda: tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3)))
                                      for _ in range(nd)),
               "big": lambda: tuple((draw(st.integers(0, 7)), draw(st.integers(0, 7)))
                                    for _ in range(nd))}.get(form, lambda: form)()
    stride = draw(st.none() | st.integers(1, 4) | st.tuples(*[st.integers(1, 4)] * nd))
    args = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=draw(st.booleans()))
    if dilation:
        args["dilation"] = per_dim(draw, st.integers(1, 3), nd)
    return args


def close(actual, expected, dtype, scale):
    loose = np.dtype(dtype) == np.float16
    tol = 2e-3 if loose else 1e-5
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=tol, atol=tol * scale, equal_nan=True)


def same_bits(actual, expected):
    """Equal bit for bit: signed zeros and NaN payloads too."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    unsigned = f"u{actual.dtype.itemsize}"
    assert_array_equal(np.asarray(actual).view(unsigned), np.asarray(expected).view(unsigned))


def magnitude(x) -> float:
    finite = np.abs(x[np.isfinite(x)]) if x.dtype.kind == "f" else np.abs(x)
    return float(finite.max(initial=1.0))


def check_lazy(result, chunk_type=np.ndarray):
    assert isinstance(result, da.Array)
    assert type(result._meta) is chunk_type


def compute(*arrays, scheduler="synchronous"):
    return dask.compute(*arrays, scheduler=scheduler)


def poisoned(x, chunks):
    """A Dask array of ``x``'s shape and dtype whose every block raises when computed."""
    def explode(block):
        raise AssertionError("a block was computed")
    return da.from_array(x, chunks=chunks).map_blocks(explode, dtype=x.dtype)


# ----------------------------------------------------------------------------- window ops

@settings(max_examples=400)
@given(data=st.data(), nd=st.sampled_from([1, 2, 2, 3]),
       op=st.sampled_from(["max", "max_indices", "avg", "avg_include_pad", "avg_override",
                           "lp"]))
def test_window_ops_match_whole_array(data, nd, op):
    dtypes = ("float32", "float64", "float16") + (("int8", "int32") if op == "max" else ())
    x, layout, chunks = data.draw(arrays(nd, dtypes))
    args = data.draw(window_args(nd))
    if op.startswith("max"):
        func, extra = gpupool.max_pool, {"return_indices": op == "max_indices"}
    elif op == "lp":
        func = gpupool.lp_pool
        extra = {"p": data.draw(st.sampled_from([1, 2, 3.5]))}
    else:
        func = gpupool.avg_pool
        extra = {"count_include_pad": op == "avg_include_pad",
                 "divisor_override": 3 if op == "avg_override" else None}
    dx = da.from_array(x, chunks=chunks)
    try:
        expected = func(x, layout=layout, **args, **extra)
    except ValueError as e:  # the same error, raised while building the graph
        with pytest.raises(ValueError) as lazy:
            func(poisoned(x, chunks), layout=layout, **args, **extra)
        assert str(lazy.value) == str(e)
        return
    result = func(dx, layout=layout, **args, **extra)
    if op == "max_indices":
        for r in result:
            check_lazy(r)
        values, indices = compute(*result)
        assert_array_equal(values, expected[0])
        assert_array_equal(indices, expected[1])
        assert indices.dtype == np.int64
    else:
        check_lazy(result)
        (actual,) = compute(result)
        assert actual.dtype == x.dtype and actual.shape == expected.shape
        if op == "max":
            assert_array_equal(actual, expected)
        else:  # every chunk adds its windows' taps in the same order as the whole array
            same_bits(actual, expected)


@pytest.mark.parametrize("case", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(3, 1), padding=((2, 0), (0, 2)), dilation=(2, 1)),
    dict(kernel_size=2, stride=2, padding="same", ceil_mode=True),
    dict(kernel_size=1, stride=3, padding=((4, 4), (5, 0))),  # windows with no valid tap
])
def test_window_ops_match_reference(case):
    x = np.random.default_rng(1).standard_normal((2, 7, 8))
    x[0, 3, 3] = np.nan
    dx = da.from_array(x, chunks=(1, 3, (1, 2, 5)))
    values, indices = compute(*gpupool.max_pool(dx, **case, return_indices=True))
    ref_values, ref_indices = ref.max_pool(x, **case)
    assert_array_equal(values, ref_values)
    assert_array_equal(indices, ref_indices)
    avg = {k: v for k, v in case.items() if k != "dilation"}
    for include_pad in (False, True):
        (actual,) = compute(gpupool.avg_pool(dx, **avg, count_include_pad=include_pad))
        np.testing.assert_allclose(actual, ref.avg_pool(x, **avg, count_include_pad=include_pad),
                                   rtol=1e-12, atol=1e-12)


def test_halo_blocks_and_graph_size():
    """Output chunks follow the input chunks; one task per output block plus halo cuts."""
    x = np.arange(2 * 40 * 40, dtype=np.float32).reshape(2, 40, 40)
    dx = da.from_array(x, chunks=(1, 10, 10))
    y = gpupool.max_pool(dx, 3, stride=2, padding=1)
    assert y.chunks == ((1, 1), (6, 5, 5, 4), (6, 5, 5, 4))  # by window start 2*o - 1
    blocks = 2 * 4 * 4
    new_tasks = len(y.__dask_graph__()) - len(dx.__dask_graph__())
    assert blocks < new_tasks <= blocks * 5 + 1, new_tasks
    assert_array_equal(y.compute(), gpupool.max_pool(x, 3, stride=2, padding=1))
    pooled = gpupool.avg_pool(dx, 2)  # stride-aligned windows: no halo tasks at all
    assert len(pooled.__dask_graph__()) - len(dx.__dask_graph__()) == 2 * 4 * 4 + 1


# ----------------------------------------------------------------------------- global, adaptive

@settings(max_examples=150)
@given(data=st.data(), nd=st.sampled_from([1, 2, 3]), op=st.sampled_from(["avg", "max"]))
def test_global_ops_match_whole_array(data, nd, op):
    x, layout, chunks = data.draw(arrays(nd, ("float32", "float64", "float16", "int16")
                                          if op == "max" else ("float32", "float64", "float16")))
    func = gpupool.global_max_pool if op == "max" else gpupool.global_avg_pool
    result = func(da.from_array(x, chunks=chunks), spatial_dims=nd, layout=layout)
    check_lazy(result)
    (actual,) = compute(result)
    expected = func(x, spatial_dims=nd, layout=layout)
    assert actual.dtype == x.dtype and actual.shape == expected.shape
    if op == "max":
        assert_array_equal(actual, expected)
    else:
        close(actual, expected, x.dtype, magnitude(x))


def test_global_is_a_tree_reduction():
    """No task sees more than one input chunk of a plane: partial sums are combined."""
    x = np.random.default_rng(2).standard_normal((3, 64, 64)).astype(np.float32)
    dx = da.from_array(x, chunks=(1, 8, 8))
    y = gpupool.global_avg_pool(dx, spatial_dims=2)
    graph = dict(y.__dask_graph__())
    assert max(len(getattr(task, "dependencies", ())) for task in graph.values()) < 64
    (actual,) = compute(y)
    np.testing.assert_allclose(actual, gpupool.global_avg_pool(x, spatial_dims=2), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(actual, ref.global_avg_pool(x), rtol=1e-5, atol=1e-6)


def test_global_avg_sums_float16_in_float64():
    """65536 float16 ones sum past float16's largest value; the mean is still exactly 1."""
    dx = da.ones((1, 1, 256, 256), dtype=np.float16, chunks=(1, 1, 64, 64))
    for result in (gpupool.global_avg_pool(dx), gpupool.adaptive_avg_pool(dx, 1)):
        (actual,) = compute(result)
        assert actual.dtype == np.float16
        assert_array_equal(actual, np.ones((1, 1, 1, 1), np.float16))


@settings(max_examples=250)
@given(data=st.data(), nd=st.sampled_from([1, 2, 3]),
       op=st.sampled_from(["avg", "max", "max_indices"]))
def test_adaptive_ops_match_whole_array(data, nd, op):
    x, layout, chunks = data.draw(arrays(nd, ("float32", "float64", "float16")
                                         + (("int8",) if op != "avg" else ())))
    spatial = x.shape[len(x.shape) - nd - (layout == "NHWC"):][:nd]
    output_size = tuple(data.draw(st.integers(1, 2 * n + 1)) for n in spatial)
    dx = da.from_array(x, chunks=chunks)
    if op == "avg":
        result = gpupool.adaptive_avg_pool(dx, output_size, layout=layout)
        check_lazy(result)
        (actual,) = compute(result)
        same_bits(actual, gpupool.adaptive_avg_pool(x, output_size, layout=layout))
        return
    indices = op == "max_indices"
    result = gpupool.adaptive_max_pool(dx, output_size, return_indices=indices, layout=layout)
    expected = gpupool.adaptive_max_pool(x, output_size, return_indices=indices, layout=layout)
    actual = compute(*result) if indices else compute(result)
    for a, e in zip(actual, expected if indices else (expected,)):
        assert a.dtype == e.dtype
        assert_array_equal(a, e)


def test_adaptive_matches_reference_across_chunk_edges():
    x = np.random.default_rng(3).standard_normal((1, 2, 13, 11))
    dx = da.from_array(x, chunks=(1, 1, (4, 4, 5), (1, 3, 7)))
    for output_size in [(5, 4), (13, 11), (20, 3), (2, 1)]:
        (avg,) = compute(gpupool.adaptive_avg_pool(dx, output_size))
        np.testing.assert_allclose(avg, ref.adaptive_avg_pool(x, output_size), rtol=1e-12)
        values, indices = compute(*gpupool.adaptive_max_pool(dx, output_size,
                                                             return_indices=True))
        ref_values, ref_indices = ref.adaptive_max_pool(x, output_size)
        assert_array_equal(values, ref_values)
        assert_array_equal(indices, ref_indices)


# ----------------------------------------------------------------------------- max_unpool

@settings(max_examples=250)
@given(data=st.data(), nd=st.sampled_from([1, 2, 3]))
def test_max_unpool_matches_whole_array(data, nd):
    x, layout, chunks = data.draw(arrays(nd, ("float32", "int32"), nan=False, min_size=2))
    args = data.draw(window_args(nd))
    if isinstance(args["padding"], str):
        args["padding"] = "valid"  # SAME needs output_size, drawn below
    try:
        values, indices = gpupool.max_pool(x, layout=layout, return_indices=True, **args)
    except ValueError:
        return
    spatial = x.shape[len(x.shape) - nd - (layout == "NHWC"):][:nd]
    args.pop("ceil_mode")
    output_size = spatial
    if data.draw(st.booleans()):  # the default size, where it is the pooled input's
        try:
            default = gpupool.max_unpool(values, indices, layout=layout, **args)
            output_size = None if default.shape == x.shape else spatial
        except ValueError:
            pass
    pooled_chunks = data.draw(chunkings(values.shape))
    dv = da.from_array(values, chunks=pooled_chunks)
    di = da.from_array(indices, chunks=data.draw(chunkings(values.shape)))  # rechunked to dv's
    try:  # index -1 (a window with no valid tap) is skipped on both
        expected = gpupool.max_unpool(values, indices, layout=layout, output_size=output_size,
                                      **args)
    except ValueError:  # a geometry error: raised eagerly
        with pytest.raises(ValueError):
            gpupool.max_unpool(dv, di, layout=layout, output_size=output_size, **args)
        return
    result = gpupool.max_unpool(dv, di, layout=layout, output_size=output_size, **args)
    check_lazy(result)
    (actual,) = compute(result)
    assert actual.dtype == x.dtype
    assert_array_equal(actual, expected)


def test_max_unpool_same_padding_and_reference():
    x = np.random.default_rng(4).permutation(2 * 11 * 9).reshape(1, 2, 11, 9).astype(np.float64)
    dx = da.from_array(x, chunks=(1, 1, (3, 8), (2, 2, 5)))
    values, indices = gpupool.max_pool(dx, 3, stride=2, padding="same", return_indices=True)
    result = gpupool.max_unpool(values, indices, 3, stride=2, padding="same",
                                output_size=(11, 9))
    y, i = gpupool.max_pool(x, 3, stride=2, padding="same", return_indices=True)
    expected = ref.max_unpool(y, i, 3, stride=2, padding="same", output_size=(11, 9))
    assert_array_equal(result.compute(), expected)


def test_max_unpool_refuses_indices_outside_their_window():
    """An in-plane index that its position's window cannot reach would be dropped by the
    block-wise scatter: it is an error when computed."""
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    values, indices = gpupool.max_pool(x, 2, return_indices=True)
    indices[0, 0, 0, 0] = 15  # in the plane, in another window
    gpupool.max_unpool(values, indices, 2)  # the in-memory op scatters it anyway
    result = gpupool.max_unpool(da.from_array(values, chunks=1), da.from_array(indices, chunks=1),
                                2)
    with pytest.raises(ValueError, match="outside the pooling window"):
        result.compute()


def test_max_unpool_refuses_an_index_between_the_taps_of_a_dilated_window():
    """Regression: the Dask check took a dilated window's whole span for the window, so an
    index between two of its taps passed and was written; it names none of the window's
    taps, which max_pool_backward refuses too."""
    x = np.random.default_rng(3).permutation(2 * 9 * 9).reshape(1, 2, 9, 9).astype(np.float64)
    args = dict(kernel_size=3, stride=2, dilation=2)  # taps 0, 2, 4 of each window
    values, indices = gpupool.max_pool(x, return_indices=True, **args)
    chunks = (1, 1, (1, 2), (2, 1))

    def dask_unpool(idx):
        return gpupool.max_unpool(da.from_array(values, chunks=chunks),
                                  da.from_array(idx, chunks=chunks), output_size=(9, 9), **args)
    assert_array_equal(dask_unpool(indices).compute(scheduler="synchronous"),
                       scatter_reference(values, indices, (9, 9)))
    row = int(indices[0, 1, 1, 1]) // 9  # the window's taps: rows and columns 2, 4, 6
    bad = indices.copy()
    bad[0, 1, 1, 1] = row * 9 + 3  # column 3: between two taps, inside the span
    with pytest.raises(ValueError, match="max_unpool: an index lies outside the pooling window"):
        dask_unpool(bad).compute(scheduler="synchronous")
    with pytest.raises(ValueError, match="max_pool_backward: an index lies outside the pooling "
                                         "window"):
        gpupool.max_pool_backward(np.ones_like(values), bad, x.shape, **args)


def _global_avg(x):
    return gpupool.global_avg_pool(x)


@pytest.mark.parametrize("op", [
    lambda x: gpupool.max_pool(x, 2), lambda x: gpupool.avg_pool(x, 3, 1, 1),
    _global_avg, lambda x: gpupool.global_max_pool(x),
    lambda x: gpupool.adaptive_avg_pool(x, (3, 2)),
    lambda x: gpupool.max_pool(x, 2, return_indices=True)[1]])
def test_byte_swapped_input_gives_the_native_dtype_it_computes(op):
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 6)).astype(">f4")
    lazy = op(da.from_array(x, chunks=(1, 2, 3, 4)))
    (actual,) = compute(lazy)
    expected = op(x)
    assert lazy.dtype == actual.dtype == expected.dtype and expected.dtype.isnative
    if op is _global_avg:  # a tree of chunk sums: equal to rounding
        close(actual, expected, x.dtype, magnitude(x))
    else:
        same_bits(actual, expected)


# ----------------------------------------------------------------------------- errors, laziness

def test_validation_is_eager_with_the_numpy_errors():
    x = np.zeros((1, 1, 4, 4), np.float32)
    dx = poisoned(x, 2)
    for call in [lambda a: gpupool.max_pool(a, 5),
                 lambda a: gpupool.avg_pool(a, 2, padding="bogus"),
                 lambda a: gpupool.avg_pool(a.astype(np.int32), 2),
                 lambda a: gpupool.lp_pool(a, -1.0, 2),
                 lambda a: gpupool.adaptive_avg_pool(a, (0, 2)),
                 lambda a: gpupool.global_max_pool(a, spatial_dims=0),
                 lambda a: gpupool.max_unpool(a, a.astype(np.int64), 2, output_size=(20, 20))]:
        with pytest.raises((ValueError, TypeError)) as in_memory:
            call(x)
        with pytest.raises(type(in_memory.value)) as lazy:
            call(dx)
        assert str(lazy.value) == str(in_memory.value)
    gpupool.max_pool(dx, 2, return_indices=True)  # builds without computing anything


def test_out_and_mixed_inputs_are_type_errors():
    x = np.zeros((1, 1, 4, 4), np.float32)
    dx = da.from_array(x, chunks=2)
    with pytest.raises(TypeError, match=r"gpupool\.avg_pool: out .*immutable"):
        gpupool.avg_pool(dx, 2, out=da.zeros((1, 1, 2, 2), chunks=1))
    with pytest.raises(TypeError, match=r"gpupool\.global_max_pool: out"):
        gpupool.global_max_pool(dx, out=np.empty((1, 1, 1, 1), np.float32))
    values, indices = gpupool.max_pool(dx, 2, return_indices=True)
    with pytest.raises(TypeError, match=r"gpupool\.max_unpool: indices is a numpy\.ndarray"):
        gpupool.max_unpool(values, indices.compute(), 2)
    with pytest.raises(TypeError, match=r"gpupool\.max_unpool: indices"):
        gpupool.max_unpool(values.compute(), indices, 2)
    unknown = dx[dx[:, 0, 0, 0] > 0]
    with pytest.raises(ValueError, match=r"gpupool\.max_pool: x has unknown chunk sizes"):
        gpupool.max_pool(unknown, 2)


# ----------------------------------------------------------------------------- quantized

@settings(max_examples=300)
@given(data=st.data(), nd=st.sampled_from([1, 2, 3]),
       op=st.sampled_from(["max", "avg", "global", "adaptive"]),
       dtype=st.sampled_from(["int8", "uint8"]), scale=st.sampled_from([0.05, 1 / 3, 2.0]),
       zero_point=st.integers(-3, 3), out_scale=st.sampled_from([None, 0.07, 1e-3]),
       rounding=st.sampled_from(Q.ROUNDINGS))
def test_quantized_ops_are_bit_exact(data, nd, op, dtype, scale, zero_point, out_scale, rounding):
    x, layout, chunks = data.draw(arrays(nd, ("float32",), nan=False))
    q = Q.quantize(x * 3, scale, zero_point + (3 if dtype == "uint8" else 0), dtype)
    dq = Q.quantize(da.from_array(x * 3, chunks=chunks), scale,
                    zero_point + (3 if dtype == "uint8" else 0), dtype)
    check_lazy(dq.data)
    requant = dict(out_scale=out_scale, rounding=rounding, layout=layout)
    if op == "max":
        args = data.draw(window_args(nd))
        func, kwargs = Q.max_pool, dict(args, layout=layout)
    elif op == "avg":
        args = data.draw(window_args(nd, dilation=False))
        func, kwargs = Q.avg_pool, dict(args, count_include_pad=data.draw(st.booleans()),
                                        **requant)
    elif op == "global":
        func, kwargs = Q.global_avg_pool, dict(spatial_dims=nd, **requant)
    else:
        spatial = x.shape[len(x.shape) - nd - (layout == "NHWC"):][:nd]
        size = tuple(data.draw(st.integers(1, 2 * n)) for n in spatial)
        func, kwargs = Q.adaptive_avg_pool, dict(output_size=size, **requant)
    try:
        expected = func(q, **kwargs)
    except ValueError:
        with pytest.raises(ValueError):
            func(dq, **kwargs)
        return
    result = func(dq, **kwargs)
    assert isinstance(result, Q.QArray)
    check_lazy(result.data)
    assert (result.scale, result.zero_point) == (expected.scale, expected.zero_point)
    (codes,) = compute(result.data)
    assert codes.dtype == expected.data.dtype
    assert_array_equal(codes, expected.data)


def test_quantized_blocks_without_valid_taps():
    """Blocks whose windows all lie in the padding: the dtype minimum (max), the output zero
    point (average)."""
    x = np.arange(2 * 7 * 8, dtype=np.float32).reshape(2, 7, 8) / 10
    q = Q.quantize(x, 0.1, 3)
    dq = Q.quantize(da.from_array(x, chunks=(1, 3, (1, 2, 5))), 0.1, 3)
    args = dict(kernel_size=1, stride=3, padding=((4, 4), (5, 0)))
    for func, extra in [(Q.max_pool, {}), (Q.avg_pool, dict(out_zero_point=-7)),
                        (Q.avg_pool, dict(count_include_pad=True))]:
        expected = func(q, **args, **extra).data
        assert (expected == (-128 if func is Q.max_pool else q.zero_point + (
            -10 if "out_zero_point" in extra else 0))).any()
        assert_array_equal(func(dq, **args, **extra).data.compute(), expected)


def test_quantize_and_dequantize_dask():
    x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(1, 3, 4, 5)
    dx = da.from_array(x, chunks=(1, 2, 3, 2))
    q = Q.quantize(dx, 0.03, 5, "int8")
    assert isinstance(q.data, da.Array) and "dask" in repr(q)
    assert_array_equal(q.data.compute(), Q.quantize(x, 0.03, 5, "int8").data)
    deq = Q.dequantize(q)
    check_lazy(deq)
    assert_array_equal(deq.compute(), Q.dequantize(Q.quantize(x, 0.03, 5, "int8")))
    wrapped = Q.QArray(q.data, 0.03, 5)
    assert_array_equal(Q.max_pool(wrapped, 2).data.compute(),
                       Q.max_pool(Q.quantize(x, 0.03, 5), 2).data)
    with pytest.raises(ValueError, match="scale"):
        Q.quantize(dx, -1.0)  # eager
    with pytest.raises(TypeError, match="dtype"):
        Q.QArray(dx, 1.0)  # float codes
    nan = Q.quantize(da.from_array(np.array([1.0, np.nan]), chunks=1), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        nan.data.compute()  # when computed


# ----------------------------------------------------------------------------- schedulers

def test_threaded_scheduler_large_blocks():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 130, 97)).astype(np.float32)
    dx = da.from_array(x, chunks=(1, 2, 33, 40))
    results = compute(*gpupool.max_pool(dx, 3, 2, 1, return_indices=True),
                      gpupool.avg_pool(dx, 5, 3, 2, ceil_mode=True, count_include_pad=True),
                      gpupool.adaptive_avg_pool(dx, (7, 7)), scheduler="threads")
    expected = (*gpupool.max_pool(x, 3, 2, 1, return_indices=True),
                gpupool.avg_pool(x, 5, 3, 2, ceil_mode=True, count_include_pad=True),
                gpupool.adaptive_avg_pool(x, (7, 7)))
    for a, e in zip(results[:2], expected[:2]):
        assert_array_equal(a, e)
    for a, e in zip(results[2:], expected[2:]):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def cluster_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def test_distributed_cluster(cluster_client):
    """Each graph runs on the cluster's worker processes and gives the in-memory result."""
    from distributed import get_task_stream
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 2, 40, 36)).astype(np.float32)
    dx = da.from_array(x, chunks=(1, 2, 15, 12))
    values, indices = gpupool.max_pool(dx, 3, 2, padding=((1, 2), (0, 1)), ceil_mode=True,
                                       return_indices=True)
    q = Q.quantize(dx, 0.02, 1)
    with get_task_stream(cluster_client) as stream:
        results = cluster_client.compute([
            values, indices, gpupool.adaptive_max_pool(dx, (6, 5)),
            gpupool.global_avg_pool(dx), Q.global_avg_pool(q, out_scale=0.001).data,
            Q.adaptive_avg_pool(q, (5, 7)).data,
            gpupool.max_unpool(values, indices, 3, 2, padding=((1, 2), (0, 1)),
                               output_size=(40, 36))], sync=True)
    workers = set(cluster_client.scheduler_info()["workers"])
    ran_on = {task["worker"] for task in stream.data}
    assert ran_on and ran_on <= workers, (ran_on, workers)
    assert any("max_pool" in str(task["key"]) for task in stream.data)
    y, i = gpupool.max_pool(x, 3, 2, padding=((1, 2), (0, 1)), ceil_mode=True,
                            return_indices=True)
    qx = Q.quantize(x, 0.02, 1)
    expected = [y, i, gpupool.adaptive_max_pool(x, (6, 5)), gpupool.global_avg_pool(x),
                Q.global_avg_pool(qx, out_scale=0.001).data, Q.adaptive_avg_pool(qx, (5, 7)).data,
                gpupool.max_unpool(y, i, 3, 2, padding=((1, 2), (0, 1)), output_size=(40, 36))]
    for n, (a, e) in enumerate(zip(results, expected)):
        if n == 3:
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
        else:
            assert_array_equal(a, e)


# ----------------------------------------------------------------------------- CuPy chunks

@pytest.mark.gpu
def test_cupy_chunks_run_on_the_gpu_and_stay_cupy():
    import cupy
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 20, 18)).astype(np.float32)
    dx = da.from_array(x, chunks=(1, 1, 7, 9)).map_blocks(cupy.asarray)
    values, indices = gpupool.max_pool(dx, 3, 2, 1, return_indices=True)
    avg = gpupool.avg_pool(dx, 2, ceil_mode=True)
    pooled = gpupool.global_avg_pool(dx)
    for r in (values, indices, avg, pooled):
        assert isinstance(r._meta, cupy.ndarray)
    got = dask.compute(values, indices, avg, pooled, scheduler="synchronous")
    for r in got:
        assert isinstance(r, cupy.ndarray)
    y, i = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
    assert_array_equal(cupy.asnumpy(got[0]), y)
    assert_array_equal(cupy.asnumpy(got[1]), i)
    np.testing.assert_allclose(cupy.asnumpy(got[2]), gpupool.avg_pool(x, 2, ceil_mode=True),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(got[3]), gpupool.global_avg_pool(x), rtol=1e-5,
                               atol=1e-6)


def test_max_unpool_checks_indices_of_windows_that_reach_no_output():
    """Regression: a window wholly in the padding reaches no output block, so no block
    gathered it and its index went unchecked. max_pool gives it index -1, which is skipped
    (as by the in-memory op); any other index outside the plane raises on both."""
    x = np.array([[[[3, 1], [0, -3]], [[-2, -5], [-5, -5]]]], np.int32)
    args = dict(kernel_size=(2, 2, 1), padding=1)
    values, indices = gpupool.max_pool(x, ceil_mode=True, return_indices=True, **args)
    empty = indices == -1
    assert empty.any()

    def dask_unpool(idx):
        return gpupool.max_unpool(da.from_array(values, chunks=(1, 2, 2, (1, 2))),
                                  da.from_array(idx, chunks=(1, 2, 2, 3)),
                                  output_size=(2, 2, 2), **args)
    expected = gpupool.max_unpool(values, indices, output_size=(2, 2, 2), **args)
    assert_array_equal(expected, scatter_reference(values, indices, (2, 2, 2)))
    assert_array_equal(dask_unpool(indices).compute(scheduler="synchronous"), expected)
    bad = np.where(empty, -2, indices)
    with pytest.raises(ValueError, match=r"indices span \[-2, .*outside the output plane"):
        gpupool.max_unpool(values, bad, output_size=(2, 2, 2), **args)
    with pytest.raises(ValueError, match=r"indices span \[-2, .*outside the output plane"):
        dask_unpool(bad).compute(scheduler="synchronous")


def scatter_reference(values, indices, out_spatial):
    """max_unpool (NCHW) by a direct loop: each value at its flat index in its zero plane;
    index -1 writes nothing."""
    nd = len(out_spatial)
    lead = values.shape[:values.ndim - nd]
    out = np.zeros(lead + tuple(out_spatial), values.dtype)
    flat_out = out.reshape(-1, math.prod(out_spatial))
    for plane, (vals, idxs) in enumerate(zip(values.reshape(len(flat_out), -1),
                                             indices.reshape(len(flat_out), -1))):
        for v, i in zip(vals.tolist(), idxs.tolist()):
            if i != -1:
                flat_out[plane, i] = v
    return out


@pytest.mark.parametrize("chunks", [1, 2, 3, (1, 2, 2, 3)])
@pytest.mark.parametrize("kernel, stride, padding", [
    (2, 1, 3), ((3, 2), (2, 1), ((4, 0), (1, 3))), (2, 2, ((0, 5), (3, 0)))])
def test_max_unpool_round_trip_with_pads_beyond_half_the_window(chunks, kernel, stride,
                                                                padding):
    """Regression: indices -1 of max_pool's empty windows (pads beyond k/2) were refused;
    they are skipped, and the block gather lands every other value where the whole-array
    op does."""
    x = np.random.default_rng(6).integers(-3, 4, (1, 3, 4, 5)).astype(np.float32)
    values, indices = gpupool.max_pool(x, kernel, stride, padding, return_indices=True)
    assert (indices == -1).any()
    result = gpupool.max_unpool(da.from_array(values, chunks=chunks),
                                da.from_array(indices, chunks=chunks), kernel, stride, padding,
                                output_size=(4, 5))
    check_lazy(result)
    (actual,) = compute(result)
    assert_array_equal(actual, scatter_reference(values, indices, (4, 5)))


# ----------------------------------------------------------------------------- subnormals

def subnormal_dask(backend, shape, chunks, seed):
    """Float32 multiples of 2**-143 in [-2**-137, 2**-137] (subnormal, sums exact in float32
    and float64), as a Dask array of ``backend``'s chunks, and the NumPy array."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-64, 65, shape) * 2.0**-143).astype(np.float32)
    assert np.abs(x).max() < np.finfo(np.float32).smallest_normal
    return da.from_array(x, chunks=chunks).map_blocks(backend.xp.asarray), x


@pytest.mark.parametrize("output_size", [(5, 4), (2, 1), (1, 1)])
def test_adaptive_keeps_float32_subnormals(backend, output_size):
    """Regression: on CuPy chunks the blocks ran CuPy's own arithmetic, compiled with
    -ftz=true, which flushed float32 subnormals to zero. Each block must give the in-memory
    op's bits (and the float64 reference's values)."""
    dx, x = subnormal_dask(backend, (2, 3, 13, 11), (1, 2, (5, 8), (4, 7)), 11)
    (avg,) = compute(gpupool.adaptive_avg_pool(dx, output_size))
    same_bits(backend.to_numpy(avg),
              backend.to_numpy(gpupool.adaptive_avg_pool(backend.to_backend(x), output_size)))
    # exact sums: the mean is the float64 one rounded once
    assert_array_equal(backend.to_numpy(avg),
                       ref.adaptive_avg_pool(x, output_size).astype(np.float32))
    ref_values, ref_indices = ref.adaptive_max_pool(x, output_size)
    (values,) = compute(gpupool.adaptive_max_pool(dx, output_size))
    same_bits(backend.to_numpy(values), ref_values.astype(np.float32))
    values, indices = compute(*gpupool.adaptive_max_pool(dx, output_size, return_indices=True))
    same_bits(backend.to_numpy(values), ref_values.astype(np.float32))
    assert_array_equal(backend.to_numpy(indices), ref_indices)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_keeps_float32_subnormals(backend, layout):
    """Regression: on CuPy chunks the tree reduction (dask.array's max, and its float64 sum
    after a float32 -> float64 conversion) ran in CuPy's kernels, which flush float32
    subnormals: the max and the mean came out 0."""
    dx, x = subnormal_dask(backend, (2, 12, 10, 3), (1, (5, 7), (3, 3, 4), 2), 12)
    mean, top = compute(gpupool.global_avg_pool(dx, layout=layout),
                        gpupool.global_max_pool(dx, layout=layout))
    planes = x if layout == "NCHW" else np.moveaxis(x, -1, 1)
    expected_mean = ref.global_avg_pool(planes).astype(np.float32)
    expected_top = ref.global_max_pool(planes).astype(np.float32)
    if layout == "NHWC":
        expected_mean, expected_top = (np.moveaxis(e, 1, -1) for e in (expected_mean,
                                                                        expected_top))
    assert_array_equal(backend.to_numpy(mean), expected_mean)  # exact float64 sums
    same_bits(backend.to_numpy(top), expected_top)
    assert (backend.to_numpy(top) != 0).all()
