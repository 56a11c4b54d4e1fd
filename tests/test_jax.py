"""The float ops on traced JAX values (:mod:`gpupool.interop.jax_ops`): ``grad``, ``jvp``,
``jacfwd``, ``hessian`` (through ``jit`` and ``vmap``) against the same pooling written with
``jax.lax.reduce_window`` and ``jnp.mean``/``jnp.max``; the lowered program (buffer callbacks,
no ``pure_callback``); sharding over the plane dims; the refusals."""
from __future__ import annotations

import math
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import gpupool
from gpupool.interop import jax_ops

jax = pytest.importorskip("jax")
jnp = jax.numpy
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _distinct(rng, shape, dtype="float64"):
    """Values without ties, at least 0.01 apart, in random order."""
    n = math.prod(shape)
    return (rng.permutation(n).reshape(shape) * 0.01 - n * 0.005).astype(dtype)


def _reduce_window(t, init, reducer, kernel, stride, pads, dilation=None):
    """``jax.lax.reduce_window`` over the spatial dims of NCHW ``t``."""
    lead = t.ndim - len(kernel)
    dilation = dilation or (1,) * len(kernel)
    return jax.lax.reduce_window(t, init, reducer, (1,) * lead + tuple(kernel),
                                 (1,) * lead + tuple(stride), ((0, 0),) * lead + tuple(pads),
                                 window_dilation=(1,) * lead + tuple(dilation))


def _jax_case(seed):
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, nd))
    stride = tuple(int(s) for s in rng.integers(1, 4, nd))
    dilation = tuple(int(d) for d in rng.integers(1, 3, nd))
    pads = tuple((int(rng.integers(0, k)), int(rng.integers(0, k))) for k in kernel)
    spatial = tuple(int(d * (k - 1) + 1 + rng.integers(0, 5)) for k, d in zip(kernel, dilation))
    return (2, 3) + spatial, kernel, stride, pads, dilation


def _max_pair(seed):
    """``(ours, theirs, input)`` of a max pool without dilation (JAX has no VJP of a dilated
    max reduce_window)."""
    shape, k, s, p, _ = _jax_case(seed)
    a = _distinct(np.random.default_rng(seed), shape, "float32")
    return (lambda t: gpupool.max_pool(t, k, s, p),
            lambda t: _reduce_window(t, -np.inf, jax.lax.max, k, s, p), a)


def _avg_pair(seed, count_include_pad):
    shape, k, s, p, _ = _jax_case(seed)
    p = tuple((min(b, kk // 2), min(e, kk // 2)) for (b, e), kk in zip(p, k))
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    def theirs(t):
        total = _reduce_window(t, 0.0, jax.lax.add, k, s, p)
        if count_include_pad:
            return total / math.prod(k)
        count = _reduce_window(jnp.ones(t.shape[-len(k):], t.dtype), 0.0, jax.lax.add, k, s, p)
        return total / count
    return (lambda t: gpupool.avg_pool(t, k, s, p, count_include_pad=count_include_pad),
            theirs, a)


def _lp_pair(seed, dtype="float32"):
    shape, k, s, p, d = _jax_case(seed)
    a = np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)
    a[np.abs(a) < 0.1] = 0.5

    def theirs(t):
        return _reduce_window(abs(t) ** 3, 0.0, jax.lax.add, k, s, p, d) ** (1 / 3)
    return lambda t: gpupool.lp_pool(t, 3, k, s, p, d), theirs, a


def _check_jax_grad(ours, theirs, a, seed):
    """``jax.grad`` of ``(f(x) * g).sum()`` under ``jit``: ours against theirs."""
    x = jnp.asarray(a)
    y = theirs(x)
    g = jnp.asarray(np.random.default_rng(seed).standard_normal(y.shape), x.dtype)
    np.testing.assert_allclose(np.asarray(jax.jit(ours)(x)), np.asarray(y), rtol=1e-6, atol=1e-6)
    got = jax.jit(jax.grad(lambda t: (ours(t) * g).sum()))(x)
    want = jax.grad(lambda t: (theirs(t) * g).sum())(x)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def _check_jvp(ours, theirs, a, seed):
    """``jax.jvp`` under ``jit`` (and ``jax.jacfwd`` on the first plane): ours against
    theirs, for a random tangent."""
    x = jnp.asarray(a)
    dx = jnp.asarray(np.random.default_rng(seed + 100).standard_normal(a.shape), x.dtype)
    got = jax.jit(lambda t, dt: jax.jvp(ours, (t,), (dt,)))(x, dx)
    want = jax.jvp(theirs, (x,), (dx,))
    tol = 1e-5 if a.dtype == np.float32 else 1e-12
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)
    plane = x[:1, :1]
    np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(plane)),
                               np.asarray(jax.jacfwd(theirs)(plane)), rtol=tol, atol=tol)


