"""Gradients through the float ops: PyTorch autograd, and JAX's ``grad``, ``jit`` and ``vmap``.

:mod:`gpupool.interop.dlpack` hands a traced JAX value here (this module is installed in
:data:`gpupool.interop.dlpack.TRACKED_CALLS` when gpupool is imported):

* PyTorch: the float ops and their backward ops are PyTorch operators with autograd
  formulas (:mod:`gpupool.interop.torch_ops`), which use :func:`op_arguments` and
  :func:`pooling_spec` from here.
* JAX, a traced value (inside ``jit``, ``grad``, ``vmap``): the op is a ``jax.custom_vjp``
  whose forward and backward call gpupool through ``jax.pure_callback`` on NumPy arrays on
  the host (a round trip through host memory where the array lives on a GPU). Result shapes
  come from the op's spec (:mod:`gpupool.spec`), validated while tracing. Callbacks run with
  ``vmap_method="broadcast_all"``: a vmapped batch arrives as extra leading dims, which every
  op takes as plane dims (NCHW and NHWC alike), so a batch costs one call. Reverse mode only
  (``jax.jvp`` of a ``custom_vjp`` is an error from JAX). Without ``jax_enable_x64``
  indices are int32, as on the eager path.

The other ops (``max_unpool``, the backward ops) have no gradient here: a tracked input to
them is a ``TypeError`` naming the way out.
"""
from __future__ import annotations

import functools
import importlib
import inspect

import numpy as np

from .. import gradients, ops
from .. import spec as S
from . import dlpack

#: the ops with a gradient, each with what its backward keeps from the forward: "indices"
#: (a max), "x" (Lp) or "shape" (an average: only the input's shape)
SAVED = {"max_pool": "indices", "avg_pool": "shape", "lp_pool": "x",
         "global_avg_pool": "shape", "global_max_pool": "indices",
         "adaptive_avg_pool": "shape", "adaptive_max_pool": "indices"}
#: the largest index that int32 holds
INT32_MAX = 2**31 - 1


#: each op's parameters after its first, by op: (positional names, keyword-only names,
#: defaults by name), plain tuples and dicts that torch.compile traces (:func:`op_arguments`
#: binds by hand: tracing ``inspect.Signature.bind`` breaks the graph). :func:`keep_signatures`
#: fills it before any trace, which would otherwise guard on its size.
_PARAMETERS: dict = {}


def keep_signatures(ops_) -> None:
    """Keep the parameters of ``ops_`` now (the functions behind the public ops)."""
    for op in ops_:
        _parameters(op)


def _parameters(op) -> tuple:
    found = _PARAMETERS.get(op)
    if found is None:
        params = list(inspect.signature(op).parameters.values())[1:]
        found = _PARAMETERS[op] = (
            tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD),
            tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY),
            {p.name: p.default for p in params if p.default is not p.empty})
    return found


def op_arguments(op, args: tuple, kwargs: dict) -> dict:
    """``op``'s arguments after its first (``x`` or ``grad_output``), by name, with the
    defaults filled in; a ``TypeError`` as Python's where they do not fit its signature."""
    positional, keyword, defaults = _parameters(op)
    name = op.__name__
    if len(args) > len(positional):
        raise TypeError(f"gpupool.{name}: takes {len(positional) + 1} positional arguments "
                        f"but {len(args) + 1} were given")
    params = dict(zip(positional, args))
    for key, value in kwargs.items():
        if key in params:
            raise TypeError(f"gpupool.{name}: got multiple values for argument '{key}'")
        if key not in positional and key not in keyword:
            raise TypeError(f"gpupool.{name}: got an unexpected keyword argument '{key}'")
        params[key] = value
    for key in positional + keyword:
        if key not in params:
            if key not in defaults:
                raise TypeError(f"gpupool.{name}: missing a required argument: '{key}'")
            params[key] = defaults[key]
    return params


def pooling_spec(name: str, shape, dtype: str, params: dict):
    """The spec of op ``name`` on an input of ``shape`` and ``dtype`` (validating every
    argument); a max is specified with indices, which its backward needs."""
    op = name.split("_")[-2]  # "max", "avg" or "lp"
    p = params
    if name in ("max_pool", "avg_pool", "lp_pool"):
        return S.window_spec(name, op, tuple(shape), dtype, p["kernel_size"], p["stride"],
                             p["padding"], p["dilation"], p["ceil_mode"], p["layout"],
                             return_indices=op == "max",
                             count_include_pad=p.get("count_include_pad", False),
                             divisor_override=p.get("divisor_override"), p=p.get("p"))
    if name.startswith("global_"):
        return S.global_spec(name, op, tuple(shape), dtype, p["spatial_dims"], p["layout"])
    return S.adaptive_spec(name, op, tuple(shape), dtype, p["output_size"], p["layout"],
                           return_indices=op == "max")


def forward(name: str, x, params: dict, spec, indices: bool):
    """``(values, indices)`` of op ``name`` on ``x`` (a NumPy/CuPy array or an untracked
    tensor), indices (a max's only) where ``indices``, else None."""
    if not indices:
        return getattr(ops, name)(x, **params), None
    if name == "global_max_pool":
        return ops.adaptive_max_pool(x, spec.out_spatial, return_indices=True,
                                     layout=params["layout"])
    return getattr(ops, name)(x, **params, return_indices=True)


