"""The stand-in's ``cupyx``: only ``cupyx.profiler.benchmark``, timed on the host (the executor
runs a launch to completion before it returns)."""
from __future__ import annotations

import sys
import time
import types

import numpy as _np


def _benchmark(func, args=(), kwargs=None, *, n_repeat=10000, n_warmup=10, **_):
    """``cupyx.profiler.benchmark``'s result shape: ``cpu_times`` (n_repeat,) and ``gpu_times``
    (1 device, n_repeat), both host wall times here."""
    kwargs = kwargs or {}
    for _ in range(n_warmup):
        func(*args, **kwargs)
    times = []
    for _ in range(n_repeat):
        t = time.perf_counter()
        func(*args, **kwargs)
        times.append(time.perf_counter() - t)
    times = _np.asarray(times)
    return types.SimpleNamespace(name=getattr(func, "__name__", "func"), cpu_times=times,
                                 gpu_times=times[None, :])


profiler = types.ModuleType("cupyx.profiler")
profiler.benchmark = _benchmark
sys.modules[profiler.__name__] = profiler
