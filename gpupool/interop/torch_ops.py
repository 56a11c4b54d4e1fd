"""The float ops as PyTorch operators: ``torch.library`` custom ops in namespace ``gpupool``.

``import gpupool`` imports this module where PyTorch is already loaded, else the first tensor
does (:mod:`gpupool.interop.dlpack`): gpupool never loads PyTorch.

* A plain tensor (untracked, with nothing intercepting it: no ``torch.compile``, export, JIT
  trace, ``torch.func`` transform or dispatch mode) runs the op at once, without PyTorch's
  dispatcher, so an eager call costs little more than on a NumPy array.
* Any other goes through ``torch.ops.gpupool.*``: one operator per float op and per backward
  op, each with a fake kernel (output shapes from :mod:`gpupool.spec`, on symbolic sizes too),
  and an autograd formula (``register_autograd``) written with these operators, so that
  compile, export, ``torch.func`` and higher derivatives see PyTorch operators throughout.
  A tracked tensor in eager mode (nothing intercepting it) runs each operator's function and
  formula as an ``autograd.Function`` instead (:func:`.torch_tensors.operators`), the node
  PyTorch's dispatcher would make of them, without the dispatcher's cost (about 100 us a
  call on the CPU); so do the formulas on such tensors. The arguments are normalised to
  values (lists of ints, a padding string) before the call: a list the caller mutates
  afterwards changes nothing.
* A max's backward runs from the indices its forward returned, without the backward ops'
  index check (which costs host syncs on a GPU); the public backward ops keep it.
* The kernels, and the eager path (allocation, streams, channels_last), are in
  :mod:`gpupool.interop.torch_tensors`.
"""
from __future__ import annotations

import torch

from .. import gradients, ops
from .. import grad_spec as G
from .. import spec as S
from ..op_table import BY_NAME, OPS
from . import autograd, dlpack
from .torch_tensors import (CHANNELS_LAST, EAGER, backward, channels_last, custom_op,
                            differentiable, fake, fake_like, operators, plain, pool, stream)

Tensor = torch.Tensor


def call(op, x, args: tuple, kwargs: dict):
    """Run the public op ``op`` on the tensor ``x`` (:mod:`gpupool.interop.dlpack` sends every
    tensor here)."""
    name = op.__name__
    if not isinstance(x, torch.Tensor):  # another type of torch's: the adapter refuses it
        return dlpack.run(op, "torch", x, args, kwargs)
    if plain(x):
        if kwargs.get("out") is None and name in EAGER:
            return EAGER[name](op, x, args, kwargs)
        with stream(x):
            return dlpack.run(op, "torch", x, args, kwargs)
    operator = _OPERATORS.get(name)
    first = "grad_output" if name.endswith("_backward") else "x"
    if operator is None:
        raise TypeError(f"gpupool.{name}: {first} requires grad or is traced (torch.compile, "
                        f"export, jit.trace, torch.func), and gpupool has no PyTorch operator "
                        f"for {name}; pass {first}.detach() (or call it under torch.no_grad()) "
                        f"outside the transformation")
    params = autograd.op_arguments(op, args, kwargs)
    if params.pop("out", None) is not None:
        raise TypeError(f"gpupool.{name}: out cannot be used while {first} requires grad or "
                        f"is traced: a result written into out would not be part of the "
                        f"autograd graph; leave out None, or pass {first}.detach() (or call "
                        f"it under torch.no_grad())")
    if torch.jit.is_tracing():
        raise TypeError(f"gpupool.{name}: torch.jit.trace is not supported; use "
                        f"torch.compile or torch.export")
    return operator(operators(x, *(v for v in params.values() if isinstance(v, Tensor))),
                    x, params)


# ----------------------------------------------------------------------------- operators
# Arguments as the operators take them: a window as (kernel_size, stride, padding,
# padding_mode, dilation, ceil_mode) with padding flat (begin, end) pairs where padding_mode
# is "" (else a padding string, resolved on the input's size).