def backward(name: str, grad, saved, input_shape: tuple, params: dict, spec):
    """The gradient of op ``name``'s input from ``grad``, its output's; ``saved`` is what
    :data:`SAVED` names (None for a shape)."""
    p = params
    if name == "max_pool":
        return gradients.max_pool_backward(grad, saved, input_shape, p["kernel_size"],
                                           p["stride"], p["padding"], p["dilation"],
                                           p["ceil_mode"], layout=p["layout"])
    if name == "avg_pool":
        return gradients.avg_pool_backward(grad, input_shape, p["kernel_size"], p["stride"],
                                           p["padding"], p["ceil_mode"],
                                           p["count_include_pad"], p["divisor_override"],
                                           dilation=p["dilation"], layout=p["layout"])
    if name == "lp_pool":
        return gradients.lp_pool_backward(grad, saved, p["p"], p["kernel_size"], p["stride"],
                                          p["padding"], p["dilation"], p["ceil_mode"],
                                          layout=p["layout"])
    if name == "global_avg_pool":
        return gradients.global_avg_pool_backward(grad, input_shape,
                                                  spatial_dims=p["spatial_dims"],
                                                  layout=p["layout"])
    if name == "adaptive_avg_pool":
        return gradients.adaptive_avg_pool_backward(grad, input_shape, p["output_size"],
                                                    layout=p["layout"])
    # adaptive_max_pool, and global_max_pool as an adaptive max to one position
    return gradients.adaptive_max_pool_backward(grad, saved, input_shape, spec.out_spatial,
                                                layout=p["layout"])


def _first(name: str) -> str:
    """The name of op ``name``'s first parameter."""
    return "grad_output" if name.endswith("_backward") else "x"


def _split(name: str, op, args: tuple, kwargs: dict):
    """``(params, return_indices, out)``: the op's arguments without the last two."""
    params = op_arguments(op, args, kwargs)
    wanted = S.check_bool(name, "return_indices", params.pop("return_indices", False))
    return params, wanted, params.pop("out")


# ----------------------------------------------------------------------------- JAX

def jax_call(op, x, args: tuple, kwargs: dict):
    """Run ``op`` on ``x``, a traced JAX value, as a ``jax.custom_vjp`` over
    ``jax.pure_callback``."""
    jax = importlib.import_module("jax")
    name = op.__name__
    if name not in SAVED:
        raise TypeError(f"gpupool.{name}: {_first(name)} is a traced JAX value (inside "
                        f"jax.jit, grad or vmap), and {name} runs only eagerly on concrete "
                        f"arrays: call it outside the transformation")
    params, wanted, _ = _split(name, op, args, kwargs)  # out: refused for JAX before
    dtype = np.dtype(x.dtype)
    spec = pooling_spec(name, x.shape, dtype.name, params)
    saves = SAVED[name]
    index_dtype = np.dtype(np.int64 if jax.config.jax_enable_x64 else np.int32)
    plane = int(np.prod(spec.geom.spatial))
    if saves == "indices" and index_dtype == np.int32 and plane - 1 > INT32_MAX:
        raise ValueError(f"gpupool.{name}: an input plane of {plane} positions has indices "
                         f"beyond the int32 indices of JAX without x64; enable it with "
                         f"jax.config.update('jax_enable_x64', True)")
    values_type = jax.ShapeDtypeStruct(spec.out_shape, dtype)
    indices_type = jax.ShapeDtypeStruct(spec.out_shape, index_dtype)
    input_type = jax.ShapeDtypeStruct(tuple(x.shape), dtype)

    def host_forward(a, indices: bool):
        values, found = forward(name, np.asarray(a), params, spec, indices)
        return (values, found.astype(index_dtype, copy=False)) if indices else values

    def host_backward(grad, *saved):
        grad = np.asarray(grad)
        lead = grad.shape[:grad.ndim - len(spec.out_shape)]  # a vmapped batch
        return backward(name, grad, np.asarray(saved[0]) if saved else None,
                        lead + spec.geom.shape, params, spec)

    def callback(host, result_type, *operands):
        return jax.pure_callback(host, result_type, *operands, vmap_method="broadcast_all")

    indexed = saves == "indices"

    @jax.custom_vjp
    def pooling(a):
        if wanted:
            return callback(functools.partial(host_forward, indices=True),
                            (values_type, indices_type), a)
        return callback(functools.partial(host_forward, indices=False), values_type, a)

    def pooling_forward(a):
        result = callback(functools.partial(host_forward, indices=indexed),
                          (values_type, indices_type) if indexed else values_type, a)
        saved = {"indices": result[1] if indexed else None, "x": a, "shape": None}[saves]
        if indexed and not wanted:
            result = result[0]
        return result, saved

    def pooling_backward(saved, cotangent):
        grad = cotangent[0] if wanted else cotangent
        operands = (grad,) if saved is None else (grad, saved)
        return (callback(host_backward, input_type, *operands),)

    pooling.defvjp(pooling_forward, pooling_backward)
    return pooling(x)


def install() -> None:
    """Make :func:`jax_call` the path of traced JAX values in :mod:`gpupool.interop.dlpack`
    (``import gpupool`` does this)."""
    dlpack.TRACKED_CALLS.update(jax=jax_call)