@pytest.mark.parametrize("seed", range(8))
def test_jax_max_pool_grad_equals_reduce_window(seed):
    _check_jax_grad(*_max_pair(seed), seed)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_jax_avg_pool_grad_equals_reduce_window(count_include_pad, seed):
    _check_jax_grad(*_avg_pair(seed, count_include_pad), seed)


@pytest.mark.parametrize("seed", range(6))
def test_jax_lp_pool_grad_equals_reduce_window(seed):
    _check_jax_grad(*_lp_pair(seed), seed)


@pytest.mark.parametrize("op", ["avg", "max"])
def test_jax_global_pool_grad_equals_mean_and_max(op):
    a = _distinct(np.random.default_rng(6), (2, 3, 5, 4), "float32")
    reduce = getattr(jnp, "mean" if op == "avg" else "max")
    _check_jax_grad(lambda t: getattr(gpupool, f"global_{op}_pool")(t),
                    lambda t: reduce(t, axis=(2, 3), keepdims=True), a, 6)


def _adaptive_pair(op):
    """Sizes that divide evenly: the adaptive windows are then kernel = stride = I / O."""
    a = _distinct(np.random.default_rng(7), (2, 3, 6, 8), "float32")
    init, reducer = (0.0, jax.lax.add) if op == "avg" else (-np.inf, jax.lax.max)

    def theirs(t):
        pooled = _reduce_window(t, init, reducer, (3, 2), (3, 2), ((0, 0), (0, 0)))
        return pooled / 6 if op == "avg" else pooled
    return lambda t: getattr(gpupool, f"adaptive_{op}_pool")(t, (2, 4)), theirs, a


@pytest.mark.parametrize("op", ["avg", "max"])
def test_jax_adaptive_pool_grad_equals_reduce_window(op):
    _check_jax_grad(*_adaptive_pair(op), 7)


@pytest.mark.parametrize("seed", range(4))
def test_jax_max_pool_jvp_and_jacfwd_equal_reduce_window(seed):
    _check_jvp(*_max_pair(seed), seed)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_jax_avg_pool_jvp_and_jacfwd_equal_reduce_window(count_include_pad, seed):
    _check_jvp(*_avg_pair(seed, count_include_pad), seed)


@pytest.mark.parametrize("seed", range(4))
def test_jax_lp_pool_jvp_and_jacfwd_equal_reduce_window(seed):
    _check_jvp(*_lp_pair(seed), seed)


@pytest.mark.parametrize("op", ["avg", "max"])
def test_jax_global_and_adaptive_jvp_equal_mean_max_and_reduce_window(op):
    a = _distinct(np.random.default_rng(11), (2, 3, 5, 4), "float32")
    reduce = getattr(jnp, "mean" if op == "avg" else "max")
    _check_jvp(lambda t: getattr(gpupool, f"global_{op}_pool")(t),
               lambda t: reduce(t, axis=(2, 3), keepdims=True), a, 11)
    _check_jvp(*_adaptive_pair(op), 7)


def test_jax_nhwc_jvp_equals_nchw():
    a = _distinct(np.random.default_rng(12), (2, 3, 5, 6), "float32")
    dx = np.random.default_rng(13).standard_normal(a.shape).astype(np.float32)
    nhwc = (0, 2, 3, 1)
    for f in (lambda t, **kw: gpupool.max_pool(t, 2, 1, **kw),
              lambda t, **kw: gpupool.lp_pool(t, 2, (2, 3), **kw),
              lambda t, **kw: gpupool.avg_pool(t, 3, 2, 1, **kw),
              lambda t, **kw: gpupool.adaptive_max_pool(t, (2, 4), **kw)):
        want = jax.jvp(f, (jnp.asarray(a),), (jnp.asarray(dx),))[1]
        got = jax.jvp(lambda t: f(t, layout="NHWC"), (jnp.asarray(a.transpose(nhwc)),),
                      (jnp.asarray(dx.transpose(nhwc)),))[1]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want).transpose(nhwc),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(2))
