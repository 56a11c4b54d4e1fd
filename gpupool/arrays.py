"""Array kinds, recognised without importing their libraries (``import gpupool`` never imports
CuPy, Dask, PyTorch or JAX), and the array types of the public signatures."""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:  # annotations only
    import cupy

#: What the ops return: a NumPy array (CPU) or a CuPy array (GPU), the input's kind.
Array = Union[np.ndarray, "cupy.ndarray"]
#: What the ops take as input: a NumPy or CuPy array, or a (nested) list/tuple of numbers,
#: which becomes a NumPy array. The float ops also take PyTorch tensors and JAX arrays
#: (:mod:`gpupool.interop.dlpack`) and return the input's kind.
ArrayLike = Union[np.ndarray, "cupy.ndarray", list, tuple]


def is_cupy_array(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "__cuda_array_interface__")


def is_dask_array(x) -> bool:
    """A Dask array (recognised by its type's module)."""
    return type(x).__module__.split(".")[0] == "dask" and hasattr(x, "chunks")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``dtype.name``, cached: NumPy computes it in Python (about 6 us a call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name
