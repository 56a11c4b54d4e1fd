"""The NumPy backend as one object, :data:`BACKEND`: the entry points of
:class:`gpupool.backends.Backend`, implemented by the float ops (:mod:`.numpy_backend`), the
backward ops (:mod:`.backward`) and the quantized ops (:mod:`.quantized`)."""
from __future__ import annotations

from . import backward, numpy_backend, quantized
from .. import windows as window_rules
from ..spec import UnpoolSpec, WindowSpec


def _unpool(x, spec: UnpoolSpec, out, indices) -> bool:
    """The range check of :func:`_index_rule`, then one scatter where the indices pass."""
    in_plane = not indices.size or _index_rule(indices, spec.pooling, False)[0]
    if in_plane:
        numpy_backend.unpool(x, spec, out, indices)
    return in_plane


def _index_rule(indices, pooling, windows: bool):
    """:func:`gpupool.windows.index_rule` on NumPy arrays."""
    return window_rules.index_rule(indices, pooling, windows)


def _checked_max_backward(grad, spec, out, indices) -> bool:
    """The check of :func:`_index_rule`, then the gradient where the indices pass."""
    in_plane, in_windows = _index_rule(indices, spec.forward, True)
    if in_plane and in_windows:
        backward.backward(grad, spec, out, indices=indices)
    return in_plane and in_windows


def _itself(entry):
    """The preparer of an entry point with nothing to plan ahead."""
    def prepare(spec: WindowSpec):
        return entry
    return prepare


class NumpyBackend:
    """:class:`gpupool.backends.Backend` on NumPy arrays, on the CPU's thread pool."""
    window = staticmethod(numpy_backend.window)
    prepare_window = staticmethod(numpy_backend.prepare_window)
    adaptive = staticmethod(numpy_backend.adaptive)
    unpool = staticmethod(_unpool)
    index_rule = staticmethod(_index_rule)
    checked_max_backward = staticmethod(_checked_max_backward)
    backward = staticmethod(backward.backward)
    qmax_window = staticmethod(quantized.qmax_window)
    prepare_qmax_window = staticmethod(_itself(quantized.qmax_window))
    qavg_window = staticmethod(quantized.qavg_window)
    prepare_qavg_window = staticmethod(_itself(quantized.qavg_window))
    qavg_adaptive = staticmethod(quantized.qavg_adaptive)


BACKEND = NumpyBackend()
