"""Which code runs an op: the implementation of an op family on a backend, and the adapter of
an input that is neither NumPy nor CuPy.

A NumPy array (or a plain list/tuple) runs on the ``numpy`` backend (:mod:`gpupool.cpu`); a
CuPy array on the ``cupy`` backend (:mod:`gpupool.cuda`). PyTorch tensors and JAX arrays are
viewed as NumPy or CuPy arrays through DLPack (:mod:`gpupool.interop.dlpack`), Dask arrays
become lazy graphs of in-memory ops (:mod:`gpupool.interop.dask`). Backend modules register
their implementations (:mod:`gpupool.registry`) when first imported, so CuPy is imported only
when a CuPy array (or a CUDA tensor) arrives: ``import gpupool`` needs neither CuPy nor a GPU,
and never imports Dask, PyTorch or JAX.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import numpy as np

from .arrays import is_cupy_array, is_dask_array
from .interop import dlpack
from .registry import registered

#: the modules of each backend: the float ops, the quantized ones, then the backward ops.
BACKEND_MODULES = {"numpy": ("gpupool.cpu.numpy_backend", "gpupool.cpu.quantized",
                             "gpupool.cpu.backward"),
                   "cupy": ("gpupool.cuda.backend", "gpupool.cuda.quantized",
                            "gpupool.cuda.backward")}


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


def prepared(family: str, backend: str, spec) -> Callable:
    """The implementation of ``family`` on ``backend`` for ``spec``: ``impl.prepare(spec)``
    (the same call with every choice that depends on ``spec`` alone made once) where the
    backend offers it, else ``impl``."""
    impl = implementation(family, backend)
    prepare = getattr(impl, "prepare", None)
    return impl if prepare is None else prepare(spec)


def foreign_handler(x):
    """The module that runs an op on ``x`` when ``x`` is neither NumPy, CuPy nor a list:
    :mod:`gpupool.interop.dask` for a Dask array, :mod:`gpupool.interop.dlpack` for another library's
    tensor that exports DLPack (PyTorch, JAX); ``None`` otherwise. Each such module has
    ``call(op, x, *args, **kwargs)``, where ``op`` is the public function on NumPy/CuPy.
    Decided once per type of ``x``."""
    kind = type(x)
    try:
        return _HANDLERS[kind]
    except KeyError:
        pass
    handler = None
    if isinstance(x, np.ndarray) or is_cupy_array(x) or isinstance(x, (list, tuple)):
        pass
    elif is_dask_array(x):
        handler = importlib.import_module("gpupool.interop.dask")
    elif hasattr(kind, "__dlpack__"):
        handler = dlpack
    _HANDLERS[kind] = handler
    return handler


_HANDLERS: dict = {}  # an input's type -> its handler (None: NumPy, CuPy, a list or unknown)


def on_current_device(x, xp) -> bool:
    """Whether ``x`` needs no device switch: a NumPy array, or a CuPy array on the current
    device (the common case: an op then skips :func:`device_scope`)."""
    return xp is np or x.data.device_id == xp.cuda.runtime.getDevice()


def device_scope(x, backend: str):
    """Make the input's GPU the current device while an op runs (nothing for NumPy), so
    results and launches land on the input's device."""
    return x.device if backend == "cupy" else contextlib.nullcontext()