def _window(func: str, p: dict) -> tuple:
    """The window arguments of op ``func``'s parameters ``p``, validated, as values."""
    kernel, stride, dilation, padding = S.window_arguments(func, p["kernel_size"], p["stride"],
                                                           p["padding"], p["dilation"])
    text = isinstance(padding, str)
    return (list(kernel), list(stride), [] if text else [v for pair in padding for v in pair],
            padding if text else "", list(dilation), S.check_bool(func, "ceil_mode",
                                                                   p["ceil_mode"]))


def _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode) -> dict:
    """The window arguments as the op's parameters."""
    pads = padding_mode or tuple(zip(padding[::2], padding[1::2]))
    return dict(kernel_size=tuple(kernel_size), stride=tuple(stride), padding=pads,
                dilation=tuple(dilation), ceil_mode=ceil_mode)


def _no_grads(ctx_args) -> tuple:
    return (None,) * len(ctx_args)


def _keep_format(ctx, x: Tensor, layout: str) -> None:
    """Note in ``ctx`` the memory format of a channels_last input, which its gradient keeps."""
    ctx.memory_format = CHANNELS_LAST[x.dim()] if channels_last(x, layout) else None


def _in_format(ctx, grad: Tensor) -> Tensor:
    """``grad`` in the input's memory format, so the input's gradient comes back in it."""
    if ctx.memory_format is None:
        return grad
    return grad.contiguous(memory_format=ctx.memory_format)


@custom_op
def max_pool(x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
             padding_mode: str, dilation: list[int], ceil_mode: bool,
             layout: str) -> tuple[Tensor, Tensor]:
    """gpupool.max_pool with its indices."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return pool("max_pool", x, {**params, "layout": layout}, True)


@max_pool.register_fake
def _(x, kernel_size, stride, padding, padding_mode, dilation, ceil_mode, layout):
    params = {**_window_params(kernel_size, stride, padding, padding_mode, dilation,
                               ceil_mode), "layout": layout}
    return fake("max_pool", x, params), fake("max_pool", x, params, torch.int64)


@custom_op
def max_pool_backward(grad: Tensor, indices: Tensor, input_shape: list[int],
                      kernel_size: list[int], stride: list[int], padding: list[int],
                      padding_mode: str, dilation: list[int], ceil_mode: bool, layout: str,
                      check_indices: bool) -> Tensor:
    """gpupool.max_pool_backward; ``check_indices`` False: indices gpupool's max returned."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return backward("max_pool_backward", grad, indices,
                     {"input_shape": tuple(input_shape), **params, "layout": layout},
                     trusted=not check_indices)


@max_pool_backward.register_fake
def _(grad, indices, input_shape, kernel_size, stride, padding, padding_mode, dilation,
      ceil_mode, layout, check_indices):
    return fake_like(grad, input_shape, layout)


def _gather(v: Tensor, indices: Tensor, nd: int, layout: str) -> Tensor:
    """``v`` (an input's shape) at each of a max's ``indices`` in its plane, 0 at -1: the
    derivative of a max's backward with respect to its gradient."""
    if layout == "NHWC":
        v, indices = v.movedim(-1, -nd - 1), indices.movedim(-1, -nd - 1)
    flat = indices.flatten(-nd) if nd > 1 else indices
    taken = torch.gather(v.flatten(-nd) if nd > 1 else v, -1, flat.clamp(min=0))
    taken = torch.where(flat >= 0, taken, 0).reshape(indices.shape)
    return taken.movedim(-nd - 1, -1) if layout == "NHWC" else taken


def _max_pool_setup(ctx, inputs, output):
    x, *ctx.arguments = inputs
    ctx.input_shape = list(x.shape)
    _keep_format(ctx, x, ctx.arguments[-1])
    ctx.save_for_backward(output[1])


