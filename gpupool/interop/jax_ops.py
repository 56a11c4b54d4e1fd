"""The float ops on traced JAX values: ``jit``, ``grad``, ``jvp``, ``vmap`` and sharding.

:mod:`gpupool.interop.dlpack` hands a traced value (inside ``jax.jit``, ``grad``, ``jvp``,
``vmap``) here; this module is installed in :data:`gpupool.interop.dlpack.TRACKED_CALLS` when
gpupool is imported, and loads JAX only when such a value arrives.

* **No host round trip**: each pooling is an XLA buffer callback
  (``jax.experimental.buffer_callback``): XLA hands the operands and the output buffers to
  gpupool where they live. On the CPU the NumPy backend reads the operands and writes the
  values straight into XLA's output buffer; on a CUDA GPU the CuPy backend does the same on
  XLA's stream (``cupy.cuda.ExternalStream``). A JAX without ``buffer_callback`` falls back to
  ``jax.pure_callback`` (operands copied to host memory, the NumPy backend there).
* **Differentiation**: the ops are ``jax.custom_jvp`` functions whose tangent is a linear
  primitive of the input's tangent whose transpose is the op's backward op (and the
  backward op's transpose the tangent map), so ``jvp``, ``jacfwd``, ``grad``, ``jacrev`` and
  ``hessian`` work, reverse mode through :mod:`gpupool.gradients`. A max's tangent is the
  input's tangent gathered at the max's indices (0 for a window without a valid tap); an
  average's is the average of the tangent; an Lp pool's
  ``y**(1-p) * sum(sign(x) * |x|**(p-1) * dx)`` over each window (0 where ``y`` or ``x`` is
  0), the sum a gpupool average with divisor 1.
* **vmap**: a batch arrives as extra leading dims, which every op takes as plane dims (NCHW
  and NHWC alike), so a batch is one call.
* **Sharding**: an input sharded over a mesh of explicit axes (``jax.make_mesh``'s default,
  visible to tracing as ``jax.typeof(x).sharding``) is pooled shard by shard
  (``jax.shard_map``) over its plane dims, which keep their sharding; spatial dims are
  gathered first. With automatic axes the sharding is not known while tracing, and XLA runs
  the callback on the whole array.

Result shapes come from the op's spec (:mod:`gpupool.spec`), validated while tracing; the
arguments are frozen then, so a list the caller changes later changes nothing. Without
``jax_enable_x64`` indices are int32, as on the eager path.
"""
from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import numpy as np

from .. import ops
from .. import spec as S
from . import dlpack
from .autograd import SAVED, backward, forward, op_arguments, pooling_spec

_CUDA = 2  # DLPack's device type of a CUDA GPU
#: the largest index that int32 holds
INT32_MAX = 2**31 - 1


class Pooling(NamedTuple):
    """One op, hashable: ``name``, its arguments after ``x`` as frozen ``(name, value)``
    pairs, and its spec on the unbatched input."""
    name: str
    params: tuple
    spec: object


def frozen(value):
    """``value`` with every list, tuple and NumPy array in it made a tuple (hashable, and
    immune to the caller changing it later)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(frozen(v) for v in value)
    return value


def _buffer_callback():
    """``jax.experimental.buffer_callback.buffer_callback``; None in a JAX without it."""
    try:
        return importlib.import_module("jax.experimental.buffer_callback").buffer_callback
    except ImportError:
        return None


def run(compute, result_types, *operands):
    """Call ``compute(outs, *arrays)``, which writes the results into ``outs`` (NumPy or CuPy
    arrays of ``result_types``), on the traced ``operands`` as NumPy/CuPy arrays: in XLA's
    buffers through a buffer callback, else through ``jax.pure_callback`` on the host."""
    jax = importlib.import_module("jax")
    types = tuple(result_types)
    buffer_callback = _buffer_callback()
    if buffer_callback is None:
        def on_host(*arrays):
            outs = tuple(np.empty(t.shape, t.dtype) for t in types)
            compute(outs, *(np.asarray(a) for a in arrays))
            return outs
        return jax.pure_callback(on_host, types, *operands, vmap_method="broadcast_all")
    return buffer_callback(functools.partial(in_buffers, compute), types,
                           vmap_method="broadcast_all")(*operands)


def in_buffers(compute, context, outs, *buffers) -> None:
    """A buffer callback's body: ``compute`` on XLA's buffers where they live, as NumPy arrays
    on the CPU, as CuPy arrays on a CUDA GPU with XLA's stream (``context.stream``) current."""
    if outs[0].__dlpack_device__()[0] != _CUDA:
        compute(tuple(np.asarray(o) for o in outs), *(np.asarray(b) for b in buffers))
        return
    cupy = importlib.import_module("cupy")
    with cupy.cuda.ExternalStream(context.stream):
        compute(tuple(cupy.asarray(o) for o in outs), *(cupy.asarray(b) for b in buffers))


