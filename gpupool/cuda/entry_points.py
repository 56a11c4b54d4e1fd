"""The CUDA backend as one object, :data:`BACKEND`: the entry points of
:class:`gpupool.backends.Backend`, implemented by the float forward ops (:mod:`.forward`), the
backward ops (:mod:`.backward`), the check of a max's indices (:mod:`.index_check`) and the
quantized ops (:mod:`.quantized`), each launching kernels on CuPy's current stream."""
from __future__ import annotations

from . import backward, forward, index_check, quantized
from ..spec import WindowSpec


def _prepare_window(spec: WindowSpec):
    """The float window entry point itself: its launches are prepared per spec and device at
    the first call (:func:`gpupool.cuda.forward.prepared`)."""
    return forward.window


class CudaBackend:
    """:class:`gpupool.backends.Backend` on CuPy arrays, on their GPU."""
    window = staticmethod(forward.window)
    prepare_window = staticmethod(_prepare_window)
    adaptive = staticmethod(forward.adaptive)
    unpool = staticmethod(forward.unpool)
    index_rule = staticmethod(index_check.index_rule)
    checked_max_backward = staticmethod(backward.checked_max_backward)
    backward = staticmethod(backward.backward)
    qmax_window = staticmethod(quantized.qmax_window)
    prepare_qmax_window = staticmethod(quantized.prepare_qmax_window)
    qavg_window = staticmethod(quantized.qavg_window)
    prepare_qavg_window = staticmethod(quantized.prepare_qavg_window)
    qavg_adaptive = staticmethod(quantized.qavg_adaptive)


BACKEND = CudaBackend()