def _max_pool_grad(ctx, grad, _):
    (indices,) = ctx.saved_tensors
    gx = operators(grad, indices).max_pool_backward(_in_format(ctx, grad), indices,
                                                     ctx.input_shape, *ctx.arguments, False)
    return (gx,) + _no_grads(ctx.arguments)


def _max_pool_backward_setup(ctx, inputs, output):
    _, indices, _, kernel_size, *_, layout, _ = inputs
    ctx.nd, ctx.layout, ctx.count = len(kernel_size), layout, len(inputs)
    ctx.save_for_backward(indices)


def _max_grad_grad(ctx, v):
    (indices,) = ctx.saved_tensors
    return (_gather(v, indices, ctx.nd, ctx.layout),) + (None,) * (ctx.count - 1)


differentiable("max_pool", _max_pool_grad, _max_pool_setup)
differentiable("max_pool_backward", _max_grad_grad, _max_pool_backward_setup)


@custom_op
def avg_pool(x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
             padding_mode: str, dilation: list[int], ceil_mode: bool, count_include_pad: bool,
             divisor_override: int | None, layout: str) -> Tensor:
    """gpupool.avg_pool."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return pool("avg_pool", x, {**params, "count_include_pad": count_include_pad,
                                 "divisor_override": divisor_override, "layout": layout}, False)


@avg_pool.register_fake
def _(x, kernel_size, stride, padding, padding_mode, dilation, ceil_mode, count_include_pad,
      divisor_override, layout):
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return fake("avg_pool", x, {**params, "count_include_pad": count_include_pad,
                                 "divisor_override": divisor_override, "layout": layout})


@custom_op
def avg_pool_backward(grad: Tensor, input_shape: list[int], kernel_size: list[int],
                      stride: list[int], padding: list[int], padding_mode: str,
                      dilation: list[int], ceil_mode: bool, count_include_pad: bool,
                      divisor_override: int | None, layout: str) -> Tensor:
    """gpupool.avg_pool_backward."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return backward("avg_pool_backward", grad, None,
                     {"input_shape": tuple(input_shape), **params,
                      "count_include_pad": count_include_pad,
                      "divisor_override": divisor_override, "layout": layout})


@avg_pool_backward.register_fake
def _(grad, input_shape, kernel_size, stride, padding, padding_mode, dilation, ceil_mode,
      count_include_pad, divisor_override, layout):
    return fake_like(grad, input_shape, layout)


