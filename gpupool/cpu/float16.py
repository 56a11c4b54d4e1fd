"""float16 on the NumPy backend: its values as order-preserving int16 keys (NumPy has no fast
float16 loops; the keys cost a quarter of a float32 conversion and int16 maxima are exact),
and its NaN results as CUDA gives them (0x7FFF), so that a float16 result has the same bits
on both backends."""
from __future__ import annotations

import numpy as np

from .reduce import scratch

#: the key of every NaN (the top int16), and the key of -inf
NAN_KEY, NEG_INF_KEY = np.int16(0x7FFF), np.int16(-0x7C01)
#: the bits of every NaN result: CUDA narrows a NaN to float16 so (sign and payload dropped)
NAN_BITS = np.int16(0x7FFF)


def keys(xb):
    """float16 values as int16 keys in the same order, in scratch: non-negative bit patterns as
    they are, negative ones with the magnitude bits flipped (``key = a ^ (bits >> 15)``,
    ``a = bits & 0x7FFF``), every NaN as :data:`NAN_KEY` so it propagates."""
    bits = xb.view(np.int16)
    out, sign = scratch("input", xb.shape, np.int16), scratch("keys", xb.shape, np.int16)
    np.bitwise_and(bits, 0x7FFF, out=out)
    nan = np.greater(out, 0x7C00, out=scratch("mask", xb.shape, np.bool_))
    np.right_shift(bits, 15, out=sign)
    np.bitwise_xor(out, sign, out=out)
    np.copyto(out, NAN_KEY, where=nan)
    return out


def from_keys(held, dest) -> None:
    """Inverse of :func:`keys` into the float16 ``dest``; keys below that of -inf (the
    empty-window fill) become -inf."""
    np.maximum(held, NEG_INF_KEY, out=held)
    sign = scratch("keys", held.shape, np.int16)
    np.right_shift(held, 15, out=sign)
    np.bitwise_and(sign, 0x7FFF, out=sign)
    np.bitwise_xor(held, sign, out=dest.view(np.int16))


def canonical_nans(out) -> None:
    """Every NaN of the float16 ``out`` as :data:`NAN_BITS` (bfloat16's rounding gives the
    same, :mod:`.bfloat16`)."""
    bits = out.view(np.int16)
    nan = np.bitwise_and(bits, 0x7FFF) > 0x7C00
    if nan.any():
        np.copyto(bits, NAN_BITS, where=nan)
