"""Backend selection by array type, through a registry of (op, backend) -> implementation.

A NumPy array (or a plain list/tuple) runs on the ``numpy`` backend; a CuPy array on the
``cupy`` backend. The float ops also take PyTorch tensors and JAX arrays, viewed as NumPy or
CuPy arrays through DLPack (:mod:`gpupool.interop.dlpack`). Backend modules register their
implementations when first imported, so CuPy is imported only when a CuPy array (or a CUDA
tensor) arrives: ``import gpupool`` needs neither CuPy nor a GPU, and never imports PyTorch or
JAX.
"""
from __future__ import annotations

import contextlib
import importlib
import numbers
from typing import Callable

import numpy as np

from .arrays import Array, ArrayLike, dtype_name, is_cupy_array, is_dask_array  # noqa: F401
from .registry import registered

#: the modules of each backend: the float ops, then the quantized ones.
BACKEND_MODULES = {"numpy": ("gpupool.cpu.numpy_backend", "gpupool.cpu.quantized"),
                   "cupy": ("gpupool.cuda.backend", "gpupool.cuda.quantized")}


def implementation(family: str, backend: str) -> Callable:
    """The function registered for ``family`` on ``backend``, importing the backend's modules
    until one registers it."""
    func = registered(family, backend)
    for module in BACKEND_MODULES[backend]:
        if func is not None:
            break
        importlib.import_module(module)
        func = registered(family, backend)
    return func


def foreign_handler(x):
    """The module that runs an op on ``x`` when ``x`` is neither NumPy, CuPy nor a list:
    :mod:`gpupool.interop.dask` for a Dask array, :mod:`gpupool.interop.dlpack` for another library's
    tensor that exports DLPack (PyTorch, JAX); ``None`` otherwise. Each such module has
    ``call(op, x, *args, **kwargs)``, where ``op`` is the public function on NumPy/CuPy."""
    if isinstance(x, np.ndarray) or is_cupy_array(x) or isinstance(x, (list, tuple)):
        return None
    if is_dask_array(x):
        return importlib.import_module("gpupool.interop.dask")
    if hasattr(x, "__dlpack__"):
        return importlib.import_module("gpupool.interop.dlpack")
    return None


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
    if is_cupy_array(x):  # first: an array type may be both
        import cupy
        return x, "cupy", cupy
    if isinstance(x, np.ndarray):
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


def device_scope(x, backend: str):
    """Make the input's GPU the current device while an op runs (nothing for NumPy), so
    results and launches land on the input's device."""
    return x.device if backend == "cupy" else contextlib.nullcontext()
