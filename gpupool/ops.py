"""The public pooling functions: validate through :mod:`gpupool.spec`, then run the backend
that matches the input's array type (NumPy in -> NumPy out, CuPy in -> CuPy out)."""
from __future__ import annotations

import functools
from typing import Callable, Literal, ParamSpec, Sequence, TypeVar, Union, overload

import numpy as np

from . import plans
from . import spec as S
from .arrays import Array, ArrayLike, as_array, backend_of, dtype_name
from . import backends
from .backends import device_scope, foreign_handler, on_current_device

Size = Union[int, Sequence[int]]
Padding = Union[int, Sequence[int], Sequence[Sequence[int]], str]


Params = ParamSpec("Params")
Result = TypeVar("Result")


def accepts_foreign(op: Callable[Params, Result]) -> Callable[Params, Result]:
    """Let ``op`` take Dask arrays and DLPack tensors: such an input goes to its handler
    (:func:`gpupool.backends.foreign_handler`), which runs ``op`` on NumPy/CuPy data. The
    result has ``op``'s signature, for readers and type checkers alike."""
    @functools.wraps(op)
    def dispatch(x, /, *args, **kwargs):  # positional-only: a keyword ``x`` is op's own
        if type(x) is np.ndarray:  # the common case, first
            return op(x, *args, **kwargs)
        handler = foreign_handler(x)
        if handler is None:
            return op(x, *args, **kwargs)
        return handler.call(op, x, *args, **kwargs)
    return dispatch  # type: ignore[return-value]  # op's parameters, x taken first


def _window_plan(func: str, x, backend: str, arguments: tuple, build: Callable):
    """``(spec, run)`` for this call, through the plan cache (:mod:`gpupool.plans`):
    ``build()`` makes the spec (validating the arguments) and ``run(x, spec, out, indices)``
    is the backend's window entry point prepared for that spec."""
    def plan():
        spec = build()
        return spec, backends.load(backend).prepare_window(spec)
    return plans.cached(func, backend, x, arguments, plan)


def _adaptive_plan(func: str, x, backend: str, arguments: tuple, build: Callable):
    """``(spec, run)`` as :func:`_window_plan`, ``run`` the backend's adaptive entry point."""
    return plans.cached(func, backend, x, arguments,
                        lambda: (build(), backends.load(backend).adaptive))


def output_array(func: str, out, shape, dtype, x, backend: str, xp):
    """The array to write into: a fresh one, or ``out`` after checks (a NumPy subclass such as
    ``np.memmap`` viewed as a plain ``numpy.ndarray`` over the same memory)."""
    if out is None:
        return xp.empty(shape, dtype=dtype)
    if isinstance(out, np.ma.MaskedArray):
        raise TypeError(f"gpupool.{func}: out is a numpy.ma.MaskedArray; its mask would be left "
                        f"as it is: pass a plain array")
    if backend_of(out) != backend:
        raise TypeError(f"gpupool.{func}: out is a {type(out).__module__}.{type(out).__name__}; "
                        f"expected a {backend} array like the input "
                        f"({type(x).__module__}.{type(x).__name__})")
    if getattr(out, "device", None) != getattr(x, "device", None):
        raise ValueError(f"gpupool.{func}: out is on device {out.device}, the input on {x.device}")
    S.check_out(func, out.shape, dtype_name(out.dtype), out.dtype.isnative, shape,
                dtype_name(dtype))
    if not out.flags.c_contiguous or not getattr(out.flags, "writeable", True):
        raise ValueError(f"gpupool.{func}: out must be a writeable C-contiguous array")
    if xp.may_share_memory(out, x):
        raise ValueError(f"gpupool.{func}: out must not overlap the input")
    return out if backend == "cupy" or type(out) is np.ndarray else out.view(np.ndarray)


