"""Which code runs an op: the backend that computes on an input's array type, and the adapter of
an input that is neither NumPy nor CuPy.

A NumPy array (or a plain list/tuple) runs on the ``numpy`` backend (:mod:`gpupool.cpu`); a
CuPy array on the ``cupy`` backend (:mod:`gpupool.cuda`). Each backend is one object that
implements :class:`Backend`, loaded from its module (:data:`BACKEND_MODULES`) on first use, so
CuPy is imported only when a CuPy array (or a CUDA tensor) arrives: ``import gpupool`` needs
neither CuPy nor a GPU, and never imports Dask, PyTorch or JAX. PyTorch tensors and JAX arrays
are viewed as NumPy or CuPy arrays through DLPack (:mod:`gpupool.interop.dlpack`), Dask arrays
become lazy graphs of in-memory ops (:mod:`gpupool.interop.dask`).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from .arrays import is_cupy_array, is_dask_array
from .interop import dlpack

if TYPE_CHECKING:
    from .arrays import Array
    from .grad_spec import GradSpec
    from .quantized_spec import AvgPlan
    from .spec import AdaptiveSpec, UnpoolSpec, WindowSpec

#: the module holding each backend's object (its ``BACKEND``).
BACKEND_MODULES = {"numpy": "gpupool.cpu.entry_points", "cupy": "gpupool.cuda.entry_points"}


class WindowRun(Protocol):
    def __call__(self, x: Array, spec: WindowSpec, out: Array, indices: Array | None) -> None:
        ...


class QuantizedMaxRun(Protocol):
    def __call__(self, x: Array, spec: WindowSpec, out: Array) -> None:
        ...


class QuantizedAverageRun(Protocol):
    def __call__(self, x: Array, spec: WindowSpec, out: Array, plan: AvgPlan) -> None:
        ...


@runtime_checkable
class Backend(Protocol):
    """What a backend implements. Every entry point takes its input, the op's validated spec
    (:mod:`gpupool.spec`; the backend only computes), then the C-contiguous arrays it writes,
    of the spec's output shape, on the input's device, then what else it reads; it returns
    nothing, but those that check the indices they read (:meth:`unpool`,
    :meth:`checked_max_backward`) return whether they pass. A ``prepare_*`` method returns its
    entry point with every choice that depends on the spec alone made once (the plan cache
    keeps it per call signature); a backend with nothing to plan ahead returns the entry point
    itself."""

    def window(self, x: Array, spec: WindowSpec, out: Array, indices: Array | None) -> None:
        """Max (and its flat indices where ``indices`` is given), average or Lp pooling over
        sliding windows."""

    def prepare_window(self, spec: WindowSpec) -> WindowRun:
        """:meth:`window` for ``spec``."""

    def adaptive(self, x: Array, spec: AdaptiveSpec, out: Array, indices: Array | None
                 ) -> None:
        """Adaptive and global max (and indices) or average pooling."""

    def unpool(self, x: Array, spec: UnpoolSpec, out: Array, indices: Array) -> bool:
        """``max_unpool`` from ``indices`` not yet checked: True where each lies in
        ``[-1, plane)`` of the output plane (one host sync on a GPU), and ``out`` then holds
        each value at its index (-1 skipped), zeros elsewhere; False where one does not, and
        ``out``'s contents are then unspecified."""

    def index_rule(self, indices: Array, pooling: WindowSpec | AdaptiveSpec, windows: bool
                   ) -> tuple[bool, bool | None]:
        """``(in_plane, in_windows)`` of a max's non-empty ``indices`` over ``pooling``: whether
        each lies in ``[-1, plane)`` of its input plane and, where ``windows`` (else None),
        whether each of those is also -1 or a tap of its own window
        (:func:`gpupool.windows.index_rule`); one host sync on a GPU."""

    def backward(self, grad: Array, spec: GradSpec, out: Array, indices: Array | None = None,
                 x: Array | None = None, y: Array | None = None) -> None:
        """The gradient of a float pooling's input from its output's: from the forward max's
        ``indices``, or from its input ``x`` and output ``y`` (Lp)."""

    def checked_max_backward(self, grad: Array, spec: GradSpec, out: Array, indices: Array
                             ) -> bool:
        """:meth:`backward` of a max from ``indices`` not yet checked, checked as by
        :meth:`index_rule` (one host sync on a GPU): True where each lies in its plane and
        is -1 or a tap of its own window, and ``out`` then holds the gradient; False where one
        does not, and ``out``'s contents are then unspecified."""

    def qmax_window(self, x: Array, spec: WindowSpec, out: Array) -> None:
        """Max of int8/uint8 codes over sliding windows."""

    def prepare_qmax_window(self, spec: WindowSpec) -> QuantizedMaxRun:
        """:meth:`qmax_window` for ``spec``."""

    def qavg_window(self, x: Array, spec: WindowSpec, out: Array, plan: AvgPlan) -> None:
        """Average of codes over sliding windows, requantized exactly by ``plan``."""

    def prepare_qavg_window(self, spec: WindowSpec) -> QuantizedAverageRun:
        """:meth:`qavg_window` for ``spec``."""

    def qavg_adaptive(self, x: Array, spec: AdaptiveSpec, out: Array, plan: AvgPlan) -> None:
        """Adaptive and global average of codes, requantized exactly by ``plan``."""


_loaded: dict[str, Backend] = {}


def load(name: str) -> Backend:
    """The ``"numpy"`` or ``"cupy"`` backend, its module imported on first use."""
    found = _loaded.get(name)
    if found is None:
        found = _loaded[name] = importlib.import_module(BACKEND_MODULES[name]).BACKEND
    return found


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


def device_scope(x, backend: str | None):
    """Make the input's GPU the current device while an op runs (nothing for NumPy), so
    results and launches land on the input's device."""
    return x.device if backend == "cupy" else contextlib.nullcontext()
