"""The backward ops: the gradient of each float pooling's input from the gradient of its
output, on the backend of ``grad_output`` (NumPy or CuPy; PyTorch, JAX and Dask as for the
forward ops).

Each takes the forward op's parameters, with the same defaults, and returns an array of the
forward input's shape and ``grad_output``'s dtype. Every result is deterministic: the CUDA
kernels gather per input element in the order the NumPy backend sums
(:mod:`gpupool.cpu.backward`), so the two give the same bits (Lp up to the rounding of
``pow``). Sums run in float32 for float16 and bfloat16, as the forward ops.
"""
from __future__ import annotations

from typing import Sequence

from . import grad_spec as G
from .arrays import Array, ArrayLike, as_array, dtype_name
from . import backends
from .backends import device_scope
from .ops import Padding, Size, accepts_foreign, adaptive_max_pool, lp_pool, output_array
from .windows import fail_outside_windows


def _operand(func: str, name: str, a, grad, backend: str):
    """``a`` as an array of ``grad``'s backend and device."""
    a, other, _ = as_array(func, a, name)
    if other != backend:
        raise TypeError(f"gpupool.{func}: {name} is a {other} array but grad_output is a "
                        f"{backend} array")
    if getattr(a, "device", None) != getattr(grad, "device", None):
        raise ValueError(f"gpupool.{func}: {name} is on device {a.device}, grad_output on "
                         f"{grad.device}")
    return a


def _check_indices(func: str, indices, spec: G.GradSpec, backend: str) -> None:
    """Indices in the input plane, each naming a tap of its own window (or -1); on the GPU
    one pass and one host sync."""
    if not indices.size:
        return
    in_plane, in_windows = backends.load(backend).index_rule(indices, spec.forward, True)
    if not in_plane:
        G.check_index_range(func, int(indices.min()), int(indices.max()), spec)
    if not in_windows:
        fail_outside_windows(func)


def _run(func: str, spec: G.GradSpec, grad, backend: str, xp, out, checks: bool = False,
         **operands):
    """The input's gradient, from ``grad`` and the ``operands`` (already checked, but for a
    max's indices where ``checks``: checked as the gradient is taken, with the
    ``ValueError`` of :func:`_check_indices`, ``out``'s contents then unspecified)."""
    with device_scope(grad, backend):
        result = output_array(func, out, spec.forward.geom.shape, grad.dtype, grad, backend, xp)
        if out is not None and any(xp.may_share_memory(out, a) for a in operands.values()
                                   if a is not None):
            raise ValueError(f"gpupool.{func}: out must not overlap {', '.join(operands)}")
        computing = backends.load(backend)
        if not checks:
            if result.size:
                computing.backward(grad, spec, result, **operands)
        elif not (result.size and computing.checked_max_backward(grad, spec, result,
                                                                 operands["indices"])):
            _check_indices(func, operands["indices"], spec, backend)
            if result.size:  # the kernel found a fault that the rule does not
                fail_outside_windows(func)
    return result if out is None else out


def _grad(func: str, grad_output):
    grad, backend, xp = as_array(func, grad_output, "grad_output")
    return grad, backend, xp, dtype_name(grad.dtype)


def max_backward_of_own_indices(grad_output, indices, spec: G.GradSpec, out=None):
    """The gradient of a max (``spec``: max_pool's or adaptive_max_pool's backward) from
    indices that gpupool's forward returned itself, so lie in their windows: the backward ops'
    index check (host syncs on a GPU) is skipped. Arrays of one backend and device."""
    func = spec.forward.geom.func
    grad, backend, xp, _ = _grad(func, grad_output)
    return _run(func, spec, grad, backend, xp, out, indices=indices)


