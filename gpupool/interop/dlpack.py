"""PyTorch tensors and JAX arrays in the float ops, shared without copies through DLPack.

A tensor on the CPU is viewed as a NumPy array (``np.from_dlpack``), one on a CUDA GPU as a
CuPy array (``cupy.from_dlpack``). Strides travel with it: a transposed or sliced tensor is
not copied here either (the NumPy backend reads it in place; the CUDA backend, as for any
strided CuPy array, first makes a contiguous copy). The op runs on that backend and its
results go back, again as views, to the input's library on its device (``torch.from_dlpack``,
``jax.numpy.from_dlpack``). PyTorch and JAX are looked up only once one of their tensors
arrives, so they are already loaded: gpupool never loads them.

* ``out=``: a tensor of the input's library on its device, written in place and returned
  itself. JAX arrays are immutable, so a JAX input takes no ``out``.
* ``indices`` of :func:`gpupool.max_unpool`: a tensor of the input's library on its device.
* dtypes: float16/32/64, bfloat16 and int8/uint8/int16/int32/int64 (which op takes which is
  the NumPy rule); any other (complex, bool, float8, ...) is a ``TypeError`` before any work.
  NumPy and CuPy import no DLPack bfloat16, so a bfloat16 tensor travels as its int16 bits
  (PyTorch: a view; JAX: a bitcast) and is viewed as ml_dtypes' bfloat16 (``pip install
  "gpupool[bfloat16]"``), and results go back the same way.
* PyTorch tensors all go to :mod:`gpupool.interop.torch_ops` (gpupool's PyTorch operators),
  which runs a plain one through :func:`run` here. A traced JAX value (inside ``jax.jit``,
  ``grad``, ``vmap``) goes to the handler in :data:`TRACKED_CALLS`
  (:mod:`gpupool.interop.jax_ops`: a ``jax.custom_jvp`` over XLA buffer callbacks) for the
  float pooling ops; for the other ops that is a ``TypeError``. Under ``torch.no_grad()`` a
  tensor that requires grad is pooled without tracking, as by PyTorch's own ops. ``out`` that
  requires grad is a ``TypeError``: autograd would not see it written in place; so is
  ``out`` for an input that is tracked.
* The backward ops (:mod:`gpupool.gradients`) take tensors of ``grad_output``'s library and
  device as ``indices`` and ``x``, as ``max_unpool`` its ``indices``.
* A PyTorch tensor with the negative bit set (a lazily negated view such as ``t.conj().imag``
  of a complex ``t``), whose DLPack export would drop the sign, is taken through
  ``resolve_neg()`` (a copy) as ``x`` or ``indices``, and is a ``TypeError`` as ``out``, which
  is written in place. The conjugate bit exists only on complex tensors, which are refused.
* JAX on the CPU takes a result without a copy only where its buffer is 64-byte aligned (XLA's
  rule), and copies it otherwise. Without ``jax_enable_x64`` JAX has no int64: indices come
  back as int32, as from JAX's own index functions (a ``ValueError`` where one would not fit).
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable

import numpy as np

from .. import spec as S
from ..arrays import dtype_name
from ..op_table import BY_NAME

_CPU, _CUDA = 1, 2
#: DLPack device types (``DLDeviceType``), for messages
_DEVICE_TYPES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                 9: "VPI", 10: "ROCm", 11: "ROCm host", 12: "ExtDev", 13: "CUDA managed",
                 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
#: the library of a tensor, by the top-level module of its type
_LIBRARIES = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}
_TYPE_NAMES = {"torch": "torch.Tensor", "jax": "jax.Array"}
#: the largest index a JAX array without x64 holds
_INT32_MAX = 2**31 - 1
#: what a tensor's DLPack export or import raises when it cannot be shared
_EXPORT_ERRORS = (BufferError, RuntimeError, TypeError, ValueError)
#: what runs an op on an input that its library tracks, by library: ``"torch"``, a tensor that
#: requires grad while grad mode is on; ``"jax"``, a traced value. Each is called as
#: ``handler(op, x, args, kwargs)``; :mod:`gpupool.interop.jax_ops` installs JAX's.
TRACKED_CALLS: dict[str, Callable] = {}
#: the module of gpupool's PyTorch operators, whose ``call(op, x, args, kwargs)`` runs an op on
#: any tensor; the package names it (``import gpupool``)
TORCH_OPERATORS = ""


def call(op, x, *args, **kwargs):
    """Run ``op``, a public op on NumPy/CuPy arrays, on the PyTorch tensor or JAX array ``x``;
    return its result (values, or values and int64 indices) as tensors of ``x``'s library on
    ``x``'s device, ``out`` itself where given."""
    func = op.__name__
    lib = library(x)
    if lib is None:
        raise TypeError(f"gpupool.{func}: x is a {type_name(x)}; gpupool takes NumPy and CuPy "
                        f"arrays, PyTorch tensors, JAX arrays and nested lists")
    if lib == "torch":  # sys.modules, not importlib: torch.compile traces this line
        operators = sys.modules.get(TORCH_OPERATORS) or importlib.import_module(TORCH_OPERATORS)
        return operators.call(op, x, args, kwargs)
    if kwargs.get("out") is not None:
        raise TypeError(f"gpupool.{func}: out must be None for a JAX input: JAX arrays are "
                        f"immutable, use the returned array")
    if isinstance(x, importlib.import_module("jax").core.Tracer):
        handler = TRACKED_CALLS.get(lib)
        if handler is None:
            raise TypeError(f"gpupool.{func}: x is a traced JAX value, and "
                            f"gpupool.interop.autograd is not loaded")
        return handler(op, x, args, kwargs)
    return run(op, lib, x, args, kwargs)


