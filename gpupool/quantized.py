"""Quantized (int8/uint8) pooling, bit-identical on every backend.

A code ``q`` of a :class:`QArray` stands for the real value ``scale * (q - zero_point)``; a padded
tap has real value 0 (code = zero point). Shapes, padding forms, the ceil rule and layouts are
those of the float ops (:mod:`gpupool.spec` validates everything, errors name
``gpupool.quantized.<func>`` and the parameter).

* :func:`max_pool`: max of the codes over the valid taps; padding never wins, a window with no
  valid tap gives the dtype minimum; the result keeps scale and zero point.
* :func:`avg_pool`, :func:`global_avg_pool`, :func:`adaptive_avg_pool`:
  ``acc = sum(q - zp_in)`` over the valid taps (int32, int64 where a window could overflow
  int32), ``divisor`` as the float average (``count_include_pad`` rule included), then::

      q_out = saturate(zp_out + round(acc * scale / (out_scale * divisor)))

  exactly, as if evaluated with rational numbers (``scale`` and ``out_scale`` are taken as the
  exact binary values of their float64s). With the default ``out_scale``/``out_zero_point``
  (the input's) this is ``zp + round(acc / divisor)``. ``round`` is ``"half_away_from_zero"``
  (TFLite / CMSIS-NN, the default) or ``"half_to_even"``. An empty window gives ``zp_out``.

How the rounding is made exact with integer arithmetic only (:func:`requant_table`)
-----------------------------------------------------------------------------------------
Both roundings are odd functions, so ``round(acc * c) = sign(acc) * f(|acc|)`` with
``c = scale / (out_scale * divisor)`` and ``f(x) = min(round(x * c), LEVELS)``: clamping at
``LEVELS = 256`` changes nothing, because ``zp_out +- 256`` saturates for every zero point of
both dtypes. ``f`` is a non-decreasing step function of the integer ``x``, so it is pinned
down by its thresholds ``T[v] = min{x : f(x) >= v}``, ``v = 0..LEVELS+1`` (``T[0] = 0``,
``T[LEVELS+1]`` = beyond any accumulator). The host computes them exactly from the rational
``c`` with Python integers, e.g. ``T[v] = ceil((2v - 1) * den / (2 * num))`` for
half-away-from-zero (``c = num/den``), plus one where ``x * c`` is exactly ``v - 1/2`` and
``v`` is odd for half-to-even. Per divisor it also computes a TFLite-style fixed-point
multiplier ``M`` and shift ``sh`` with ``M / 2**sh ~= c``: as many bits as keep ``x * M`` below
2**31 and ``sh`` at most 30 (32-bit arithmetic on the GPU) where that leaves 11 or more, else
31 bits (fewer only for accumulators beyond 2**31). Each output then costs::

    x  = min(|acc|, xcap)                     # xcap = T[LEVELS]: f is LEVELS from there on
    v  = clamp((x * M + 2**(sh-1)) >> sh, 0, LEVELS)   # x * M < 2**62 (int64)
    v += (x >= T[v + 1]) - (x < T[v])         # the exact correction
    q  = saturate(zp_out + sign(acc) * v)

Why it is exact: the relative error of ``M / 2**sh`` is below ``2**-nbits`` (``nbits >= 11``
always), and ``x * c < 2 * LEVELS + 1`` for ``x <= xcap``, so the candidate is within one of
``f(x)``; ``f(x) = max{v : T[v] <= x}``, so the two exact comparisons against ``T`` choose
between ``v - 1``, ``v`` and ``v + 1``. (A bare fixed-point multiplier cannot be exact in
general: two 53-bit scales give a ratio whose rounding boundaries lie ~2**-60 apart. It is
exactly the near-tie cases the comparisons fix.) Both backends read the same host table, so
CPU and GPU agree to the bit.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, Sequence, Union

from . import plans
from . import quantized_spec as QS
from .arrays import Array, ArrayLike, as_array, backend_of, dtype_name, is_dask_array
from . import backends
from .backends import device_scope, on_current_device
from .ops import Params, Result
from .quantized_spec import (LEVELS, RANGES, ROUNDINGS, QArray, avg_plan, check_qdtype,
                             check_scale, check_zero_point, out_params, requant_table)
from .windows import to_float32, to_float64

Size = Union[int, Sequence[int]]
Padding = Union[int, Sequence[int], Sequence[Sequence[int]], str]


def _qarray(func: str, q) -> QArray:
    if not isinstance(q, QArray):
        raise TypeError(f"gpupool.quantized.{func}: q must be a gpupool.quantized.QArray, got "
                        f"{type(q).__module__}.{type(q).__name__}")
    return q


def quantize(x: ArrayLike, scale: float, zero_point: int = 0, dtype: str = "int8") -> QArray:
    """``saturate(round_half_to_even(x / scale) + zero_point)`` as ``dtype`` (int8 or uint8).

    ``x / scale`` is evaluated in float64; infinities saturate; NaN raises ``ValueError`` (it
    has no code). NumPy in -> NumPy codes, CuPy in -> CuPy codes, Dask in -> lazy Dask codes
    (the NaN check then runs when computed).

    >>> quantize(np.array([0.25, 0.75, -1.0]), 0.5).data.tolist()
    [0, 2, -2]
    """
    if is_dask_array(x):
        return _dask_adapter().quantize(quantize, x, scale, zero_point, dtype)
    x, backend, xp = as_array("quantized.quantize", x)
    name = check_qdtype("quantize", dtype)
    scale = check_scale("quantize", "scale", scale)
    zero_point = check_zero_point("quantize", "zero_point", zero_point, name)
    if x.dtype.kind not in "fiu":
        raise TypeError(f"gpupool.quantized.quantize: x has dtype {x.dtype}; expected a "
                        f"float16/32/64 or integer array (convert others, such as bfloat16, "
                        f"to float32 first)")
    with device_scope(x, backend):
        y = to_float64(x, xp) / scale
        if bool(xp.isnan(y).any()):
            raise ValueError("gpupool.quantized.quantize: x contains NaN, which has no code")
        lo, hi = RANGES[name]
        codes = xp.clip(xp.rint(y) + zero_point, lo, hi).astype(name)
    return QArray(codes, scale, zero_point)


def dequantize(q: QArray) -> Array:
    """``scale * (q - zero_point)`` as float32 (the float64 product rounded once), on the
    codes' device.

    >>> dequantize(QArray(np.array([0, 3], np.uint8), 0.5, 1)).tolist()
    [-0.5, 1.0]
    """
    q = _qarray("dequantize", q)
    data = q.data
    xp = (importlib.import_module("dask.array") if is_dask_array(data)
          else as_array("quantized.dequantize", data)[2])
    with device_scope(data, backend_of(data)):  # nothing for NumPy and Dask codes
        return to_float32((data.astype("float64") - q.zero_point) * q.scale, xp)


def _average(func: str, q, windowed: bool, arguments: tuple, spec_of, out_scale,
             out_zero_point, rounding) -> QArray:
    """A quantized average: its spec (``spec_of(codes)``, which validates the geometry), the
    backend's entry point (sliding windows where ``windowed``, else adaptive), requantization
    plan and output scale from the plan cache, then the codes of the result."""
    q = _qarray(func, q)
    data, backend, xp = as_array(f"quantized.{func}", q.data)

    def build():
        dtype, scale, zp_out, mode = out_params(func, q, out_scale, out_zero_point, rounding)
        spec = spec_of(data)
        plan = avg_plan(spec, dtype, q.scale, q.zero_point, scale, zp_out, mode)
        computing = backends.load(backend)
        run = computing.prepare_qavg_window(spec) if windowed else computing.qavg_adaptive
        return spec, run, plan, scale
    spec, impl, plan, scale = plans.cached(
        f"quantized.{func}", backend, data,
        arguments + (out_scale, out_zero_point, rounding, q.scale, q.zero_point), build)
    return QS.trusted_qarray(_run(data, xp, spec, impl, plan), scale, plan.zp_out)


def _run(data, xp, spec, impl, *extra):
    """The codes of the op: ``impl(data, spec, out, *extra)`` into a fresh array, on the
    input's device."""
    if on_current_device(data, xp):
        return _fresh(data, xp, spec, impl, extra)  # no device to enter
    with data.device:
        return _fresh(data, xp, spec, impl, extra)