def _batch(shape: tuple, core: tuple) -> tuple:
    """The leading dims of ``shape`` before its last ``len(core)``: a vmapped batch."""
    return tuple(shape[:len(shape) - len(core)])


def _linear(outs, a, *indices, pooling: Pooling, transposed: bool) -> None:
    """Write the linear map of ``pooling`` applied to ``a`` into ``outs[0]``: an average of
    ``a``; transposed, the op's backward op (a max's with its ``indices``)."""
    name, params, spec = pooling
    params = dict(params)
    if not transposed:
        getattr(ops, name)(a, **params, out=outs[0])
        return
    shape = _batch(a.shape, spec.out_shape) + spec.geom.shape
    outs[0][...] = backward(name, a, indices[0] if indices else None, shape, params, spec)


@functools.cache
def _linear_primitive():
    """The JAX primitive of the tangent map of an op and of its transpose (made once JAX is
    loaded): linear in its first operand (a max's indices are the second), each the other's
    transpose, batched as extra plane dims. An average and every transpose (the backward
    ops) run through :func:`run`; a max's gather is JAX's."""
    jax = importlib.import_module("jax")
    core = importlib.import_module("jax.extend.core")
    ad = importlib.import_module("jax.interpreters.ad")
    batching = importlib.import_module("jax.interpreters.batching")
    mlir = importlib.import_module("jax.interpreters.mlir")
    primitive = core.Primitive("gpupool_linear")

    def abstract(a, *indices, pooling, transposed):
        spec = pooling.spec
        source, result = ((spec.out_shape, spec.geom.shape) if transposed
                          else (spec.geom.shape, spec.out_shape))
        return a.update(shape=_batch(a.shape, source) + result)  # keeps a's sharding

    def lowered(a, *indices, pooling, transposed):
        if indices and not transposed:
            return _gather(jax.numpy, a, indices[0], pooling.spec.geom)
        result = abstract(jax.typeof(a), pooling=pooling, transposed=transposed)
        compute = functools.partial(_linear, pooling=pooling, transposed=transposed)
        return run(compute, (jax.ShapeDtypeStruct(result.shape, result.dtype),), a,
                   *indices)[0]

    @functools.cache
    def compiled(pooling, transposed):
        return jax.jit(functools.partial(lowered, pooling=pooling, transposed=transposed))

    def tangent(primals, tangents, **params):
        a, *indices = primals
        return primitive.bind(a, *indices, **params), primitive.bind(
            ad.instantiate_zeros(tangents[0]), *indices, **params)

    def transpose(cotangent, a, *indices, pooling, transposed):
        cotangent = ad.instantiate_zeros(cotangent)
        return [primitive.bind(cotangent, *indices, pooling=pooling,
                               transposed=not transposed)] + [None] * len(indices)

    def batched(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)  # None: unbatched
        args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
        return primitive.bind(*args, **params), 0

    primitive.def_abstract_eval(abstract)
    primitive.def_impl(lambda *operands, **params: compiled(**params)(*operands))
    ad.primitive_jvps[primitive] = tangent
    ad.primitive_transposes[primitive] = transpose
    batching.primitive_batchers[primitive] = batched
    mlir.register_lowering(primitive, mlir.lower_fun(lowered, multiple_results=False))
    return primitive


def _tangent_map(t, pooling: Pooling, *indices):
    """The tangent map of ``pooling`` (an average; a max: the gather at its ``indices``)
    applied to the traced ``t``, as a linear JAX operation."""
    return _linear_primitive().bind(t, *indices, pooling=pooling, transposed=False)


def _gather(jnp, t, indices, geom):
    """``t`` (of the input's geometry) taken at a max's per-plane ``indices``; 0 at -1."""
    nd, channels_last = geom.nd, geom.layout == "NHWC"
    if channels_last:
        t, indices = (jnp.moveaxis(a, -1, a.ndim - nd - 1) for a in (t, indices))
    flat = t.reshape(t.shape[:t.ndim - nd] + (-1,))
    where = indices.reshape(indices.shape[:indices.ndim - nd] + (-1,))
    taken = jnp.take_along_axis(flat, jnp.maximum(where, 0), axis=-1)
    taken = jnp.where(where >= 0, taken, jnp.zeros((), t.dtype)).reshape(indices.shape)
    return jnp.moveaxis(taken, -nd - 1, -1) if channels_last else taken


def _lp_sum(params: dict, spec) -> Pooling:
    """The windows' plain sums of an Lp pool: an average with divisor 1 over its geometry."""
    keys = ("kernel_size", "stride", "padding", "ceil_mode", "dilation", "layout")
    summing = {k: params[k] for k in keys} | {"count_include_pad": True,
                                              "divisor_override": 1}
    return Pooling("avg_pool", tuple(summing.items()),
                     pooling_spec("avg_pool", spec.geom.shape, spec.geom.dtype, summing))


