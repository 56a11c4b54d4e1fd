"""Gradients through the float ops in PyTorch autograd, and what every framework adapter shares.

:mod:`gpupool.interop.dlpack` hands an input here when a framework tracks it (this module
is installed in :data:`gpupool.interop.dlpack.TRACKED_CALLS` when gpupool is imported):

* PyTorch, a tensor that requires grad while grad mode is on: the op runs as a
  ``torch.autograd.Function`` (:func:`torch_call`). Its forward runs the gpupool op on the
  detached tensor through DLPack, on the tensor's device (NumPy on the CPU, CuPy on a CUDA
  GPU), and keeps what the backward needs: the indices of a max (the forward runs with
  ``return_indices=True``; a global max as an adaptive max to one position), ``x`` for Lp,
  only the input's shape for the averages. Its backward runs the matching backward op of
  :mod:`gpupool.gradients` on the same device. Returned indices are not differentiable.
  The backward is ``once_differentiable``: a second derivative through it is an error from
  PyTorch. ``out=`` with such a tensor is a ``TypeError`` (a result written in place would
  not be part of the graph); in ``torch.no_grad()`` the tensor is pooled without tracking,
  as PyTorch's own ops do.

The other ops (``max_unpool``, the backward ops) have no gradient here: a tracked input to
them is a ``TypeError`` naming the way out.
"""
from __future__ import annotations

import functools
import importlib
import inspect

from .. import gradients, ops
from .. import spec as S
from . import dlpack

#: the ops with a gradient, each with what its backward keeps from the forward: "indices"
#: (a max), "x" (Lp) or "shape" (an average: only the input's shape)
SAVED = {"max_pool": "indices", "avg_pool": "shape", "lp_pool": "x",
         "global_avg_pool": "shape", "global_max_pool": "indices",
         "adaptive_avg_pool": "shape", "adaptive_max_pool": "indices"}


@functools.cache
def _signature(op) -> inspect.Signature:
    return inspect.signature(op)


def op_arguments(op, args: tuple, kwargs: dict) -> dict:
    """``op``'s arguments after ``x``, by name, with the defaults filled in."""
    try:
        bound = _signature(op).bind(None, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"gpupool.{op.__name__}: {e}") from None
    bound.apply_defaults()
    params = dict(bound.arguments)
    del params["x"]
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


# ----------------------------------------------------------------------------- PyTorch

@functools.cache
def _torch_function():
    """The ``torch.autograd.Function`` of the pooling ops (made once PyTorch is loaded)."""
    torch = importlib.import_module("torch")
    once_differentiable = importlib.import_module("torch.autograd.function").once_differentiable

    class Pooling(torch.autograd.Function):
        """A gpupool float op: forward on the detached input, backward through
        :mod:`gpupool.gradients`; the indices of a max are outputs without gradient."""

        @staticmethod
        def forward(ctx, x, name, params, spec):
            indexed = SAVED[name] == "indices"
            values, indices = forward(name, x.detach(), params, spec, indexed)
            ctx.pooling = name, params, spec, tuple(x.shape)
            if SAVED[name] == "x":
                ctx.save_for_backward(x)
            if not indexed:
                return values
            ctx.save_for_backward(indices)
            ctx.mark_non_differentiable(indices)
            return values, indices

        @staticmethod
        @once_differentiable
        def backward(ctx, grad, *unused):
            name, params, spec, input_shape = ctx.pooling
            saved = ctx.saved_tensors[0].detach() if ctx.saved_tensors else None
            return backward(name, grad, saved, input_shape, params, spec), None, None, None

    return Pooling


def torch_call(op, x, args: tuple, kwargs: dict):
    """Run ``op`` on ``x``, a tensor that requires grad while grad mode is on, as part of the
    autograd graph."""
    name = op.__name__
    if name not in SAVED:
        first = _first(name)
        raise TypeError(f"gpupool.{name}: {first} requires grad, and gpupool has no gradient "
                        f"of {name}; pass {first}.detach() (or call it under torch.no_grad())")
    params, wanted, out = _split(name, op, args, kwargs)
    if out is not None:
        raise TypeError(f"gpupool.{name}: out cannot be used while x requires grad: a result "
                        f"written into out would not be part of the autograd graph; leave out "
                        f"None, or pass x.detach() (or call it under torch.no_grad())")
    spec = pooling_spec(name, x.shape, str(x.dtype).removeprefix("torch."), params)
    result = _torch_function().apply(x, name, params, spec)
    if SAVED[name] != "indices":
        return result
    return result if wanted else result[0]


def install() -> None:
    """Make :func:`torch_call` the path of tracked PyTorch tensors in
    :mod:`gpupool.interop.dlpack` (``import gpupool`` does this)."""
    dlpack.TRACKED_CALLS.update(torch=torch_call)