def _fresh(data, xp, spec, impl, extra: tuple):
    out = xp.empty(spec.out_shape, dtype=data.dtype)
    if out.size:
        impl(data, spec, out, *extra)
    return out


def _dask_adapter():
    return importlib.import_module("gpupool.interop.dask")


def _accepts_dask(op: Callable[Params, Result]) -> Callable[Params, Result]:
    """Let the quantized ``op`` take a QArray whose codes are a Dask array: the result's codes
    are then a lazy Dask array, bit-identical to the in-memory op. The result has ``op``'s
    signature."""
    @functools.wraps(op)
    def dispatch(q, *args, **kwargs):
        if isinstance(q, QArray) and is_dask_array(q.data):
            return _dask_adapter().call_quantized(op, q, *args, **kwargs)
        return op(q, *args, **kwargs)
    return dispatch  # type: ignore[return-value]  # op's parameters, q taken first


@_accepts_dask
def max_pool(q: QArray, kernel_size: Size, stride: Size | None = None, padding: Padding = 0,
             dilation: Size = 1, ceil_mode: bool = False, *, layout: str = "NCHW") -> QArray:
    """Max of the codes over each window (as :func:`gpupool.max_pool`, values only).

    Padding never wins; a window with no valid tap gives the dtype minimum. The result keeps
    ``q``'s scale and zero point (max commutes with the increasing dequantization).

    >>> max_pool(QArray(np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4), 0.1), 2).data
    array([[[[ 5,  7], [13, 15]]]], dtype=int8)
    """
    q = _qarray("max_pool", q)
    data, backend, xp = as_array("quantized.max_pool", q.data)

    def build():
        spec = QS.window_spec("max_pool", "max", data.shape, dtype_name(data.dtype),
                              kernel_size, stride, padding, dilation, ceil_mode, layout)
        return spec, backends.load(backend).prepare_qmax_window(spec)
    spec, impl = plans.cached("quantized.max_pool", backend, data,
                              (kernel_size, stride, padding, dilation, ceil_mode, layout), build)
    return QS.trusted_qarray(_run(data, xp, spec, impl), q.scale, q.zero_point)


