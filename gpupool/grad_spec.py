"""Semantics of the backward ops: the pooling whose gradient is taken, validated from the
arguments of its forward op (:mod:`gpupool.spec`) and the input's shape, and checks of the
gradient and of the operands it comes with.

Pure Python, as :mod:`gpupool.spec`: every error a user can trigger is raised here, before
anything is allocated, the same on every backend.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Union

from . import spec as S
from .spec_cache import hash_once, memoized, state_without_hash


@dataclass(frozen=True)
class GradSpec:
    """The backward of a pooling. ``forward``: the forward op's spec, whose geometry is the
    input's (the shape of the gradient returned) and whose ``out_shape`` is the gradient's
    that comes in; ``index_dtype``: the dtype of a max's indices (None for averages)."""

    __hash__ = hash_once
    __getstate__ = state_without_hash

    forward: Union[S.WindowSpec, S.AdaptiveSpec]
    index_dtype: str | None = None

    @functools.cached_property
    def op(self) -> str:
        return self.forward.op

    @functools.cached_property
    def plane_size(self) -> int:
        """Positions in one input plane: the range of a max's indices."""
        size = 1
        for s in self.forward.geom.spatial:
            size *= s
        return size


def check_input_shape(func: str, input_shape) -> tuple[int, ...]:
    """The shape of the forward op's input: a tuple or list of ints >= 0."""
    if not isinstance(input_shape, (tuple, list)) or not all(S.is_int(s) for s in input_shape):
        S.fail(func, f"input_shape={input_shape!r} must be a tuple of ints (the shape of the "
                      f"forward op's input)", TypeError)
    if any(int(s) < 0 for s in input_shape):
        S.fail(func, f"input_shape={input_shape!r} has a negative size")
    return tuple(int(s) for s in input_shape)


def check_grad_dtype(func: str, dtype: str) -> str:
    if dtype not in S.FLOAT_DTYPES:
        S.fail(func, f"grad_output has dtype {dtype}; gradients are {', '.join(S.FLOAT_DTYPES)}",
                TypeError)
    return dtype


def _finish(func: str, forward, grad_shape, index_shape, index_dtype) -> GradSpec:
    """The spec once ``forward`` is built: the gradient's shape must be the forward output's,
    and a max's indices (shape and dtype given) the gradient's shape, of an integer dtype."""
    if tuple(grad_shape) != forward.out_shape:
        S.fail(func, f"grad_output has shape {tuple(grad_shape)}, but the pooling of an input "
                      f"of shape {forward.geom.shape} with these parameters has output shape "
                      f"{forward.out_shape}")
    if index_dtype is not None:
        if tuple(index_shape) != forward.out_shape:
            S.fail(func, f"indices has shape {tuple(index_shape)}; expected grad_output's "
                          f"{forward.out_shape}")
        if index_dtype not in S.INT_DTYPES:
            S.fail(func, f"indices has dtype {index_dtype}; expected an integer dtype (int64, "
                          f"as the max ops return)", TypeError)
    return GradSpec(forward, index_dtype)


@memoized
def window_grad_spec(func: str, op: str, grad_shape, grad_dtype: str, input_shape, kernel_size,
                     stride, padding, dilation, ceil_mode, layout, *, count_include_pad=False,
                     divisor_override=None, p=None, index_shape=None,
                     index_dtype=None) -> GradSpec:
    """The backward of max_pool (``index_*`` given), avg_pool or lp_pool."""
    check_grad_dtype(func, grad_dtype)
    forward = S.window_spec(func, op, check_input_shape(func, input_shape), grad_dtype,
                            kernel_size, stride, padding, dilation, ceil_mode, layout,
                            count_include_pad=count_include_pad,
                            divisor_override=divisor_override, p=p)
    return _finish(func, forward, grad_shape, index_shape, index_dtype)


@memoized
def adaptive_grad_spec(func: str, op: str, grad_shape, grad_dtype: str, input_shape,
                       output_size, layout, *, index_shape=None, index_dtype=None) -> GradSpec:
    """The backward of adaptive_avg_pool or adaptive_max_pool (``index_*`` given)."""
    check_grad_dtype(func, grad_dtype)
    forward = S.adaptive_spec(func, op, check_input_shape(func, input_shape), grad_dtype,
                              output_size, layout)
    return _finish(func, forward, grad_shape, index_shape, index_dtype)


@memoized
def global_grad_spec(func: str, op: str, grad_shape, grad_dtype: str, input_shape,
                     spatial_dims, layout, *, index_shape=None, index_dtype=None) -> GradSpec:
    """The backward of global_avg_pool or global_max_pool (``index_*`` given)."""
    check_grad_dtype(func, grad_dtype)
    forward = S.global_spec(func, op, check_input_shape(func, input_shape), grad_dtype,
                            spatial_dims, layout)
    return _finish(func, forward, grad_shape, index_shape, index_dtype)


def check_operand(func: str, name: str, shape, dtype: str, spec: GradSpec) -> None:
    """``x`` (lp_pool, global_max_pool) must be the forward op's input: its shape and the
    gradient's dtype."""
    if tuple(shape) != spec.forward.geom.shape or dtype != spec.forward.geom.dtype:
        S.fail(func, f"{name} has shape {tuple(shape)} and dtype {dtype}; expected the forward "
                      f"input's shape {spec.forward.geom.shape} and grad_output's dtype "
                      f"{spec.forward.geom.dtype}")


def check_index_range(func: str, low: int, high: int, spec: GradSpec) -> None:
    """A max's indices, given their smallest and largest value, must lie in the input plane or
    be -1 (a window with no valid tap, which passes no gradient)."""
    if low < -1 or high >= spec.plane_size:
        S.fail(func, f"indices span [{low}, {high}], outside the input plane [0, "
                      f"{spec.plane_size}) of spatial size {spec.forward.geom.spatial} (-1, a "
                      f"window with no valid tap, passes no gradient)")