@accepts_foreign
def max_pool_backward(grad_output: ArrayLike, indices: ArrayLike, input_shape: Sequence[int],
                      kernel_size: Size, stride: Size | None = None, padding: Padding = 0,
                      dilation: Size = 1, ceil_mode: bool = False, *, layout: str = "NCHW",
                      out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.max_pool`'s input: each output's gradient goes to the
    position its index names (``indices`` as ``max_pool(..., return_indices=True)`` returned
    them for an input of ``input_shape``), summed where windows overlap; -1 passes nothing.
    An index outside its window is a ``ValueError`` (on the GPU that check syncs; a given
    ``out`` may have been written by then).

    >>> y, i = max_pool(np.arange(16.).reshape(1, 1, 4, 4), 2, return_indices=True)
    >>> max_pool_backward(np.ones_like(y), i, (1, 1, 4, 4), 2)[0, 0]
    array([[0., 0., 0., 0.], [0., 1., 0., 1.], [0., 0., 0., 0.], [0., 1., 0., 1.]])
    """
    func = "max_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    indices = _operand(func, "indices", indices, grad, backend)
    spec = G.window_grad_spec(func, "max", grad.shape, dtype, input_shape, kernel_size, stride,
                              padding, dilation, ceil_mode, layout, index_shape=indices.shape,
                              index_dtype=dtype_name(indices.dtype))
    return _run(func, spec, grad, backend, xp, out, True, indices=indices)


@accepts_foreign
def avg_pool_backward(grad_output: ArrayLike, input_shape: Sequence[int], kernel_size: Size,
                      stride: Size | None = None, padding: Padding = 0, ceil_mode: bool = False,
                      count_include_pad: bool = False, divisor_override: int | None = None, *,
                      dilation: Size = 1, layout: str = "NCHW",
                      out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.avg_pool`'s input: each valid tap of a window receives the
    window's gradient divided by its divisor (the forward's), summed over the windows that
    cover it; padding receives nothing.

    >>> avg_pool_backward(np.ones((1, 1, 1, 1)), (1, 1, 2, 2), 2)
    array([[[[0.25, 0.25], [0.25, 0.25]]]])
    """
    func = "avg_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    spec = G.window_grad_spec(func, "avg", grad.shape, dtype, input_shape, kernel_size, stride,
                              padding, dilation, ceil_mode, layout,
                              count_include_pad=count_include_pad,
                              divisor_override=divisor_override)
    return _run(func, spec, grad, backend, xp, out)


@accepts_foreign
def lp_pool_backward(grad_output: ArrayLike, x: ArrayLike, p: float, kernel_size: Size,
                     stride: Size | None = None, padding: Padding = 0, dilation: Size = 1,
                     ceil_mode: bool = False, *, layout: str = "NCHW",
                     out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.lp_pool`'s input ``x``: ``sign(x) * |x|**(p-1) *
    y**(1-p)`` summed over the windows that cover each tap (``y`` each window's output, which
    this recomputes); 0 where ``x`` or ``y`` is 0.

    >>> lp_pool_backward(np.ones((1, 1)), np.array([[3., -4.]]), 2, (2,))
    array([[ 0.6, -0.8]])
    """
    func = "lp_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    x = _operand(func, "x", x, grad, backend)
    spec = G.window_grad_spec(func, "lp", grad.shape, dtype, x.shape, kernel_size, stride,
                              padding, dilation, ceil_mode, layout, p=p)
    G.check_operand(func, "x", x.shape, dtype_name(x.dtype), spec)
    y = lp_pool(x, p, kernel_size, stride, padding, dilation, ceil_mode, layout=layout)
    return _run(func, spec, grad, backend, xp, out, x=x, y=y)


@accepts_foreign
def global_avg_pool_backward(grad_output: ArrayLike, input_shape: Sequence[int], *,
                             spatial_dims: int = 2, layout: str = "NCHW",
                             out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.global_avg_pool`'s input: each position receives its
    plane's gradient divided by the plane's size.

    >>> global_avg_pool_backward(np.ones((1, 1, 1, 1)), (1, 1, 1, 4))
    array([[[[0.25, 0.25, 0.25, 0.25]]]])
    """
    func = "global_avg_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    spec = G.global_grad_spec(func, "avg", grad.shape, dtype, input_shape, spatial_dims, layout)
    return _run(func, spec, grad, backend, xp, out)


@accepts_foreign
def global_max_pool_backward(grad_output: ArrayLike, x: ArrayLike, *, spatial_dims: int = 2,
                             layout: str = "NCHW", out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.global_max_pool`'s input ``x``: the plane's gradient goes
    to its first maximum (its last NaN where it has one, as PyTorch), which this finds again.

    >>> global_max_pool_backward(np.ones((1, 1, 1, 1)), np.array([[[[1., 3., 3.]]]]))
    array([[[[0., 1., 0.]]]])
    """
    func = "global_max_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    x = _operand(func, "x", x, grad, backend)
    spec = G.global_grad_spec(func, "max", grad.shape, dtype, x.shape, spatial_dims, layout,
                              index_shape=grad.shape, index_dtype="int64")
    G.check_operand(func, "x", x.shape, dtype_name(x.dtype), spec)
    _, indices = adaptive_max_pool(x, spec.forward.out_spatial, return_indices=True,
                                   layout=layout)
    return _run(func, spec, grad, backend, xp, out, indices=indices)


@accepts_foreign
def adaptive_avg_pool_backward(grad_output: ArrayLike, input_shape: Sequence[int],
                               output_size: Size, *, layout: str = "NCHW",
                               out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.adaptive_avg_pool`'s input: each position receives, summed
    over the adaptive windows that cover it, the window's gradient divided by its size.

    >>> adaptive_avg_pool_backward(np.ones((1, 1, 2)), (1, 1, 3), (2,))
    array([[[0.5, 1. , 0.5]]])
    """
    func = "adaptive_avg_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    spec = G.adaptive_grad_spec(func, "avg", grad.shape, dtype, input_shape, output_size,
                                layout)
    return _run(func, spec, grad, backend, xp, out)


@accepts_foreign
def adaptive_max_pool_backward(grad_output: ArrayLike, indices: ArrayLike,
                               input_shape: Sequence[int], output_size: Size, *,
                               layout: str = "NCHW", out: Array | None = None) -> Array:
    """Gradient of :func:`gpupool.adaptive_max_pool`'s input, from its indices, as
    :func:`max_pool_backward`.

    >>> y, i = adaptive_max_pool(np.array([[[1., 3., 2.]]]), (2,), return_indices=True)
    >>> adaptive_max_pool_backward(np.ones_like(y), i, (1, 1, 3), (2,))
    array([[[0., 2., 0.]]])
    """
    func = "adaptive_max_pool_backward"
    grad, backend, xp, dtype = _grad(func, grad_output)
    indices = _operand(func, "indices", indices, grad, backend)
    spec = G.adaptive_grad_spec(func, "max", grad.shape, dtype, input_shape, output_size,
                                layout, index_shape=indices.shape,
                                index_dtype=dtype_name(indices.dtype))
    return _run(func, spec, grad, backend, xp, out, True, indices=indices)
