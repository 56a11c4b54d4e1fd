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
multiplier ``M`` (31 bits, ``2**30 <= M < 2**31``, fewer only for accumulators beyond 2**31)
and shift ``sh`` with ``M / 2**sh ~= c``. Each output then costs::

    x  = min(|acc|, xcap)                     # xcap = T[LEVELS]: f is LEVELS from there on
    v  = clamp((x * M + 2**(sh-1)) >> sh, 0, LEVELS)   # int64, x * M < 2**62
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

import dataclasses
import functools
import importlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence, Union

import numpy as np

from . import spec as S
from .backends import (Array, ArrayLike, as_array, backend_of, device_scope, dtype_name,
                       implementation, is_dask_array)

Size = Union[int, Sequence[int]]
Padding = Union[int, Sequence[int], Sequence[Sequence[int]], str]

QDTYPES = ("int8", "uint8")
ROUNDINGS = ("half_away_from_zero", "half_to_even")
LEVELS = 256  # |round(acc * c)| is clamped here: zp_out +- 256 saturates for every zp
HEAD = 3  # table columns before the thresholds: M, sh, xcap
_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}
_SCALE_MIN = 5e-324  # the smallest float64 > 0


def _fail(func: str, message: str, exc: type = ValueError):
    raise exc(f"gpupool.quantized.{func}: {message}")


def _check_scale(func: str, name: str, scale) -> float:
    """A finite float64 > 0 (the requantization takes its exact binary value)."""
    return S.check_real(f"quantized.{func}", name, scale, _SCALE_MIN, S.FLOAT64_RANGE[1],
                        "finite and > 0 as a float64")


def _check_zero_point(func: str, name: str, zero_point, dtype: str) -> int:
    return S.check_int(f"quantized.{func}", name, zero_point, *_RANGES[dtype],
                       f"the {dtype} range")


def _check_qdtype(func: str, dtype) -> str:
    if isinstance(dtype, str) and dtype.casefold() in QDTYPES:  # "INT8" as "int8"
        return dtype.casefold()
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in QDTYPES:
        _fail(func, f"dtype {dtype} is not supported (supported: {', '.join(QDTYPES)})",
              TypeError)
    return name