def test_jax_lp_pool_hessian_equals_reduce_windows(seed):
    """Second derivatives, in float64: ``jax.hessian`` (forward over reverse) and
    ``jacrev`` of ``jacfwd``."""
    with jax.enable_x64(True):
        ours, theirs, a = _lp_pair(seed, "float64")
        x = jnp.asarray(a[:1, :1])
        g = jnp.asarray(np.random.default_rng(seed).standard_normal(theirs(x).shape))
        want = jax.hessian(lambda t: (theirs(t) * g).sum())(x)
        for second in (jax.hessian, lambda f: jax.jacrev(jax.jacfwd(f))):
            got = jax.jit(second(lambda t: (ours(t) * g).sum()))(x)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10,
                                       atol=1e-12)


@pytest.mark.parametrize("op", ["max", "avg"])
def test_jax_max_and_avg_hessians_equal_reduce_windows(op):
    """The Hessian of a square of the pooling: the second derivative runs through the
    tangent map's transpose (the backward op) and its tangent."""
    with jax.enable_x64(True):
        x = jnp.asarray(_distinct(np.random.default_rng(16), (1, 2, 5, 6)))
        g = jnp.asarray(np.random.default_rng(17).standard_normal((1, 2, 3, 3)))
        init, reducer, scale = (-np.inf, jax.lax.max, 1) if op == "max" else (0.0, jax.lax.add, 4)

        def theirs(t):
            return _reduce_window(t, init, reducer, (2, 2), (2, 2), ((0, 1), (0, 0))) / scale
        ours = {"max": lambda t: gpupool.max_pool(t, 2, padding=((0, 1), (0, 0))),
                "avg": lambda t: gpupool.avg_pool(t, 2, padding=((0, 1), (0, 0)),
                                                  count_include_pad=True)}[op]
        got = jax.jit(jax.hessian(lambda t: (ours(t) ** 2 * g).sum()))(x)
        want = jax.hessian(lambda t: (theirs(t) ** 2 * g).sum())(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_jax_avg_pool_gradient_ignores_lists_changed_after_tracing():
    """A list argument changed between ``jax.vjp`` and the call of its function must not
    change the gradient: the arguments are frozen when the op is traced."""
    a = np.random.default_rng(14).standard_normal((1, 2, 6, 6))
    x = jnp.asarray(a, jnp.float32)
    kernel, padding = [3, 3], [1, 1]  # changed to a pooling of the same output shape
    y, vjp = jax.vjp(lambda t: gpupool.avg_pool(t, kernel, 1, padding), x)
    kernel[:] = [1, 1]
    padding[:] = [0, 0]
    (got,) = vjp(jnp.ones_like(y))
    want = gpupool.avg_pool_backward(np.ones(y.shape, np.float32), a.shape, (3, 3), 1, (1, 1))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def _custom_calls(text):
    return set(re.findall(r"stablehlo\.custom_call @(\w+)", text))


def test_jax_lowered_program_has_no_pure_callback():
    x = jnp.ones((2, 3, 6, 6))
    for f in (lambda t: gpupool.max_pool(t, 2), lambda t: gpupool.avg_pool(t, 3, 2, 1),
              lambda t: gpupool.lp_pool(t, 2, 2), lambda t: gpupool.global_max_pool(t),
              lambda t: gpupool.adaptive_avg_pool(t, 4),
              jax.grad(lambda t: gpupool.lp_pool(t, 2, 2).sum()),
              jax.grad(lambda t: gpupool.max_pool(t, 3, 2).sum()),
              lambda t: jax.jvp(lambda u: gpupool.avg_pool(u, 2), (t,), (t,))):
        text = jax.jit(f).lower(x).as_text()
        assert _custom_calls(text) == {"xla_buffer_python_cpu_callback"}, text
        assert "pure_callback" not in text and "xla_python_cpu_callback" not in text
        assert "scatter" not in text  # reverse mode: gpupool's backward ops, no atomics


def test_jax_without_buffer_callback_falls_back_to_pure_callback(monkeypatch):
    monkeypatch.setattr(jax_ops, "_buffer_callback", lambda: None)
    a = _distinct(np.random.default_rng(15), (2, 3, 6, 6), "float32")
    f = jax.grad(lambda t: gpupool.max_pool(t, 2, 1).sum())
    text = jax.jit(f).lower(jnp.asarray(a)).as_text()
    assert "xla_buffer_python_cpu_callback" not in text and _custom_calls(text)
    _check_jax_grad(*_max_pair(3), 3)
    _check_jvp(*_avg_pair(2, False), 2)


def test_jax_cuda_buffers_are_computed_as_cupy_arrays_on_xlas_stream(monkeypatch):
    """A CUDA buffer callback's body, with a stand-in CuPy that records the current stream
    (the JAX of the tests is the CPU build): the op sees CuPy arrays over XLA's buffers and
    runs while XLA's stream is CuPy's current one."""
    class Buffer:  # XLA's buffer on CUDA device 0, here over host memory
        def __init__(self, a):
            self.a = a

        def __dlpack_device__(self):
            return (2, 0)

    class ExternalStream:
        current = None

        def __init__(self, pointer):
            self.pointer = pointer

        def __enter__(self):
            ExternalStream.current = self.pointer

        def __exit__(self, *exc):
            ExternalStream.current = None

    cuda = types.SimpleNamespace(ExternalStream=ExternalStream)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=cuda, asarray=lambda b: ("cupy", b.a)))
    seen = []

    def compute(outs, x):
        seen.append((ExternalStream.current, outs[0][0], x[0]))
        outs[0][1][...] = 2 * x[1]
    out, x = np.zeros(3), np.arange(3.0)
    jax_ops.in_buffers(compute, types.SimpleNamespace(stream=1234), (Buffer(out),), Buffer(x))
    assert seen == [(1234, "cupy", "cupy")] and ExternalStream.current is None
    np.testing.assert_array_equal(out, [0, 2, 4])