def run(op, lib: str, x, args: tuple, kwargs: dict):
    """``op`` on the NumPy/CuPy view of ``x`` (an untracked tensor of ``lib``) and of its
    tensor operands; results as tensors of ``lib`` on ``x``'s device, ``out`` itself where
    given."""
    func = op.__name__
    out = kwargs.get("out")
    row = BY_NAME[func]
    first = "grad_output" if row.is_backward else "x"
    where = device(func, x, first)
    array = view(func, lib, where, x, first)
    if out is not None:
        kwargs["out"] = operand_view(func, lib, where, out, "out")
    operand = row.operand
    if operand is not None:
        if args:
            args = (operand_view(func, lib, where, args[0], operand),) + args[1:]
        elif operand in kwargs:
            kwargs[operand] = operand_view(func, lib, where, kwargs[operand], operand)
    result = op(array, *args, **kwargs)
    if not isinstance(result, tuple):
        return out if out is not None else _to_library(lib, result)
    values, indices = result
    if lib == "jax" and array.size > _INT32_MAX and indices.size:
        _check_jax_indices(func, indices)
    return (out if out is not None else _to_library(lib, values)), _to_library(lib, indices)


def library(t) -> str | None:
    """``"torch"`` or ``"jax"``: the library of ``t``, by the top-level module of its type;
    None for another (decided once per type)."""
    kind = type(t)
    lib = _LIBRARY_OF_TYPE.get(kind, False)
    if lib is False:
        lib = _LIBRARY_OF_TYPE[kind] = _LIBRARIES.get(kind.__module__.split(".")[0])
    return lib


_LIBRARY_OF_TYPE: dict = {}


def type_name(t) -> str:
    lib = library(t)
    return _TYPE_NAMES[lib] if lib else f"{type(t).__module__}.{type(t).__name__}"


def _device_name(device: tuple[int, int]) -> str:
    kind, index = device
    return f"{_DEVICE_TYPES.get(kind, f'DLPack device type {kind}')}:{index}"


def device(func: str, t, name: str) -> tuple[int, int]:
    """``(DLPack device type, index)`` of ``t``: the CPU or a CUDA GPU."""
    try:
        kind, index = t.__dlpack_device__()
    except _EXPORT_ERRORS as e:
        raise TypeError(f"gpupool.{func}: {name} ({type_name(t)}) cannot be shared through "
                        f"DLPack ({e})") from e
    device = (int(kind), int(index))
    if device[0] not in (_CPU, _CUDA):
        raise TypeError(f"gpupool.{func}: {name} is on device {_device_name(device)}; gpupool "
                        f"runs on the CPU (NumPy) and on CUDA GPUs (CuPy): move it there first")
    return device


def operand_view(func: str, lib: str, x_device: tuple[int, int], t, name: str):
    """The NumPy/CuPy view of ``out`` or ``indices``: a tensor of ``x``'s library and device."""
    if library(t) != lib or not hasattr(t, "__dlpack__"):
        raise TypeError(f"gpupool.{func}: {name} is a {type_name(t)}; expected a "
                        f"{_TYPE_NAMES[lib]} like x")
    where = device(func, t, name)
    if where != x_device:
        raise ValueError(f"gpupool.{func}: {name} is on device {_device_name(where)}, x on "
                         f"{_device_name(x_device)}")
    return view(func, lib, where, t, name)