def _run(func: str, x, backend, xp, plan, out, indices_needed: bool = False):
    spec, run = plan
    if out is None:  # the common case: fresh arrays, no checks
        if on_current_device(x, xp):
            return _fresh(x, spec, run, xp, indices_needed)
        with x.device:
            return _fresh(x, spec, run, xp, indices_needed)
    with device_scope(x, backend):
        result = output_array(func, out, spec.out_shape, x.dtype, x, backend, xp)
        indices = xp.empty(spec.out_shape, dtype=np.int64) if indices_needed else None
        if result.size:
            run(x, spec, result, indices)
    return (out, indices) if indices_needed else out


def _fresh(x, spec, run, xp, indices_needed: bool):
    """``run`` into a fresh result (and fresh int64 indices) on the current device."""
    result = xp.empty(spec.out_shape, dtype=x.dtype)
    indices = xp.empty(spec.out_shape, dtype=np.int64) if indices_needed else None
    if result.size:
        run(x, spec, result, indices)
    return (result, indices) if indices_needed else result


@overload
def max_pool(x: ArrayLike, kernel_size: Size, stride: Size | None = ..., padding: Padding = ...,
             dilation: Size = ..., ceil_mode: bool = ..., *, return_indices: Literal[False] = ...,
             layout: str = ..., out: Array | None = ...) -> Array: ...
@overload
def max_pool(x: ArrayLike, kernel_size: Size, stride: Size | None = ..., padding: Padding = ...,
             dilation: Size = ..., ceil_mode: bool = ..., *, return_indices: Literal[True],
             layout: str = ..., out: Array | None = ...) -> tuple[Array, Array]: ...
@overload
def max_pool(x: ArrayLike, kernel_size: Size, stride: Size | None = ..., padding: Padding = ...,
             dilation: Size = ..., ceil_mode: bool = ..., *, return_indices: bool,
             layout: str = ..., out: Array | None = ...) -> Array | tuple[Array, Array]: ...
@accepts_foreign
def max_pool(x: ArrayLike, kernel_size: Size, stride: Size | None = None, padding: Padding = 0,
             dilation: Size = 1, ceil_mode: bool = False, *, return_indices: bool = False,
             layout: str = "NCHW", out: Array | None = None) -> Array | tuple[Array, Array]:
    """Max over each window; padded taps never win.

    ``len(kernel_size)`` spatial dims (an int means 2), every dim before them is a plane dim
    (NHWC: channels last, spatial dims just before). NaN propagates; ties keep the first
    position; a window with no valid tap gives -inf (the dtype minimum for integers) and index
    -1. With ``return_indices`` also returns int64 flat row-major positions inside each input
    plane (PyTorch convention). Float and integer dtypes.

    >>> max_pool(np.arange(16.).reshape(1, 1, 4, 4), 2)
    array([[[[ 5.,  7.], [13., 15.]]]])
    """
    x, backend, xp = as_array("max_pool", x)
    plan = _window_plan("max_pool", x, backend,
                        (kernel_size, stride, padding, dilation, ceil_mode, layout, return_indices),
                        lambda: S.window_spec("max_pool", "max", x.shape, dtype_name(x.dtype),
                                              kernel_size, stride, padding, dilation, ceil_mode,
                                              layout, return_indices=return_indices))
    return _run("max_pool", x, backend, xp, plan, out, plan[0].return_indices)


@accepts_foreign
def avg_pool(x: ArrayLike, kernel_size: Size, stride: Size | None = None, padding: Padding = 0,
             ceil_mode: bool = False, count_include_pad: bool = False,
             divisor_override: int | None = None, *, dilation: Size = 1, layout: str = "NCHW",
             out: Array | None = None) -> Array:
    """Mean over each window.

    The divisor is the number of valid taps (``count_include_pad=False``, the default, as
    ONNX/TensorFlow; PyTorch's default is True), or the taps inside input + explicit padding
    but never the ceil-mode overhang (``True``), or ``divisor_override`` (an int in
    [1, 2**31 - 1]). An empty window gives 0. Float dtypes only (float16 and bfloat16
    accumulate in float32).

    >>> avg_pool(np.arange(16.).reshape(1, 1, 4, 4), 2)
    array([[[[ 2.5,  4.5], [10.5, 12.5]]]])
    """
    x, backend, xp = as_array("avg_pool", x)
    plan = _window_plan("avg_pool", x, backend,
                        (kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override, dilation, layout),
                        lambda: S.window_spec("avg_pool", "avg", x.shape, dtype_name(x.dtype),
                                              kernel_size, stride, padding, dilation, ceil_mode,
                                              layout, count_include_pad=count_include_pad,
                                              divisor_override=divisor_override))
    return _run("avg_pool", x, backend, xp, plan, out)