@_accepts_dask
def avg_pool(q: QArray, kernel_size: Size, stride: Size | None = None, padding: Padding = 0,
             ceil_mode: bool = False, count_include_pad: bool = False, *,
             out_scale: float | None = None, out_zero_point: int | None = None,
             rounding: str = "half_away_from_zero", layout: str = "NCHW") -> QArray:
    """Average over each window, requantized exactly (module docstring).

    ``q_out = saturate(zp_out + round(acc * scale / (out_scale * divisor)))`` with
    ``acc = sum(q - zp_in)`` over the valid taps; the divisor counts valid taps, or with
    ``count_include_pad`` also the explicit padding (never the ceil-mode overhang).
    ``out_scale`` / ``out_zero_point`` default to the input's. ``rounding`` is
    ``"half_away_from_zero"`` or ``"half_to_even"`` (in any case); anything else is a
    ``ValueError``.

    >>> avg_pool(QArray(np.array([[[1, 2, 4, 4]]], np.int8), 1.0), (2,)).data
    array([[[2, 4]]], dtype=int8)
    """
    return _average("avg_pool", q, True,
                    (kernel_size, stride, padding, ceil_mode, count_include_pad, layout),
                    lambda data: QS.window_spec("avg_pool", "avg", data.shape,
                                                dtype_name(data.dtype), kernel_size, stride,
                                                padding, 1, ceil_mode, layout, count_include_pad),
                    out_scale, out_zero_point, rounding)


@_accepts_dask
def global_avg_pool(q: QArray, *, spatial_dims: int = 2, out_scale: float | None = None,
                    out_zero_point: int | None = None, rounding: str = "half_away_from_zero",
                    layout: str = "NCHW") -> QArray:
    """Average over the last ``spatial_dims`` spatial dims (kept with size 1), requantized as
    :func:`avg_pool`.

    >>> global_avg_pool(QArray(np.array([[[[1, 2], [2, 2]]]], np.uint8), 1.0)).data
    array([[[[2]]]], dtype=uint8)
    """
    return _average("global_avg_pool", q, False, (spatial_dims, layout),
                    lambda data: QS.global_spec("global_avg_pool", data.shape,
                                                dtype_name(data.dtype), spatial_dims, layout),
                    out_scale, out_zero_point, rounding)


@_accepts_dask
def adaptive_avg_pool(q: QArray, output_size: Size, *, out_scale: float | None = None,
                      out_zero_point: int | None = None, rounding: str = "half_away_from_zero",
                      layout: str = "NCHW") -> QArray:
    """Average over adaptive windows ``[floor(i*I/O), ceil((i+1)*I/O))``, requantized as
    :func:`avg_pool`.

    >>> adaptive_avg_pool(QArray(np.arange(6, dtype=np.int8).reshape(1, 1, 6), 1.0), (2,)).data
    array([[[1, 4]]], dtype=int8)
    """
    return _average("adaptive_avg_pool", q, False, (output_size, layout),
                    lambda data: QS.adaptive_spec("adaptive_avg_pool", data.shape,
                                                  dtype_name(data.dtype), output_size, layout),
                    out_scale, out_zero_point, rounding)


__all__ = ["QArray", "quantize", "dequantize", "max_pool", "avg_pool", "global_avg_pool",
           "adaptive_avg_pool", "requant_table", "ROUNDINGS", "LEVELS"]
