"""Timers: on the GPU CUDA events (``cupyx.profiler.benchmark``, warm-up excluded), on the CPU
``time.perf_counter`` with every library timed in the same rounds; the fixed cost of a GPU
call; the copy bandwidth each result is set against."""
from __future__ import annotations

import time

import numpy as np

from .cases import LARGE_BYTES


def time_host(funcs: dict, rounds=10, burst_s=0.05, min_reps=3, max_reps=200,
              settle_s=0.02, setups: dict | None = None) -> dict:
    """Wall times of each callable in steady state, as a user calling one library sees it.

    Each round runs every callable in turn for a burst of ``burst_s`` (``min_reps`` to
    ``max_reps`` calls) after a ``settle_s`` pause and one untimed call, so a slow spell of a
    shared machine still hits every library alike. Calls are never interleaved one by one: the
    worker threads of PyTorch (OpenMP) and onnxruntime keep spinning for a while after a
    call, and a library timed right after another one pays for those spinning threads (seen
    on 2 cores: all three libraries 1.5-5x slower than alone). ``setups[name]``, when given,
    runs before each of that callable's bursts (e.g. to set a library's thread count)."""
    times = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            if setups and name in setups:
                setups[name]()
            time.sleep(settle_s)
            f()
            end = time.perf_counter() + burst_s
            reps = 0
            while reps < min_reps or (reps < max_reps and time.perf_counter() < end):
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
                reps += 1
    return times


def time_launches(f, sync, reps=200, loops=10) -> tuple[list[float], list[float]]:
    """The fixed cost of a GPU call: ``(host, loop)`` seconds per call, ``host`` each call's
    own time on the host (launches queued, no wait for the device), ``loop`` the time of a
    loop of ``reps // loops`` calls ended by ``sync()``, per call (``loops`` such loops)."""
    f()
    sync()
    host = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        host.append(time.perf_counter() - t)
    sync()
    per_loop = max(1, reps // loops)
    loop = []
    for _ in range(loops):
        t = time.perf_counter()
        for _ in range(per_loop):
            f()
        sync()
        loop.append((time.perf_counter() - t) / per_loop)
    return host, loop


def time_gpu(f, reps=50) -> list[float]:
    """Device seconds of each of ``reps`` calls of ``f`` (CUDA events, after 5 warm-up calls)."""
    from cupyx.profiler import benchmark
    return [float(t) for t in benchmark(f, n_repeat=reps, n_warmup=5).gpu_times[0]]


def copy_bandwidth(gpu: bool) -> float:
    """Bytes read + written per second by a large device (or host) copy."""
    if gpu:
        import cupy
        a = cupy.ones(LARGE_BYTES, dtype=cupy.uint8)
        b = cupy.empty_like(a)
        t = float(np.median(time_gpu(lambda: b.__setitem__(Ellipsis, a), 20)))
    else:
        a = np.ones(LARGE_BYTES // 4, dtype=np.uint8)
        b = np.empty_like(a)
        t = float(np.median(time_host({"copy": lambda: np.copyto(b, a)})["copy"]))
    return 2 * a.nbytes / t
