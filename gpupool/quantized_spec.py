"""The semantics of quantized (int8/uint8) pooling: :class:`QArray`, the checks of its
parameters, the exact requantization (:func:`requant_table`, :class:`AvgPlan`) and the specs of
the quantized ops. The rules themselves are stated in :mod:`gpupool.quantized`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from . import spec as S
from . import windows
from .arrays import Array, ArrayLike, as_array, dtype_name, is_dask_array
from .cpu.memo import array_memo

QDTYPES = ("int8", "uint8")
ROUNDINGS = ("half_away_from_zero", "half_to_even")
LEVELS = 256  # |round(acc * c)| is clamped here: zp_out +- 256 saturates for every zp
HEAD = 3  # table columns before the thresholds: M, sh, xcap
MIN_BITS = 11  # the fewest bits of M that keep the candidate within one of f(x)
RANGES = {"int8": (-128, 127), "uint8": (0, 255)}
SCALE_MIN = 5e-324  # the smallest float64 > 0


def _fail(func: str, message: str, exc: type = ValueError):
    raise exc(f"gpupool.quantized.{func}: {message}")


def check_scale(func: str, name: str, scale) -> float:
    """A finite float64 > 0 (the requantization takes its exact binary value)."""
    return S.check_real(f"quantized.{func}", name, scale, SCALE_MIN, S.FLOAT64_RANGE[1],
                        "finite and > 0 as a float64")


def check_zero_point(func: str, name: str, zero_point, dtype: str) -> int:
    return S.check_int(f"quantized.{func}", name, zero_point, *RANGES[dtype],
                       f"the {dtype} range")


def check_qdtype(func: str, dtype) -> str:
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
        dtype = check_qdtype("QArray", data.dtype)
        self.data: Array = data
        self.scale = check_scale("QArray", "scale", scale)
        self.zero_point = check_zero_point("QArray", "zero_point", zero_point, dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __repr__(self) -> str:
        return (f"QArray({type(self.data).__module__.split('.')[0]} {dtype_name(self.data.dtype)}"
                f"{self.shape}, scale={self.scale!r}, zero_point={self.zero_point})")


def trusted_qarray(data, scale: float, zero_point: int) -> QArray:
    """A :class:`QArray` of codes and parameters already checked (an op's result), built
    without checking them again."""
    q = object.__new__(QArray)
    q.data, q.scale, q.zero_point = data, scale, zero_point
    return q


# ----------------------------------------------------------------------------- requantization

@functools.lru_cache(maxsize=4096)
def requant_row(num: int, den: int, rounding: str, divisor: int, amax: int) -> tuple[int, ...]:
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
    if thresholds[1] == big:  # every |acc| rounds to 0: v = 0, no correction takes
        return (0, 0, 0) + tuple(thresholds)
    xcap = min(amax, thresholds[LEVELS])
    c = Fraction(num, d)
    if c >= LEVELS + 1:  # every x >= 1 gives LEVELS: v = x * LEVELS, clamped
        return (LEVELS, 0, xcap) + tuple(thresholds)
    e = c.numerator.bit_length() - c.denominator.bit_length()  # 2**(e-1) <= c < 2**(e+1)
    if c >= Fraction(2) ** e:
        e += 1  # now 2**(e-1) <= c < 2**e
    # narrow where 11 bits or more allow it: x * M < 2**31 and sh <= 30 (32-bit arithmetic)
    nbits = min(31 - max(xcap.bit_length(), 1), 30 + e)
    if nbits < MIN_BITS:
        nbits = min(31, 62 - max(xcap.bit_length(), 1))
    sh = nbits - e
    if sh > 62:  # c < 2**(nbits-62): x * c < 1/2 for every x <= xcap < 2**(62-nbits)
        sh = 62
    m = round(c * 2 ** sh)
    if m >= 2 ** nbits:  # rounding carried into a new bit
        m //= 2
        sh -= 1
    return (m, sh, xcap) + tuple(thresholds)


def narrow_table(table: np.ndarray) -> bool:
    """Whether every row of ``table`` requantizes in 32-bit unsigned arithmetic:
    ``xcap * M + 2**(sh-1) < 2**32``, ``sh < 32`` and every threshold below ``2**31``."""
    for row in table.tolist():
        m, sh, xcap = row[:HEAD]
        if sh >= 32 or xcap * m + ((1 << sh) >> 1) >= 2 ** 32 or max(row[HEAD:]) >= 2 ** 31:
            return False
    return True


def requant_table(scale: float, out_scale: float, rounding: str, divisors: Sequence[int],
                  amax: int) -> np.ndarray:
    """Read-only int64 table, one row ``(M, sh, xcap, T[0..LEVELS+1])`` per divisor, that maps
    an accumulator to ``round(acc * scale / (out_scale * divisor))`` exactly (module
    docstring). ``amax`` bounds ``|acc|``."""
    rounding = S.choice("quantized.requant_table", "rounding", rounding, ROUNDINGS)
    ratio = Fraction(scale) / Fraction(out_scale)
    rows = [requant_row(ratio.numerator, ratio.denominator, rounding, int(d), int(amax))
            for d in divisors]
    table = np.array(rows, dtype=np.int64).reshape(len(rows), HEAD + LEVELS + 2)
    table.setflags(write=False)
    return table


@dataclass(frozen=True, eq=False)
class AvgPlan:
    """Everything a backend needs to requantize one average pooling (host arrays, read-only).

    ``table``: one row per distinct divisor; :meth:`rows_and_counts`: per output position its
    row of the table and its valid taps (for ``acc = sum(q) - zp_in * count``), kept apart in
    a byte-bounded memo (:func:`output_rows`), so that whatever keeps a plan keeps nothing per
    output; ``max_count``: the most valid taps of a window; ``acc_dtype``: int32 unless a
    window could overflow it; ``narrow``: whether the table requantizes in 32 bits."""

    key: tuple
    zp_in: int
    zp_out: int
    qmin: int
    qmax: int
    acc_dtype: str
    max_count: int
    table: np.ndarray

    @functools.cached_property
    def narrow(self) -> bool:
        """:func:`narrow_table` of the table."""
        return narrow_table(self.table)

    def rows_and_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """:func:`output_rows` of the plan's spec (built again once the memo let it go)."""
        return output_rows(self.key[0])


def accumulator_dtype(max_taps: int) -> tuple[str, int]:
    """``(dtype, amax)``: int32 sums unless ``max_taps`` codes could overflow them, and the
    bound of ``|acc|``."""
    amax = 255 * max_taps  # |q - zp| <= 255 for both dtypes and every zero point
    return ("int32" if amax < 2 ** 31 else "int64"), amax


def _frozen(a, dtype):
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


def _taps(spec) -> tuple[np.ndarray, np.ndarray, int]:
    """``(divisors, counts, max_taps)`` of an average pooling of ``spec``: per output position
    its divisor and its valid taps (int64, shape ``out_spatial``), and the most taps a window
    can have."""
    if isinstance(spec, S.WindowSpec):
        return (windows.window_counts(spec, spec.count_include_pad).astype(np.int64),
                windows.window_counts(spec, False).astype(np.int64), math.prod(spec.kernel))
    counts = windows.adaptive_counts(spec)
    return counts, counts, math.prod(int((ends - starts).max()) for starts, ends in (
        windows.adaptive_bounds(size, out)
        for size, out in zip(spec.geom.spatial, spec.out_spatial)))


@array_memo(256)
def output_rows(spec) -> tuple[np.ndarray, np.ndarray]:
    """Per output position of an average pooling of ``spec`` (read-only, shape
    ``out_spatial``): the row of its divisor in the requantization table (int32; the table
    has the distinct divisors in increasing order) and its valid taps (the accumulator
    dtype)."""
    divisors, counts, max_taps = _taps(spec)
    rows = np.unique(divisors, return_inverse=True)[1]
    return (_frozen(rows.reshape(divisors.shape), np.int32),
            _frozen(counts, accumulator_dtype(max_taps)[0]))


@array_memo(256)
def avg_plan(spec, dtype: str, scale: float, zp_in: int, out_scale: float, zp_out: int,
             rounding: str) -> AvgPlan:
    """The :class:`AvgPlan` of an average pooling of ``spec`` (a window or adaptive spec of
    the quantized ops) with these requantization parameters."""
    divisors, counts, max_taps = _taps(spec)
    acc, amax = accumulator_dtype(max_taps)
    table = requant_table(scale, out_scale, rounding, np.unique(divisors).tolist(), amax)
    lo, hi = RANGES[dtype]
    key = (spec, dtype, scale, zp_in, out_scale, zp_out, rounding)
    return AvgPlan(key, zp_in, zp_out, lo, hi, acc, int(counts.max(initial=0)), table)


# ----------------------------------------------------------------------------- specs

def out_params(func: str, q: QArray, out_scale, out_zero_point, rounding) -> tuple:
    """``(dtype, out_scale, out_zero_point, rounding)`` of a quantized average, checked; the
    output scale and zero point default to the input's."""
    dtype = dtype_name(q.data.dtype)
    out_scale = q.scale if out_scale is None else check_scale(func, "out_scale", out_scale)
    zp_out = (q.zero_point if out_zero_point is None
              else check_zero_point(func, "out_zero_point", out_zero_point, dtype))
    rounding = S.choice(f"quantized.{func}", "rounding", rounding, ROUNDINGS)
    return dtype, out_scale, zp_out, rounding




def window_spec(func: str, op: str, shape, dtype: str, kernel_size, stride, padding, dilation,
                ceil_mode, layout, count_include_pad=False) -> S.WindowSpec:
    """The spec of ``gpupool.quantized.<func>`` (``op`` "max" or "avg") on codes of ``dtype``
    (int8/uint8, checked by :class:`QArray`); errors name the quantized function."""
    return S.window_spec(f"quantized.{func}", op, shape, dtype, kernel_size, stride, padding,
                         dilation, ceil_mode, layout, count_include_pad=count_include_pad,
                         integers=True)


def adaptive_spec(func: str, shape, dtype: str, output_size, layout) -> S.AdaptiveSpec:
    """The spec of a quantized adaptive average."""
    return S.adaptive_spec(f"quantized.{func}", "avg", shape, dtype, output_size, layout,
                           integers=True)


def global_spec(func: str, shape, dtype: str, spatial_dims, layout) -> S.AdaptiveSpec:
    """The spec of a quantized global average."""
    return S.global_spec(f"quantized.{func}", "avg", shape, dtype, spatial_dims, layout,
                         integers=True)
