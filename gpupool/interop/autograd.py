"""What the framework adapters of the float ops share: each op's arguments, spec, forward
with what its backward keeps (:data:`SAVED`), and backward through :mod:`gpupool.gradients`.

* PyTorch: the float ops and their backward ops are PyTorch operators with autograd
  formulas (:mod:`gpupool.interop.torch_ops`).
* JAX: traced values go through buffer callbacks with ``custom_jvp`` tangents
  (:mod:`gpupool.interop.jax_ops`).
"""
from __future__ import annotations

import inspect

from .. import gradients, ops
from .. import spec as S
from ..op_table import BY_NAME, DIFFERENTIABLE

#: the ops with a gradient, each with what its backward keeps from the forward: "indices"
#: (a max), "x" (Lp) or "shape" (an average: only the input's shape)
SAVED = {name: BY_NAME[name].saved for name in DIFFERENTIABLE}


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
    row = BY_NAME[name]
    op, p = row.reduction, params
    if row.family == "window":
        return S.window_spec(name, op, tuple(shape), dtype, p["kernel_size"], p["stride"],
                             p["padding"], p["dilation"], p["ceil_mode"], p["layout"],
                             return_indices=op == "max",
                             count_include_pad=p.get("count_include_pad", False),
                             divisor_override=p.get("divisor_override"), p=p.get("p"))
    if row.family == "global":
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
    """The gradient of op ``name``'s input from ``grad``, its output's, through the backward op
    its row names (:mod:`gpupool.op_table`); ``saved`` is what :data:`SAVED` names (None for a
    shape). The backward op takes the forward op's arguments by name, plus the input's shape,
    the saved operand and the output size (a global max's gradient is an adaptive max's)."""
    row = BY_NAME[name]
    gradient = getattr(gradients, row.gradient)
    known = {**params, "input_shape": input_shape, "output_size": getattr(spec, "out_spatial",
                                                                          None)}
    if row.saved != "shape":
        known[row.saved] = saved
    positional, keyword, _ = _parameters(gradient)
    return gradient(grad, **{key: known[key] for key in positional + keyword if key != "out"})