@accepts_foreign
def lp_pool(x: ArrayLike, p: float, kernel_size: Size, stride: Size | None = None,
            padding: Padding = 0, dilation: Size = 1, ceil_mode: bool = False, *,
            layout: str = "NCHW", out: Array | None = None) -> Array:
    """``(sum |x|**p) ** (1/p)`` over the valid taps of each window (ONNX LpPool; PyTorch
    omits the abs). ``p`` is a real number from the smallest normal to the largest finite value
    of the accumulator (float32 for float16/bfloat16/float32, float64 for float64), so p and 1/p
    are finite and nonzero there. Float dtypes only.

    >>> lp_pool(np.array([[[3., -4.]]]), 2, (2,))
    array([[[5.]]])
    """
    x, backend, xp = as_array("lp_pool", x)
    plan = _window_plan("lp_pool", x, backend,
                        (p, kernel_size, stride, padding, dilation, ceil_mode, layout),
                        lambda: S.window_spec("lp_pool", "lp", x.shape, dtype_name(x.dtype),
                                              kernel_size, stride, padding, dilation, ceil_mode,
                                              layout, p=p))
    return _run("lp_pool", x, backend, xp, plan, out)


def _global(func: str, op: str, x, spatial_dims, layout, out):
    x, backend, xp = as_array(func, x)
    plan = _adaptive_plan(func, x, backend, (spatial_dims, layout),
                          lambda: S.global_spec(func, op, x.shape, dtype_name(x.dtype),
                                                spatial_dims, layout))
    return _run(func, x, backend, xp, plan, out)


@accepts_foreign
def global_avg_pool(x: ArrayLike, *, spatial_dims: int = 2, layout: str = "NCHW",
                    out: Array | None = None) -> Array:
    """Mean over the last ``spatial_dims`` spatial dims; they are kept with size 1.

    >>> global_avg_pool(np.ones((2, 3, 7, 7), np.float32)).shape
    (2, 3, 1, 1)
    """
    return _global("global_avg_pool", "avg", x, spatial_dims, layout, out)


@accepts_foreign
def global_max_pool(x: ArrayLike, *, spatial_dims: int = 2, layout: str = "NCHW",
                    out: Array | None = None) -> Array:
    """Max over the spatial dims (NaN propagates); they are kept with size 1.

    >>> global_max_pool(np.arange(8.).reshape(1, 2, 2, 2))
    array([[[[3.]], [[7.]]]])
    """
    return _global("global_max_pool", "max", x, spatial_dims, layout, out)


@accepts_foreign
def adaptive_avg_pool(x: ArrayLike, output_size: Size, *, layout: str = "NCHW",
                      out: Array | None = None) -> Array:
    """Mean over adaptive windows: output i spans ``[floor(i*I/O), ceil((i+1)*I/O))``.

    >>> adaptive_avg_pool(np.arange(6.).reshape(1, 1, 6), (2,))
    array([[[1., 4.]]])
    """
    x, backend, xp = as_array("adaptive_avg_pool", x)
    plan = _adaptive_plan("adaptive_avg_pool", x, backend, (output_size, layout),
                          lambda: S.adaptive_spec("adaptive_avg_pool", "avg", x.shape,
                                                  dtype_name(x.dtype), output_size, layout))
    return _run("adaptive_avg_pool", x, backend, xp, plan, out)


@overload
def adaptive_max_pool(x: ArrayLike, output_size: Size, *, return_indices: Literal[False] = ...,
                      layout: str = ..., out: Array | None = ...) -> Array: ...
@overload
def adaptive_max_pool(x: ArrayLike, output_size: Size, *, return_indices: Literal[True],
                      layout: str = ..., out: Array | None = ...) -> tuple[Array, Array]: ...