def test_jax_export_refuses_host_callbacks():
    """``jax.export`` serializes only what another process can run: a buffer callback calls
    this process's Python, so export refuses it (JAX's own limit on host callbacks)."""
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        jax.export.export(jax.jit(lambda t: gpupool.avg_pool(t, 2)))(
            jax.ShapeDtypeStruct((1, 1, 4, 4), np.float32))


def test_jax_jit_forward_alone_and_indices():
    a = _distinct(np.random.default_rng(8), (2, 3, 6, 6), "float32")
    x = jnp.asarray(a)
    for f in (lambda t: gpupool.avg_pool(t, 3, 2, 1), lambda t: gpupool.lp_pool(t, 2, 2),
              lambda t: gpupool.global_max_pool(t), lambda t: gpupool.adaptive_avg_pool(t, 4)):
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), np.asarray(f(x)))
    values, indices = jax.jit(lambda t: gpupool.max_pool(t, 2, return_indices=True))(x)
    want_values, want_indices = gpupool.max_pool(a, 2, return_indices=True)
    assert indices.dtype == (np.int64 if jax.config.jax_enable_x64 else np.int32)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    grad = jax.grad(lambda t: gpupool.max_pool(t, 2, return_indices=True)[0].sum())(x)
    np.testing.assert_array_equal(np.asarray(grad), gpupool.max_pool_backward(
        np.ones_like(want_values), want_indices, a.shape, 2))
    (_, got_indices), (tangent, _) = jax.jvp(
        lambda t: gpupool.max_pool(t, 2, return_indices=True), (x,), (x,))
    np.testing.assert_array_equal(np.asarray(got_indices), want_indices)
    np.testing.assert_array_equal(np.asarray(tangent), want_values)


def test_jax_integer_max_under_jit():
    a = np.arange(32, dtype=np.int8).reshape(1, 2, 4, 4)
    result = jax.jit(lambda t: gpupool.max_pool(t, 2))(jnp.asarray(a))
    assert result.dtype == np.int8
    np.testing.assert_array_equal(np.asarray(result), gpupool.max_pool(a, 2))


