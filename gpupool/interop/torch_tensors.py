"""Running gpupool's float ops and backward ops on PyTorch tensors: the kernels of the
operators in :mod:`gpupool.interop.torch_ops`, the eager path of plain tensors, and the
operators' ``autograd.Function`` for tracked tensors in eager mode.

* Outputs are allocated by PyTorch on the input's device (on a GPU: PyTorch's caching
  allocator), and on a GPU the work runs on the caller's current PyTorch stream (CuPy's
  ``ExternalStream``), so ``out=`` and the results are ordered with the caller's work. A max's
  indices on a GPU are the one exception: CuPy allocates them.
* A 4-D (5-D) ``channels_last`` (``channels_last_3d``) tensor in layout NCHW runs the NHWC
  path on its memory as it lies, and its results are ``channels_last`` too.
* A max's backward can run from the indices its forward returned, without the backward ops'
  index check (which costs host syncs on a GPU).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import types

import torch

from .. import gradients, ops
from .. import grad_spec as G
from .. import spec as S
from ..arrays import dtype_name as numpy_dtype_name
from ..op_table import BY_NAME, OPS
from . import autograd, dlpack

Tensor = torch.Tensor
#: the memory format whose layout is NHWC, by rank
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
#: gpupool's names of the float dtypes (the spec refuses any other by its name)
_DTYPES = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}


def untraced(x) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (no subclass) in eager mode: no compile, export,
    JIT trace, ``torch.func`` transform or dispatch mode intercepting it."""
    return (type(x) is torch.Tensor
            and not torch.compiler.is_compiling()  # first: compile traces none of the next
            and not torch.jit.is_tracing()
            and not torch._C._are_functorch_transforms_active()
            and not torch._C._len_torch_dispatch_stack()
            and not torch._C._is_torch_function_mode_enabled())


def plain(x) -> bool:
    """Whether gpupool may run on ``x``'s memory at once: untraced and untracked by autograd."""
    return not (x.requires_grad and torch.is_grad_enabled()) and untraced(x)


#: each operator with an autograd formula as ``torch.autograd.Function.apply``: the same
#: function, setup and formula without the dispatcher, for tracked tensors in eager mode
EAGER_TRACKED = types.SimpleNamespace()
_FUNCTIONS: dict = {}  # each operator's function, by name


def custom_op(fn):
    """``fn`` as the operator ``gpupool::<its name>``."""
    _FUNCTIONS[fn.__name__] = fn
    return torch.library.custom_op(f"gpupool::{fn.__name__}", fn, mutates_args=())


def differentiable(name: str, backward, setup_context) -> None:
    """Operator ``name``'s autograd formula, registered with PyTorch and as an
    ``autograd.Function`` in :data:`EAGER_TRACKED` (what PyTorch's dispatcher makes of it
    too, behind a costlier call)."""
    torch.library.register_autograd(f"gpupool::{name}", backward, setup_context=setup_context)
    run = _FUNCTIONS[name]

    def forward(ctx, *inputs):  # with ctx: apply binds a separate setup_context by inspect
        output = run(*inputs)
        setup_context(ctx, inputs, output)
        return output
    function = type(f"gpupool_{name}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    setattr(EAGER_TRACKED, name, function.apply)


def operators(first: Tensor, *others: Tensor):
    """The operators to call on ``first`` and ``others``: where all are ``torch.Tensor`` (no
    subclass) and nothing intercepts them, their ``autograd.Function`` in
    :data:`EAGER_TRACKED`; else ``torch.ops.gpupool``."""
    if untraced(first) and all(type(t) is torch.Tensor for t in others):
        return EAGER_TRACKED
    return torch.ops.gpupool


def stream(t):
    """On a GPU: CuPy's current stream made the caller's current PyTorch stream."""
    if t.device.type != "cuda":
        return contextlib.nullcontext()
    cupy = sys.modules["cupy"]  # loaded by the view of t
    return cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream,
                                    t.device.index)


