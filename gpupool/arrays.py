"""Array kinds, recognised without importing their libraries (``import gpupool`` never imports
CuPy, Dask, PyTorch or JAX), and the array types of the public signatures."""
from __future__ import annotations

import numbers
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


_KINDS: dict[tuple[str, type], bool] = {}  # (library, type) -> whether an array of it


def _of_kind(library: str, attribute: str, x) -> bool:
    """Whether ``x``'s type comes from ``library`` and has ``attribute`` (decided once per
    type: on a CuPy array, building ``__cuda_array_interface__`` costs microseconds)."""
    key = (library, type(x))
    known = _KINDS.get(key)
    if known is None:
        known = _KINDS[key] = (type(x).__module__.split(".")[0] == library
                               and hasattr(type(x), attribute))
    return known


def is_cupy_array(x) -> bool:
    """A CuPy array (its type comes from CuPy and exports ``__cuda_array_interface__``)."""
    return _of_kind("cupy", "__cuda_array_interface__", x)


def is_dask_array(x) -> bool:
    """A Dask array (its type comes from Dask and has ``chunks``)."""
    return _of_kind("dask", "chunks", x)


def backend_of(a) -> str | None:
    """``"cupy"`` for a CuPy array, ``"numpy"`` for a NumPy array of any ndarray subclass,
    else None."""
    if is_cupy_array(a):
        return "cupy"
    return "numpy" if isinstance(a, np.ndarray) else None


def as_array(func: str, x, name: str = "x"):
    """Return ``(array, backend, xp)``; plain (nested) lists and tuples become NumPy arrays.
    A NumPy array comes back as a plain ``numpy.ndarray`` (a subclass such as ``np.memmap``
    or ``np.matrix`` is viewed as one) in native byte order (a byte-swapped one is converted:
    a copy), so results are plain native arrays.

    Errors name ``gpupool.<func>`` and the parameter: a scalar or another type is a
    ``TypeError``, a ragged nested sequence a ``ValueError``."""
    if type(x) is np.ndarray and x.dtype.isnative:  # the common case, first
        return x, "numpy", np
    if is_cupy_array(x):  # before NumPy: an array type may be both
        import cupy
        return x, "cupy", cupy
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(f"gpupool.{func}: {name} is a numpy.ma.MaskedArray; its mask would "
                            f"be ignored: pass x.filled(value) (or x.data) instead")
        if type(x) is not np.ndarray:  # a subclass (np.matrix reshapes its own way, ...)
            x = np.asarray(x)
        if not x.dtype.isnative:  # byte-swapped: once here, so no backend ever sees it
            x = x.astype(x.dtype.newbyteorder("="))
        return x, "numpy", np
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x), "numpy", np
        except (ValueError, TypeError) as e:
            raise ValueError(f"gpupool.{func}: {name} is a nested sequence that is not a "
                             f"rectangular array of numbers (every row must have the same "
                             f"length); pass a NumPy or CuPy array") from e
    if isinstance(x, (numbers.Number, np.generic)):
        raise TypeError(f"gpupool.{func}: {name} is a scalar ({type(x).__module__}."
                        f"{type(x).__name__} {x}); pooling needs an array with the spatial "
                        f"dims, e.g. of shape (N, C, H, W): a NumPy or CuPy array or a nested "
                        f"list")
    tensors = ("" if func.startswith("quantized.") or name != "x"
               else ", a PyTorch tensor, a JAX array")
    raise TypeError(f"gpupool.{func}: {name} must be a NumPy or CuPy array{tensors} or a nested "
                    f"list, got {type(x).__module__}.{type(x).__name__}")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``dtype.name``, cached: NumPy computes it in Python (about 6 us a call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name