def test_jax_vmap_of_grad_is_one_batched_call():
    """A vmapped batch arrives as extra leading (plane) dims, along any axis."""
    a = _distinct(np.random.default_rng(9), (3, 2, 5, 6), "float32")
    x = jnp.asarray(a)
    f = jax.grad(lambda t: (gpupool.max_pool(t, 2, 1) * np.arange(20.0).reshape(4, 5)).sum())
    looped = np.stack([np.asarray(f(x[:, i])) for i in range(2)], axis=1)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(f, in_axes=1, out_axes=1))(x)),
                                  looped)
    for pool in (lambda t: gpupool.lp_pool(t, 2, 3), lambda t: gpupool.avg_pool(t, 2, 1)):
        grad = jax.grad(lambda t: (pool(t) ** 2).sum())
        np.testing.assert_allclose(np.asarray(jax.vmap(grad)(x)),
                                   np.stack([np.asarray(grad(x[i])) for i in range(3)]),
                                   rtol=1e-6)


def test_jax_jacrev_batches_the_cotangents():
    a = _distinct(np.random.default_rng(10), (1, 1, 4, 4), "float32")
    jac = jax.jacrev(lambda t: gpupool.avg_pool(t, 2))(jnp.asarray(a))
    assert jac.shape == (1, 1, 2, 2, 1, 1, 4, 4)
    np.testing.assert_array_equal(np.asarray(jac).reshape(4, 16).sum(axis=0), np.full(16, 0.25))


def test_jax_traced_errors():
    x = jnp.ones((1, 1, 4, 4))
    with pytest.raises(ValueError, match="gpupool.max_pool: .*kernel_size"):
        jax.jit(lambda t: gpupool.max_pool(t, 0))(x)
    with pytest.raises(TypeError, match="gpupool.avg_pool_backward: grad_output is a traced"):
        jax.jit(lambda g: gpupool.avg_pool_backward(g, (1, 1, 4, 4), 2))(jnp.ones((1, 1, 2, 2)))


SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import gpupool
    mesh = jax.make_mesh((2, 2), ("batch", "model"))
    a = np.random.default_rng(0).standard_normal((4, 6, 8, 8)).astype(np.float32)

    def padded(spec):
        return tuple(spec) + (None,) * (4 - len(spec))
    for spec in (P("batch", "model"), P("batch", None, "model"), P(None, "model", None, "batch")):
        x = jax.device_put(a, NamedSharding(mesh, spec))
        planes = padded(spec)[:2] + (None, None)  # the spatial dims gathered
        grad = jax.grad(lambda t: (gpupool.avg_pool(t, 3, 2, 1) ** 2).sum())
        for f, kept in ((lambda t: gpupool.max_pool(t, 2), planes),
                        (lambda t: gpupool.lp_pool(t, 2, 3, 1, 1), planes),
                        (grad, padded(spec))):  # a gradient is sharded as its input
            y = jax.jit(f)(x)
            assert padded(y.sharding.spec) == kept, (spec, y.sharding)
            np.testing.assert_allclose(np.asarray(y), np.asarray(f(jnp.asarray(a))), rtol=1e-6)
        values, indices = jax.jit(lambda t: gpupool.max_pool(t, 2, return_indices=True))(x)
        assert padded(values.sharding.spec) == padded(indices.sharding.spec) == planes
        text = jax.jit(lambda t: gpupool.avg_pool(t, 2)).lower(x).compile().as_text()
        assert ("all-gather" in text) == (planes != padded(spec)), text
    # automatic axes: the sharding is unknown while tracing; XLA runs the op on the whole array
    auto = jax.make_mesh((4,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(a, NamedSharding(auto, P("batch")))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda t: gpupool.max_pool(t, 2))(x)),
                                  gpupool.max_pool(a, 2))
    print("sharded ok")
""")


def test_jax_sharded_input_keeps_its_plane_sharding():
    """Four CPU devices in a child process (XLA reads the flag once, at start-up)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "sharded ok" in done.stdout, done.stderr[-3000:]