def _plane_sharding(jax, a, geom):
    """``(mesh, a's partition spec with the spatial dims unsharded)`` where ``a`` is sharded
    over an explicit mesh, else None."""
    sharding = jax.typeof(a).sharding
    if sharding is None or sharding.mesh.empty or all(p is None for p in sharding.spec):
        return None
    spec = tuple(sharding.spec) + (None,) * (a.ndim - len(sharding.spec))
    lead = len(geom.lead)
    planes = spec[:lead] + (None,) * geom.nd + spec[lead + geom.nd:]
    return sharding.mesh, jax.sharding.PartitionSpec(*planes)


def jax_call(op, x, args: tuple, kwargs: dict):
    """Run ``op`` on ``x``, a traced JAX value: a ``jax.custom_jvp`` over buffer callbacks,
    shard by shard where ``x`` is sharded over an explicit mesh."""
    jax = importlib.import_module("jax")
    name = op.__name__
    if name not in SAVED:
        first = "grad_output" if name.endswith("_backward") else "x"
        raise TypeError(f"gpupool.{name}: {first} is a traced JAX value (inside jax.jit, "
                        f"grad or vmap), and {name} runs only eagerly on concrete arrays: "
                        f"call it outside the transformation")
    params = {k: frozen(v) for k, v in op_arguments(op, args, kwargs).items()}
    wanted = S.check_bool(name, "return_indices", params.pop("return_indices", False))
    del params["out"]  # refused for JAX before
    spec = pooling_spec(name, x.shape, np.dtype(x.dtype).name, params)
    plane = int(np.prod(spec.geom.spatial))
    if (SAVED[name] == "indices" and not jax.config.jax_enable_x64
            and plane - 1 > INT32_MAX):
        raise ValueError(f"gpupool.{name}: an input plane of {plane} positions has indices "
                         f"beyond the int32 indices of JAX without x64; enable it with "
                         f"jax.config.update('jax_enable_x64', True)")
    pool = functools.partial(_traced, jax, name, params=params, wanted=wanted)
    sharded = _plane_sharding(jax, x, spec.geom)
    if sharded is None:
        return pool(x, spec)
    mesh, planes = sharded

    def local(shard):  # the op on one shard: fewer planes, the same spatial dims
        return pool(shard, pooling_spec(name, shard.shape, spec.geom.dtype, params))
    # check_vma off: XLA's callbacks type their results without the shards' varying axes
    return jax.shard_map(local, mesh=mesh, in_specs=planes, check_vma=False,
                         out_specs=(planes, planes) if wanted else planes)(
        jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, planes)))


def _traced(jax, name: str, x, spec, *, params: dict, wanted: bool):
    """Op ``name`` on the traced ``x`` of ``spec``'s shape: values (and indices where
    ``wanted``) from a ``jax.custom_jvp`` with the tangents above."""
    jnp = jax.numpy
    geom = spec.geom
    dtype = np.dtype(geom.dtype)
    saves = SAVED[name]
    index_dtype = np.dtype(np.int64 if jax.config.jax_enable_x64 else np.int32)

    def pooled(a, indices: bool):
        batch = _batch(a.shape, geom.shape)
        types = [jax.ShapeDtypeStruct(batch + spec.out_shape, dtype)]
        if indices:
            types.append(jax.ShapeDtypeStruct(batch + spec.out_shape, index_dtype))

        def compute(outs, array):
            if not indices:
                getattr(ops, name)(array, **params, out=outs[0])
                return
            values, found = forward(name, array, params, spec, True)
            outs[0][...] = values
            outs[1][...] = found
        return run(compute, types, a)

    @jax.custom_jvp
    def values_only(a):
        return pooled(a, False)[0]

    @jax.custom_jvp
    def with_indices(a):
        return tuple(pooled(a, True))

    def tangent(primals, tangents, indexed_result: bool):
        (a,), (da,) = primals, tangents
        if saves == "indices":
            values, indices = with_indices(a)
            dy = _tangent_map(da, Pooling(name, tuple(params.items()), spec), indices)
            if not indexed_result:
                return values, dy
            return (values, indices), (dy, np.zeros(indices.shape, jax.dtypes.float0))
        y = values_only(a)
        if saves == "shape":
            return y, _tangent_map(da, Pooling(name, tuple(params.items()), spec))
        p = params["p"]
        zero = jnp.zeros((), dtype)
        a_safe, y_safe = jnp.where(a == 0, 1, a), jnp.where(y == 0, 1, y)
        weight = jnp.where(a == 0, zero, jnp.sign(a_safe) * abs(a_safe) ** (p - 1))
        scale = jnp.where(y == 0, zero, y_safe ** (1 - p))
        return y, scale * _tangent_map(weight * da, _lp_sum(params, spec))

    values_only.defjvp(functools.partial(tangent, indexed_result=False))
    with_indices.defjvp(functools.partial(tangent, indexed_result=True))
    return with_indices(x) if wanted else values_only(x)


def install() -> None:
    """Make :func:`jax_call` the path of traced JAX values in :mod:`gpupool.interop.dlpack`
    (``import gpupool`` does this)."""
    dlpack.TRACKED_CALLS["jax"] = jax_call
