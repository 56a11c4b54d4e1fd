"""bfloat16 on the NumPy backend, through the float32 code.

NumPy has no bfloat16 arithmetic of its own (ml_dtypes' ufunc loops round every step to
bfloat16), and a bfloat16 is exactly the upper half of a float32. So a bfloat16 op runs as its
float32 op: the operands widened exactly to float32 (integer shifts of the bits), the float32
op (sums, divisions and roots in float32, as float16's), and each result rounded once to
bfloat16 as CUDA's ``__float2bfloat16_rn`` rounds it: to nearest even, overflow to infinity,
subnormals kept, every NaN to 0x7FFF. The CUDA kernels instantiated for ``__nv_bfloat16`` do
the same arithmetic and the same rounding, so both backends give the same bits.

No ml_dtypes import: a bfloat16 array brings its dtype along, and the dtype name picks the
path (:data:`gpupool.spec.FLOAT_DTYPES`).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..arrays import dtype_name

from ..windows import narrowed

#: the dtype name of ml_dtypes' bfloat16, the one NumPy, PyTorch (through DLPack) and JAX share
BFLOAT16 = "bfloat16"


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` (a NumPy dtype or a dtype name) is bfloat16."""
    return (dtype if isinstance(dtype, str) else dtype_name(dtype)) == BFLOAT16


def widened(a) -> np.ndarray:
    """The bfloat16 array ``a`` as a C-contiguous float32 array of the same values, exactly
    (the bits moved to the upper half)."""
    bits = np.empty(a.shape, np.uint32)
    np.copyto(bits, a.view(np.uint16))
    np.left_shift(bits, 16, out=bits)
    return bits.view(np.float32)


def round_into(dest, values) -> None:
    """Write the float32 ``values`` into the bfloat16 ``dest`` (same shape), each rounded
    once (:func:`gpupool.windows.narrowed`)."""
    np.copyto(dest.view(np.uint16), narrowed(values, dest.dtype).view(np.uint16))


@functools.lru_cache(maxsize=256)
def as_float32(spec):
    """``spec`` (a forward spec, or a GradSpec through its ``forward``) for float32 input of
    the same geometry and parameters: the spec the float32 code runs."""
    forward = getattr(spec, "forward", None)
    if forward is not None:
        return dataclasses.replace(spec, forward=as_float32(forward))
    return dataclasses.replace(spec, geom=dataclasses.replace(spec.geom, dtype="float32"))


def through_float32(run):
    """``run(x, spec, out, indices)`` of the float32 op as the bfloat16 op: ``x`` widened,
    the float32 result rounded once into ``out``; indices written as they are."""
    def run_bfloat16(x, spec, out, indices) -> None:
        result = np.empty(out.shape, np.float32)
        run(widened(x), as_float32(spec), result, indices)
        round_into(out, result)
    return run_bfloat16
