"""Backend selection by array type, through a registry of (op, backend) -> implementation.

A NumPy array (or a plain list/tuple) runs on the ``numpy`` backend; a CuPy array on the
``cupy`` backend. Backend modules register their implementations when first imported, so CuPy
is imported only when a CuPy array arrives: ``import gpupool`` needs neither CuPy nor a GPU.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import numpy as np

#: the modules of each backend: the float ops, then the quantized ones.
_MODULES = {"numpy": ("gpupool.numpy_backend", "gpupool.quantized_numpy"),
            "cupy": ("gpupool.cuda_backend", "gpupool.quantized_cuda")}
_REGISTRY: dict[tuple[str, str], Callable] = {}


def register(op: str, backend: str) -> Callable:
    """Decorator: make ``func`` the implementation of ``op`` on ``backend``."""
    def wrap(func: Callable) -> Callable:
        _REGISTRY[(op, backend)] = func
        return func
    return wrap


def implementation(op: str, backend: str) -> Callable:
    """The function registered for ``op`` on ``backend``, importing the backend's modules
    until one registers it."""
    for module in _MODULES[backend]:
        if (op, backend) in _REGISTRY:
            break
        importlib.import_module(module)
    return _REGISTRY[(op, backend)]


def is_cupy_array(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "__cuda_array_interface__")


def as_array(func: str, x, name: str = "x"):
    """Return ``(array, backend, xp)``; plain sequences become NumPy arrays."""
    if is_cupy_array(x):  # first: an array type may be both
        import cupy
        return x, "cupy", cupy
    if isinstance(x, np.ndarray):
        return x, "numpy", np
    if isinstance(x, (list, tuple)):
        return np.asarray(x), "numpy", np
    raise TypeError(f"gpupool.{func}: {name} must be a NumPy or CuPy array (or a list), "
                    f"got {type(x).__module__}.{type(x).__name__}")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``dtype.name``, cached: NumPy computes it in Python (about 6 us a call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def device_scope(x, backend: str):
    """Make the input's GPU the current device while an op runs (nothing for NumPy), so
    results and launches land on the input's device."""
    return x.device if backend == "cupy" else contextlib.nullcontext()