@custom_op
def lp_pool(x: Tensor, p: float, kernel_size: list[int], stride: list[int],
            padding: list[int], padding_mode: str, dilation: list[int], ceil_mode: bool,
            layout: str) -> Tensor:
    """gpupool.lp_pool."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return pool("lp_pool", x, {"p": p, **params, "layout": layout}, False)


@lp_pool.register_fake
def _(x, p, kernel_size, stride, padding, padding_mode, dilation, ceil_mode, layout):
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return fake("lp_pool", x, {"p": p, **params, "layout": layout})


@custom_op
def lp_pool_backward(grad: Tensor, x: Tensor, p: float, kernel_size: list[int],
                     stride: list[int], padding: list[int], padding_mode: str,
                     dilation: list[int], ceil_mode: bool, layout: str) -> Tensor:
    """gpupool.lp_pool_backward."""
    params = _window_params(kernel_size, stride, padding, padding_mode, dilation, ceil_mode)
    return backward("lp_pool_backward", grad, x, {"p": p, **params, "layout": layout})


@lp_pool_backward.register_fake
def _(grad, x, p, kernel_size, stride, padding, padding_mode, dilation, ceil_mode, layout):
    return fake_like(grad, x.shape, layout)


def _lp_pool_setup(ctx, inputs, output):
    x, *ctx.arguments = inputs
    _keep_format(ctx, x, ctx.arguments[-1])
    ctx.save_for_backward(x)


def _lp_pool_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    gx = operators(grad, x).lp_pool_backward(_in_format(ctx, grad), x, *ctx.arguments)
    return (gx,) + _no_grads(ctx.arguments)


def _lp_pool_backward_setup(ctx, inputs, output):
    grad, x, *ctx.arguments = inputs
    ctx.save_for_backward(grad, x)


def _lp_pool_backward_grad(ctx, v):
    """The derivatives of lp_pool_backward, ``B(g, x) = s |x|**(p-1) * T(g * y**(1-p))``
    (``s = sign(x)``, ``y = lp_pool(x)``, ``S`` the sum over each window, ``T`` its
    transpose), in these operators: ``dg = y**(1-p) * S(v s |x|**(p-1))`` and ``dx = (p-1) *
    (v |x|**(p-2) * T(g y**(1-p)) - s |x|**(p-1) * T(g y**(1-2p) * S(v s |x|**(p-1))))``,
    0 where ``x`` or ``y`` is 0 as in the backward op."""
    grad, x = ctx.saved_tensors
    p, *window, layout = ctx.arguments
    ops_ = operators(v, grad, x)
    y = ops_.lp_pool(x, p, *window, layout)

    def window_sum(a):
        return ops_.avg_pool(a, *window, False, 1, layout)

    def transpose_sum(a):
        return ops_.avg_pool_backward(a, list(x.shape), *window, False, 1, layout)

    def power(a, e):  # a**e, 0 where a is 0
        return torch.where(a == 0, 0, a.abs().clamp_min(torch.finfo(a.dtype).tiny) ** e)

    slope = torch.sign(x) * power(x, p - 1)
    summed = window_sum(v * slope)
    dgrad = power(y, 1 - p) * summed
    dx = (p - 1) * (v * power(x, p - 2) * transpose_sum(grad * power(y, 1 - p))
                    - slope * transpose_sum(grad * power(y, 1 - 2 * p) * summed))
    return (dgrad, dx) + _no_grads(ctx.arguments)


differentiable("lp_pool", _lp_pool_grad, _lp_pool_setup)
differentiable("lp_pool_backward", _lp_pool_backward_grad, _lp_pool_backward_setup)


@custom_op
def adaptive_avg_pool(x: Tensor, output_size: list[int], layout: str) -> Tensor:
    """gpupool.adaptive_avg_pool."""
    return pool("adaptive_avg_pool", x, {"output_size": tuple(output_size), "layout": layout},
                 False)


@adaptive_avg_pool.register_fake
def _(x, output_size, layout):
    return fake("adaptive_avg_pool", x, {"output_size": tuple(output_size), "layout": layout})


@custom_op
def adaptive_avg_pool_backward(grad: Tensor, input_shape: list[int], output_size: list[int],
                               layout: str) -> Tensor:
    """gpupool.adaptive_avg_pool_backward."""
    return backward("adaptive_avg_pool_backward", grad, None,
                     {"input_shape": tuple(input_shape), "output_size": tuple(output_size),
                      "layout": layout})


@adaptive_avg_pool_backward.register_fake
def _(grad, input_shape, output_size, layout):
    return fake_like(grad, input_shape, layout)


@custom_op
def adaptive_max_pool(x: Tensor, output_size: list[int],
                      layout: str) -> tuple[Tensor, Tensor]:
    """gpupool.adaptive_max_pool with its indices."""
    return pool("adaptive_max_pool", x, {"output_size": tuple(output_size), "layout": layout},
                 True)


@adaptive_max_pool.register_fake
def _(x, output_size, layout):
    params = {"output_size": tuple(output_size), "layout": layout}
    return (fake("adaptive_max_pool", x, params),
            fake("adaptive_max_pool", x, params, torch.int64))


@custom_op
def adaptive_max_pool_backward(grad: Tensor, indices: Tensor, input_shape: list[int],
                               output_size: list[int], layout: str,
                               check_indices: bool) -> Tensor:
    """gpupool.adaptive_max_pool_backward; ``check_indices`` False: indices gpupool's max
    returned."""
    return backward("adaptive_max_pool_backward", grad, indices,
                     {"input_shape": tuple(input_shape), "output_size": tuple(output_size),
                      "layout": layout}, trusted=not check_indices)


@adaptive_max_pool_backward.register_fake
def _(grad, indices, input_shape, output_size, layout, check_indices):
    return fake_like(grad, input_shape, layout)


def _adaptive_max_setup(ctx, inputs, output):
    x, ctx.output_size, ctx.layout = inputs
    ctx.input_shape = list(x.shape)
    _keep_format(ctx, x, ctx.layout)
    ctx.save_for_backward(output[1])


def _adaptive_max_grad(ctx, grad, _):
    (indices,) = ctx.saved_tensors
    return (operators(grad, indices).adaptive_max_pool_backward(
        _in_format(ctx, grad), indices, ctx.input_shape, ctx.output_size, ctx.layout, False),
            None, None)


def _adaptive_max_backward_setup(ctx, inputs, output):
    _, indices, _, output_size, layout, _ = inputs
    ctx.nd, ctx.layout, ctx.count = len(output_size), layout, len(inputs)
    ctx.save_for_backward(indices)


differentiable("adaptive_max_pool", _adaptive_max_grad, _adaptive_max_setup)
differentiable("adaptive_max_pool_backward", _max_grad_grad, _adaptive_max_backward_setup)


@custom_op
def global_avg_pool(x: Tensor, spatial_dims: int, layout: str) -> Tensor:
    """gpupool.global_avg_pool."""
    return pool("global_avg_pool", x, {"spatial_dims": spatial_dims, "layout": layout}, False)


@global_avg_pool.register_fake
def _(x, spatial_dims, layout):
    return fake("global_avg_pool", x, {"spatial_dims": spatial_dims, "layout": layout})


@custom_op
def global_avg_pool_backward(grad: Tensor, input_shape: list[int], spatial_dims: int,
                             layout: str) -> Tensor:
    """gpupool.global_avg_pool_backward."""
    return backward("global_avg_pool_backward", grad, None,
                     {"input_shape": tuple(input_shape), "spatial_dims": spatial_dims,
                      "layout": layout})


@global_avg_pool_backward.register_fake
def _(grad, input_shape, spatial_dims, layout):
    return fake_like(grad, input_shape, layout)


def _linear(name: str) -> None:
    """The autograd formulas of average ``name`` and of its backward op: the backward op is
    the transpose of the average (a linear map), so its own derivative is the average. Both
    take their arguments after the tensor (and the input's shape) in the same order, the
    layout last."""
    backward_name = BY_NAME[name].gradient

    def setup(ctx, inputs, output):
        x, *ctx.arguments = inputs
        ctx.input_shape = list(x.shape)
        _keep_format(ctx, x, ctx.arguments[-1])

    def grad(ctx, g):
        gx = getattr(operators(g), backward_name)(_in_format(ctx, g), ctx.input_shape,
                                                   *ctx.arguments)
        return (gx,) + _no_grads(ctx.arguments)

    def backward_setup(ctx, inputs, output):
        _, _, *ctx.arguments = inputs

    def backward_grad(ctx, v):
        return (getattr(operators(v), name)(v, *ctx.arguments), None) + _no_grads(ctx.arguments)

    differentiable(name, grad, setup)
    differentiable(backward_name, backward_grad, backward_setup)


for _op in OPS:
    if _op.saved == "shape":  # the averages: only the input's shape is kept
        _linear(_op.name)


def _batched(name: str, outputs: int):
    """The batching rule of forward operator ``name``: every dim before the spatial ones is a
    plane dim, so a vmapped batch is one more, in front."""
    operator = getattr(torch.ops.gpupool, name)

    def rule(info, in_dims, x, *arguments):
        result = operator(x.movedim(in_dims[0], 0), *arguments)
        return result, (0,) * outputs if outputs > 1 else 0
    return rule


def _operator(op) -> str:
    """The operator that runs public op ``op``: that of the forward op its gradient belongs to
    (:data:`gpupool.op_table.OPS`), so a global max runs as the adaptive max to size 1."""
    forward = BY_NAME[op.gradient_of] if op.is_backward else op
    gradient = BY_NAME[forward.gradient]
    return gradient.name if op.is_backward else gradient.gradient_of


for _op in OPS:
    if not _op.is_backward and _op.family != "unpool" and _operator(_op) == _op.name:
        torch.library.register_vmap(f"gpupool::{_op.name}",
                                    _batched(_op.name, 2 if _op.reduction == "max" else 1))


# ----------------------------------------------------------------------------- public calls
# Each takes the operators to call (torch.ops.gpupool, or their eager autograd.Functions), the
# tensor and the public op's parameters by name (defaults filled in), and calls the operators
# with those parameters as values.

def _spatial_dims(func: str, p: dict) -> int:
    """A global pooling's ``spatial_dims``, refused as the spec refuses it."""
    n = p["spatial_dims"]
    if not (S.is_int(n) and n >= 1):
        S.global_spec(func, "avg", (), "float32", n, "NCHW")  # raises the spec's error
    return int(n)


def _sizes(func: str, p: dict) -> list:
    """An adaptive pooling's ``output_size`` as a list (an int is one per spatial dim, as the
    spec reads it, which checks each where the operator runs)."""
    size = p["output_size"]
    if isinstance(size, (tuple, list)):
        return list(size)
    return [size] * S.spatial_rank(func, size, "output_size")


def _arguments(op, p: dict) -> list:
    """The arguments of :func:`_operator`'s operator for public op ``op``, after its first
    tensor, from the op's parameters ``p``: its operand, the input's shape (where the operand
    is not the input), Lp's ``p``, the geometry (window, output size, or spatial dims), the
    average's options, the layout, and for a max's backward True (check the indices)."""
    func = op.name
    forward = BY_NAME[op.gradient_of] if op.is_backward else op
    args = [p[op.operand]] if op.operand else []
    if op.is_backward and op.operand != "x":
        args.append(list(G.check_input_shape(func, p["input_shape"])))
    if forward.reduction == "lp":
        args.append(p["p"])
    if forward.family == "window":
        args += _window(func, p)
    elif forward.family == "adaptive":
        args.append(_sizes(func, p))
    elif forward.reduction == "max":  # a global max, as the adaptive max to size 1
        args.append([1] * _spatial_dims(func, p))
    else:
        args.append(_spatial_dims(func, p))
    if "count_include_pad" in forward.options:
        args += [S.check_bool(func, "count_include_pad", p["count_include_pad"]),
                 p["divisor_override"]]
    args.append(S.check_layout(func, p["layout"]))
    if op.operand == "indices":
        args.append(True)
    return args


def _call(op):
    """The call of public op ``op`` on the operators (see above)."""
    operator = _operator(op)
    if op.is_backward and operator != op.name:  # a global max's: from the input's indices
        def global_max_backward(ops_, grad, p):
            x, ones, layout = _arguments(op, p)
            _, indices = ops_.adaptive_max_pool(x, ones, layout)
            return ops_.adaptive_max_pool_backward(grad, indices, list(x.shape), ones, layout,
                                                   False)
        return global_max_backward
    if op.reduction == "max" and not op.is_backward:
        def max_call(ops_, x, p):
            wanted = "return_indices" in op.options and S.check_bool(
                op.name, "return_indices", p["return_indices"])
            values, indices = getattr(ops_, operator)(x, *_arguments(op, p))
            return (values, indices) if wanted else values
        return max_call
    return lambda ops_, x, p: getattr(ops_, operator)(x, *_arguments(op, p))


_OPERATORS = {op.name: _call(op) for op in OPS if op.family != "unpool"}
autograd.keep_signatures(getattr(gradients if op.is_backward else ops, op.name).__wrapped__
                         for op in OPS if op.name in _OPERATORS)