class QArray:
    """An int8 or uint8 array of codes with one scale and zero point (per tensor).

    ``data`` is a NumPy, CuPy or Dask array (a list becomes NumPy); ``scale`` a finite float > 0;
    ``zero_point`` an int in the dtype's range. Code ``q`` means ``scale * (q - zero_point)``.
    Raises ``TypeError`` for another dtype or a non-number, ``ValueError`` for a bad value.

    >>> QArray(np.array([0, 10], np.int8), 0.5, 2).data.tolist()
    [0, 10]
    """

    __slots__ = ("data", "scale", "zero_point")

    def __init__(self, data: ArrayLike, scale: float, zero_point: int = 0) -> None:
        if not is_dask_array(data):
            data, _, _ = as_array("quantized.QArray", data, "data")
        dtype = _check_qdtype("QArray", data.dtype)
        self.data = data
        self.scale = _check_scale("QArray", "scale", scale)
        self.zero_point = _check_zero_point("QArray", "zero_point", zero_point, dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __repr__(self) -> str:
        return (f"QArray({type(self.data).__module__.split('.')[0]} {dtype_name(self.data.dtype)}"
                f"{self.shape}, scale={self.scale!r}, zero_point={self.zero_point})")


def _qarray(func: str, q) -> QArray:
    if not isinstance(q, QArray):
        _fail(func, f"q must be a gpupool.quantized.QArray, got {type(q).__module__}."
                    f"{type(q).__name__}", TypeError)
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
        return _dask_backend().quantize(x, scale, zero_point, dtype)
    x, backend, xp = as_array("quantized.quantize", x)
    name = _check_qdtype("quantize", dtype)
    scale = _check_scale("quantize", "scale", scale)
    zero_point = _check_zero_point("quantize", "zero_point", zero_point, name)
    if x.dtype.kind not in "fiu":
        _fail("quantize", f"x has dtype {x.dtype}; expected a real (float or integer) array",
              TypeError)
    with device_scope(x, backend):
        y = x.astype(xp.float64) / scale
        if bool(xp.isnan(y).any()):
            _fail("quantize", "x contains NaN, which has no code")
        lo, hi = _RANGES[name]
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
    with device_scope(data, backend_of(data)):  # nothing for NumPy and Dask codes
        return ((data.astype("float64") - q.zero_point) * q.scale).astype("float32")


# ----------------------------------------------------------------------------- requantization

@functools.lru_cache(maxsize=4096)
def _requant_row(num: int, den: int, rounding: str, divisor: int, amax: int) -> tuple[int, ...]:
    """One table row, ``(M, sh, xcap, T[0..LEVELS+1])``, for ``c = num / (den * divisor)`` and
    accumulators ``|acc| <= amax`` (see the module docstring)."""
    big = amax + 1  # above every |acc|: "never"
    if divisor == 0:  # empty window: acc is 0, the result is zp_out
        return (0, 1, 0, 0) + (big,) * (LEVELS + 1)
    d = den * divisor
    thresholds = [0]
    for v in range(1, LEVELS + 1):
        q, r = divmod((2 * v - 1) * d, 2 * num)  # x * c >= v - 1/2  <=>  2*x*num >= (2v-1)*d
        t = q + (r != 0)
        if rounding == "half_to_even" and r == 0 and v % 2 == 1:
            t += 1  # an exact tie at v - 1/2 rounds down to the even v - 1
        thresholds.append(min(t, big))
    thresholds.append(big)
    xcap = min(amax, thresholds[LEVELS])
    c = Fraction(num, d)
    if c >= LEVELS + 1:  # every x >= 1 gives LEVELS: v = x * LEVELS, clamped
        return (LEVELS, 0, xcap) + tuple(thresholds)
    nbits = min(31, 62 - max(xcap.bit_length(), 1))
    e = c.numerator.bit_length() - c.denominator.bit_length()  # 2**(e-1) <= c < 2**(e+1)
    if c >= Fraction(2) ** e:
        e += 1  # now 2**(e-1) <= c < 2**e
    sh = nbits - e
    if sh > 62:  # c < 2**(nbits-62): x * c < 1/2 for every x <= xcap < 2**(62-nbits)
        sh = 62
    m = round(c * 2 ** sh)
    if m >= 2 ** nbits:  # rounding carried into a new bit
        m //= 2
        sh -= 1
    return (m, sh, xcap) + tuple(thresholds)


def requant_table(scale: float, out_scale: float, rounding: str, divisors: Sequence[int],
                  amax: int) -> np.ndarray:
    """Read-only int64 table, one row ``(M, sh, xcap, T[0..LEVELS+1])`` per divisor, that maps
    an accumulator to ``round(acc * scale / (out_scale * divisor))`` exactly (module
    docstring). ``amax`` bounds ``|acc|``."""
    rounding = S.choice("quantized.requant_table", "rounding", rounding, ROUNDINGS)
    ratio = Fraction(scale) / Fraction(out_scale)
    rows = [_requant_row(ratio.numerator, ratio.denominator, rounding, int(d), int(amax))
            for d in divisors]
    table = np.array(rows, dtype=np.int64).reshape(len(rows), HEAD + LEVELS + 2)
    table.setflags(write=False)
    return table


@dataclass(frozen=True, eq=False)
class AvgPlan:
    """Everything a backend needs to requantize one average pooling (host arrays, read-only).

    ``rows[pos]``: the table row of each output position (shape ``out_spatial``);
    ``counts[pos]``: valid taps per output position (for ``acc = sum(q) - zp_in * count``);
    ``acc_dtype``: int32 unless a window could overflow it."""

    key: tuple
    zp_in: int
    zp_out: int
    qmin: int
    qmax: int
    acc_dtype: str
    rows: np.ndarray
    counts: np.ndarray
    table: np.ndarray


def _acc_dtype(max_taps: int) -> tuple[str, int]:
    amax = 255 * max_taps  # |q - zp| <= 255 for both dtypes and every zero point
    return ("int32" if amax < 2 ** 31 else "int64"), amax


def _frozen(a, dtype):
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


@functools.lru_cache(maxsize=256)
def _avg_plan(spec, dtype: str, scale: float, zp_in: int, out_scale: float, zp_out: int,
              rounding: str) -> AvgPlan:
    if isinstance(spec, S.WindowSpec):
        from .cpu.numpy_backend import _valid_counts
        divisors = _valid_counts(spec, spec.count_include_pad).astype(np.int64)
        counts = _valid_counts(spec, False).astype(np.int64)
        max_taps = math.prod(spec.kernel)
    else:
        lengths = []
        for size, out in zip(spec.geom.spatial, spec.out_spatial):
            bounds = [S.adaptive_window(i, size, out) for i in range(out)]
            lengths.append(np.array([e - s for s, e in bounds], dtype=np.int64))
        counts = np.ones((), dtype=np.int64)
        for per_dim in lengths:
            counts = np.multiply.outer(counts, per_dim)
        divisors = counts
        max_taps = math.prod(int(per_dim.max()) for per_dim in lengths)
    acc_dtype, amax = _acc_dtype(max_taps)
    distinct, rows = np.unique(divisors, return_inverse=True)
    table = requant_table(scale, out_scale, rounding, distinct.tolist(), amax)
    lo, hi = _RANGES[dtype]
    key = (spec, dtype, scale, zp_in, out_scale, zp_out, rounding)
    return AvgPlan(key, zp_in, zp_out, lo, hi, acc_dtype,
                   _frozen(rows.reshape(divisors.shape), np.int32), _frozen(counts, acc_dtype),
                   table)


# ----------------------------------------------------------------------------- dispatch

@S.memoized
def _int_window_spec(func, op, shape, dtype, kernel_size, stride, padding, dilation, ceil_mode,
                     layout, count_include_pad):
    """``spec.window_spec`` for int8/uint8 codes: built as the max family (which admits integer
    dtypes), then relabelled for averages; the requantization parameters travel apart."""
    spec = S.window_spec(f"quantized.{func}", "max", shape, dtype, kernel_size, stride, padding,
                         dilation, ceil_mode, layout, count_include_pad=count_include_pad)
    return spec if op == "max" else dataclasses.replace(spec, op=op)


def _int_adaptive_spec(spec):
    return dataclasses.replace(spec, op="avg")


def _out_params(func, q, out_scale, out_zero_point, rounding):
    dtype = dtype_name(q.data.dtype)
    out_scale = q.scale if out_scale is None else _check_scale(func, "out_scale", out_scale)
    zp_out = (q.zero_point if out_zero_point is None
              else _check_zero_point(func, "out_zero_point", out_zero_point, dtype))
    rounding = S.choice(f"quantized.{func}", "rounding", rounding, ROUNDINGS)
    return dtype, out_scale, zp_out, rounding


def _average(func, q, spec, backend, xp, out_scale, zp_out, rounding, family):
    dtype = dtype_name(q.data.dtype)
    plan = _avg_plan(spec, dtype, q.scale, q.zero_point, out_scale, zp_out, rounding)
    with device_scope(q.data, backend):
        out = xp.empty(spec.out_shape, dtype=q.data.dtype)
        if out.size:
            implementation(family, backend)(q.data, spec, out, plan)
    return QArray(out, out_scale, zp_out)


def _dask_backend():
    return importlib.import_module("gpupool.interop.dask")


def _accepts_dask(op):
    """Let the quantized ``op`` take a QArray whose codes are a Dask array: the result's codes
    are then a lazy Dask array, bit-identical to the in-memory op."""
    @functools.wraps(op)
    def dispatch(q, *args, **kwargs):
        if isinstance(q, QArray) and is_dask_array(q.data):
            return _dask_backend().call_quantized(op, q, *args, **kwargs)
        return op(q, *args, **kwargs)
    return dispatch


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
    spec = _int_window_spec("max_pool", "max", data.shape, dtype_name(data.dtype), kernel_size,
                            stride, padding, dilation, ceil_mode, layout, False)
    with device_scope(data, backend):
        out = xp.empty(spec.out_shape, dtype=data.dtype)
        if out.size:
            implementation("qmax_window", backend)(data, spec, out)
    return QArray(out, q.scale, q.zero_point)


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
    func = "avg_pool"
    q = _qarray(func, q)
    data, backend, xp = as_array(f"quantized.{func}", q.data)
    spec = _int_window_spec(func, "avg", data.shape, dtype_name(data.dtype), kernel_size, stride,
                            padding, 1, ceil_mode, layout, count_include_pad)
    _, out_scale, zp_out, rounding = _out_params(func, q, out_scale, out_zero_point,
                                                 rounding)
    return _average(func, q, spec, backend, xp, out_scale, zp_out, rounding, "qavg_window")


@_accepts_dask
def global_avg_pool(q: QArray, *, spatial_dims: int = 2, out_scale: float | None = None,
                    out_zero_point: int | None = None, rounding: str = "half_away_from_zero",
                    layout: str = "NCHW") -> QArray:
    """Average over the last ``spatial_dims`` spatial dims (kept with size 1), requantized as
    :func:`avg_pool`.

    >>> global_avg_pool(QArray(np.array([[[[1, 2], [2, 2]]]], np.uint8), 1.0)).data
    array([[[[2]]]], dtype=uint8)
    """
    func = "global_avg_pool"
    q = _qarray(func, q)
    data, backend, xp = as_array(f"quantized.{func}", q.data)
    spec = _int_adaptive_spec(S.global_spec(f"quantized.{func}", "max", data.shape,
                                            dtype_name(data.dtype), spatial_dims, layout))
    _, out_scale, zp_out, rounding = _out_params(func, q, out_scale, out_zero_point,
                                                 rounding)
    return _average(func, q, spec, backend, xp, out_scale, zp_out, rounding, "qavg_adaptive")


@_accepts_dask
def adaptive_avg_pool(q: QArray, output_size: Size, *, out_scale: float | None = None,
                      out_zero_point: int | None = None, rounding: str = "half_away_from_zero",
                      layout: str = "NCHW") -> QArray:
    """Average over adaptive windows ``[floor(i*I/O), ceil((i+1)*I/O))``, requantized as
    :func:`avg_pool`.

    >>> adaptive_avg_pool(QArray(np.arange(6, dtype=np.int8).reshape(1, 1, 6), 1.0), (2,)).data
    array([[[1, 4]]], dtype=int8)
    """
    func = "adaptive_avg_pool"
    q = _qarray(func, q)
    data, backend, xp = as_array(f"quantized.{func}", q.data)
    spec = _int_adaptive_spec(S.adaptive_spec(f"quantized.{func}", "max", data.shape,
                                              dtype_name(data.dtype), output_size, layout))
    _, out_scale, zp_out, rounding = _out_params(func, q, out_scale, out_zero_point,
                                                 rounding)
    return _average(func, q, spec, backend, xp, out_scale, zp_out, rounding, "qavg_adaptive")


__all__ = ["QArray", "quantize", "dequantize", "max_pool", "avg_pool", "global_avg_pool",
           "adaptive_avg_pool", "requant_table", "ROUNDINGS", "LEVELS"]