def array_view(func: str, t: Tensor, name: str):
    """The NumPy (CPU) or CuPy (CUDA) array over ``t``'s memory."""
    if (t.is_cpu and t.dtype in _DTYPES and t.layout is torch.strided
            and not t.is_neg()):  # the common case: what the checks below would pass
        return (t.detach() if t.requires_grad else t).numpy()
    return dlpack.view(func, "torch", dlpack.device(func, t, name), t, name)


def channels_last(x: Tensor, layout: str) -> bool:
    """Whether ``x``, an NCHW input, lies as NHWC: channels_last (not also contiguous)."""
    fmt = CHANNELS_LAST.get(x.dim())
    return (layout == "NCHW" and fmt is not None and not x.is_contiguous()
            and x.is_contiguous(memory_format=fmt))


def dtype_name(t: Tensor) -> str:
    """``t``'s dtype by gpupool's name (the spec refuses one it does not take)."""
    return _DTYPES.get(t.dtype) or str(t.dtype).removeprefix("torch.")


def _from_numpy(a) -> Tensor:
    """The NumPy array ``a`` as a CPU tensor sharing its memory (bfloat16: through its bits,
    which PyTorch's ``from_numpy`` takes)."""
    if numpy_dtype_name(a.dtype) == "bfloat16":
        return torch.from_numpy(a.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(a)


def _run(name: str, func, x: Tensor, arrays: tuple, shape, **params):
    """``func`` (op ``name`` on arrays) on ``arrays``, its result as a tensor on ``x``'s
    device: on the CPU NumPy's array as it is, on a GPU written into a tensor of ``shape``
    that PyTorch allocates (``shape()`` gives it), on the caller's stream."""
    if x.is_cpu:
        result = func(*arrays, **params)
        return tuple(map(_from_numpy, result)) if isinstance(result, tuple) else \
            _from_numpy(result)
    values = torch.empty(tuple(shape()), dtype=x.dtype, device=x.device)
    with stream(x):
        result = func(*arrays, **params, out=array_view(name, values, "out"))
    return (values, torch.from_dlpack(result[1])) if isinstance(result, tuple) else values


def pool(name: str, x: Tensor, params: dict, indices: bool):
    """Op ``name``'s values (and int64 indices where ``indices``) on ``x``, with the op's
    arguments ``params``, as tensors on ``x``'s device."""
    nhwc = channels_last(x, params["layout"])
    if nhwc:
        x = x.movedim(1, -1)
        params = {**params, "layout": "NHWC"}
    result = _run(name, getattr(ops, name), x, (array_view(name, x, "x"),),
                  lambda: autograd.pooling_spec(name, x.shape, dtype_name(x), params).out_shape,
                  **params, **({"return_indices": True} if indices else {}))
    if nhwc:
        return (tuple(r.movedim(-1, 1) for r in result) if indices
                else result.movedim(-1, 1))
    return result


def backward(name: str, grad: Tensor, operand: Tensor | None, params: dict,
             trusted: bool = False) -> Tensor:
    """Backward op ``name`` on ``grad`` (and ``operand``, its indices or ``x``) with its
    arguments ``params``, as a tensor on ``grad``'s device; ``trusted``: indices a max of
    gpupool returned (not checked)."""
    nhwc = channels_last(grad, params["layout"])
    if nhwc:
        grad = grad.movedim(1, -1)
        operand = None if operand is None else operand.movedim(1, -1)
        params = {**params, "layout": "NHWC"}
        if "input_shape" in params:
            shape = tuple(params["input_shape"])
            params["input_shape"] = (shape[0],) + shape[2:] + (shape[1],)
    arrays = (array_view(name, grad, "grad_output"),)
    if operand is not None:
        arrays += (array_view(name, operand, BY_NAME[name].operand),)
    shape = params["input_shape"] if "input_shape" in params else operand.shape
    if trusted:
        result = _run(name, functools.partial(gradients.max_backward_of_own_indices,
                                              spec=_max_grad_spec(name, *arrays, params)),
                      grad, arrays, lambda: shape)
    else:
        result = _run(name, getattr(gradients, name), grad, arrays, lambda: shape, **params)
    return result.movedim(-1, 1) if nhwc else result


def _max_grad_spec(name: str, grad, indices, p: dict) -> G.GradSpec:
    """The spec of a max's backward, as the backward op builds it."""
    dtype = numpy_dtype_name(grad.dtype)
    if BY_NAME[name].family == "window":
        return G.window_grad_spec(name, "max", grad.shape, dtype, p["input_shape"],
                                  p["kernel_size"], p["stride"], p["padding"], p["dilation"],
                                  p["ceil_mode"], p["layout"], index_shape=indices.shape,
                                  index_dtype=numpy_dtype_name(indices.dtype))
    return G.adaptive_grad_spec(name, "max", grad.shape, dtype, p["input_shape"],
                                p["output_size"], p["layout"], index_shape=indices.shape,
                                index_dtype=numpy_dtype_name(indices.dtype))


def _eager_pool(name: str):
    def run(op, x: Tensor, args: tuple, kwargs: dict):
        if x.is_cpu and x.is_contiguous():  # no memory format to keep: NumPy's op as it is
            result = op(array_view(name, x, "x"), *args, **kwargs)
            return tuple(map(_from_numpy, result)) if isinstance(result, tuple) else \
                _from_numpy(result)
        params = autograd.op_arguments(op, args, kwargs)
        wanted = params.pop("return_indices", False)
        del params["out"]
        return pool(name, x, params, S.check_bool(name, "return_indices", wanted))
    return run


def _eager_backward(name: str):
    def run(op, grad: Tensor, args: tuple, kwargs: dict):
        params = autograd.op_arguments(op, args, kwargs)
        del params["out"]
        operand = BY_NAME[name].operand
        other = None if operand is None else params.pop(operand)
        if other is not None and not isinstance(other, torch.Tensor):
            raise TypeError(f"gpupool.{name}: {operand} is a {dlpack.type_name(other)}; "
                            f"expected a torch.Tensor like grad_output")
        return backward(name, grad, other, params)
    return run


#: the ops whose plain eager calls (``out`` None) run here, each called as
#: ``run(op, x, args, kwargs)`` with ``op`` the public op on NumPy/CuPy arrays: on a GPU their
#: results are allocated by PyTorch
EAGER = {op.name: (_eager_backward if op.is_backward else _eager_pool)(op.name) for op in OPS
         if op.family != "unpool"}


def out_shape(name: str, x: Tensor, params: dict) -> tuple:
    """The output shape of op ``name`` on ``x`` (sizes concrete or symbolic), from
    :mod:`gpupool.spec`: concrete sizes validate every argument as the op does."""
    shape = tuple(x.shape)
    layout = params["layout"]
    if all(type(s) is int for s in shape):
        return autograd.pooling_spec(name, shape, dtype_name(x), params).out_shape
    if name.startswith("global_"):
        nd = params["spatial_dims"]
        out = (1,) * nd
    elif name.startswith("adaptive_"):
        out = tuple(params["output_size"])
        nd = len(out)
    else:
        nd = len(params["kernel_size"])
    lead = len(shape) - nd - (layout == "NHWC")
    if lead < 0:
        S.fail(name, f"x of rank {len(shape)} has too few dims for {nd} spatial dims in "
                     f"layout {layout}")
    spatial = shape[lead:lead + nd]
    if "kernel_size" in params:
        p = params
        pads = S.resolve_padding(name, p["padding"], nd, spatial, p["kernel_size"],
                                 p["stride"], p["dilation"])
        out = tuple(S.output_length(*a, p["ceil_mode"]) for a in
                    zip(spatial, p["kernel_size"], p["stride"], pads, p["dilation"]))
    return shape[:lead] + tuple(out) + shape[lead + nd:]


def fake(name: str, x: Tensor, params: dict, dtype=None) -> Tensor:
    """An empty tensor as op ``name`` returns (shape, dtype, memory format)."""
    result = x.new_empty(out_shape(name, x, params), dtype=dtype)
    if channels_last(x, params["layout"]):
        return result.contiguous(memory_format=CHANNELS_LAST[x.dim()])
    return result


def fake_like(grad: Tensor, shape, layout: str) -> Tensor:
    result = grad.new_empty(tuple(shape))
    if channels_last(grad, layout):
        return result.contiguous(memory_format=CHANNELS_LAST[grad.dim()])
    return result