@overload
def adaptive_max_pool(x: ArrayLike, output_size: Size, *, return_indices: bool,
                      layout: str = ..., out: Array | None = ...
                      ) -> Array | tuple[Array, Array]: ...
@accepts_foreign
def adaptive_max_pool(x: ArrayLike, output_size: Size, *, return_indices: bool = False,
                      layout: str = "NCHW", out: Array | None = None
                      ) -> Array | tuple[Array, Array]:
    """Max over adaptive windows (as :func:`adaptive_avg_pool`), optionally with indices
    (as :func:`max_pool`).

    >>> adaptive_max_pool(np.arange(6.).reshape(1, 1, 6), (2,))
    array([[[2., 5.]]])
    """
    x, backend, xp = as_array("adaptive_max_pool", x)
    plan = _adaptive_plan("adaptive_max_pool", x, backend, (output_size, return_indices, layout),
                          lambda: S.adaptive_spec("adaptive_max_pool", "max", x.shape,
                                                  dtype_name(x.dtype), output_size, layout,
                                                  return_indices=return_indices))
    return _run("adaptive_max_pool", x, backend, xp, plan, out, plan[0].return_indices)


@accepts_foreign
def max_unpool(x: ArrayLike, indices: ArrayLike, kernel_size: Size, stride: Size | None = None,
               padding: Padding = 0, output_size: Sequence[int] | None = None, *,
               dilation: Size = 1, layout: str = "NCHW", out: Array | None = None) -> Array:
    """Scatter ``x`` into zeros at ``indices`` (flat positions in each output plane, as
    returned by :func:`max_pool` with the same kernel_size, stride, padding and dilation).

    The output spatial size is ``D = (I-1)*s - pb - pe + d*(k-1) + 1``, or ``output_size``
    (spatial dims or the full shape), each dim of which must lie strictly between ``D - s`` and
    ``D + s`` as in PyTorch (see :func:`gpupool.spec.unpool_sizes` for pads larger than PyTorch
    allows and for ``"same"`` padding, which needs ``output_size``), else ``ValueError``:
    indices pooled from another size would land at wrong positions. An index -1 (max_pool's
    index of a window with no valid tap) is skipped: its value is not written. Any other index
    outside the plane raises ``ValueError`` (a given ``out`` may have been written by then);
    on the GPU that check costs one device-to-host sync, and it also tells whether every
    index lies in its own window (as max_pool's do): where windows do not overlap and they all
    do, the GPU gathers, writing each output once (int64 indices of windows that tile the
    output: checked as the gather reads them); otherwise it zero-fills and scatters. Where
    indices repeat, which value lands is unspecified.

    >>> y, i = max_pool(np.arange(4.).reshape(1, 1, 2, 2), 2, return_indices=True)
    >>> max_unpool(y, i, 2)
    array([[[[0., 0.], [0., 3.]]]])
    """
    func = "max_unpool"
    x, backend, xp = as_array(func, x)
    indices, ibackend, _ = as_array(func, indices, "indices")
    if ibackend != backend:
        raise TypeError(f"gpupool.{func}: indices is a {ibackend} array but x is a {backend} array")
    spec = S.unpool_spec(func, x.shape, dtype_name(x.dtype), indices.shape, dtype_name(indices.dtype),
                         kernel_size, stride, padding, output_size, layout, dilation=dilation)
    if getattr(indices, "device", None) != getattr(x, "device", None):
        raise ValueError(f"gpupool.{func}: indices is on device {indices.device}, x on {x.device}")
    with device_scope(x, backend):
        result = output_array(func, out, spec.out_shape, x.dtype, x, backend, xp)
        if out is not None and xp.may_share_memory(out, indices):
            raise ValueError(f"gpupool.{func}: out must not overlap indices")
        in_plane = not result.size or backends.load(backend).unpool(x, spec, result, indices)
        if indices.size and not (in_plane and result.size):
            S.check_unpool_indices(func, int(indices.min()), int(indices.max()), spec)
    return result if out is None else out