def view(func: str, lib: str, device: tuple[int, int], t, name: str):
    """``t`` as a NumPy (CPU) or CuPy (CUDA) array over the same memory."""
    if lib == "torch" and t.requires_grad:
        if name == "out":
            raise TypeError(f"gpupool.{func}: out requires grad, and gpupool writes it in "
                            f"place where autograd does not see it; pass one that does not "
                            f"(e.g. out.detach())")
        if importlib.import_module("torch").is_grad_enabled():  # an operand besides x
            raise TypeError(f"gpupool.{func}: {name} requires grad, and gpupool has no "
                            f"gradient with respect to it (the result would be cut off from "
                            f"autograd); pass {name}.detach()")
        t = t.detach()  # grad mode is off: nothing is tracked, as in PyTorch's own ops
    dtype = str(t.dtype).removeprefix("torch.") if lib == "torch" else np.dtype(t.dtype).name
    if dtype not in S.ITEMSIZE:
        raise TypeError(f"gpupool.{func}: {name} ({_TYPE_NAMES[lib]}) has dtype {dtype}, which "
                        f"is not supported (supported: {', '.join(S.FLOAT_DTYPES)}; "
                        f"{', '.join(S.INT_DTYPES)} for the max ops and max_unpool); convert it "
                        f"first, e.g. to float32")
    if lib == "torch" and t.is_neg():  # a lazily negated view: DLPack would drop the sign
        if name == "out":
            raise TypeError(f"gpupool.{func}: out has PyTorch's negative bit set (a lazily "
                            f"negated view, e.g. of t.conj().imag), so it cannot be written in "
                            f"place; pass a tensor without it (out.is_neg() False)")
        t = t.resolve_neg()
    xp = np if device[0] == _CPU else _cupy(func, name)
    bfloat16 = _bfloat16(func, name) if dtype == "bfloat16" else None
    try:
        if bfloat16 is not None:
            return xp.from_dlpack(_bfloat16_bits(lib, t)).view(bfloat16)
        return xp.from_dlpack(t)
    except _EXPORT_ERRORS as e:
        raise TypeError(f"gpupool.{func}: {name} ({_TYPE_NAMES[lib]} of dtype {dtype}) cannot "
                        f"be shared through DLPack ({e})") from e


def _cupy(func: str, name: str):
    try:
        return importlib.import_module("cupy")
    except ImportError as e:
        raise TypeError(f"gpupool.{func}: {name} is on a CUDA GPU, which needs CuPy: "
                        f"pip install \"gpupool[cuda13]\" (or [cuda12])") from e


def _bfloat16(func: str, name: str):
    """ml_dtypes' bfloat16, the dtype NumPy and CuPy arrays of bfloat16 have."""
    try:
        return importlib.import_module("ml_dtypes").bfloat16
    except ImportError as e:
        raise TypeError(f"gpupool.{func}: {name} is bfloat16, which NumPy and CuPy hold as "
                        f"ml_dtypes.bfloat16: pip install \"gpupool[bfloat16]\"") from e


def _bfloat16_bits(lib: str, t):
    """The bfloat16 tensor ``t`` as an int16 tensor of its bits (PyTorch: a view)."""
    if lib == "torch":
        return t.view(importlib.import_module("torch").int16)
    jax = importlib.import_module("jax")
    return jax.lax.bitcast_convert_type(t, jax.numpy.int16)


def _to_library(lib: str, a):
    """The NumPy/CuPy result ``a`` as a tensor of ``lib`` on the same device."""
    if dtype_name(a.dtype) == "bfloat16":
        bits = _to_library(lib, a.view(np.int16))
        if lib == "torch":
            return bits.view(importlib.import_module("torch").bfloat16)
        jnp = importlib.import_module("jax.numpy")
        return importlib.import_module("jax").lax.bitcast_convert_type(bits, jnp.bfloat16)
    if lib == "torch":
        return importlib.import_module("torch").from_dlpack(a)
    return importlib.import_module("jax.numpy").from_dlpack(a)


def _check_jax_indices(func: str, indices) -> None:
    """Without ``jax_enable_x64`` JAX narrows int64 indices to int32, which wraps past 2**31."""
    if importlib.import_module("jax").config.jax_enable_x64:
        return
    high = int(indices.max())
    if high > _INT32_MAX:
        raise ValueError(f"gpupool.{func}: return_indices: index {high} does not fit the int32 "
                         f"indices of JAX without x64; enable it with "
                         f"jax.config.update('jax_enable_x64', True)")
