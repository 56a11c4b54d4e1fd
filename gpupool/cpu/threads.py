"""How many threads the NumPy backend runs an op on, and the pool that runs them.

The default is the number of CPUs this process may use: its CPU affinity, capped by a cgroup
CPU quota (containers, CI runners, batch schedulers). ``GPUPOOL_NUM_THREADS`` sets it when the
first op runs; :func:`set_num_threads` changes it at any time. One pool serves every thread
that calls gpupool, so concurrent callers (a Dask worker's threads, say) share these threads
instead of multiplying them, and a call made from inside the pool runs inline.

The pool runs NumPy ufuncs, reductions and ``einsum``, never BLAS, which may start threads of
its own (how many depends on which BLAS NumPy links and its settings). The one BLAS call, the
global average's mat-vec, runs in the calling thread inside :func:`blas_threads`, which holds
BLAS to gpupool's thread count through threadpoolctl: the same count, whatever the BLAS.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

ENV_VAR = "GPUPOOL_NUM_THREADS"

_lock = threading.Lock()
_requested: int | None = None  # set_num_threads, else the environment, else available_cpus()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_in_pool = threading.local()
_blas = None  # threadpoolctl's controller of the BLAS libraries loaded


def _cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), or None."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        count = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return max(1, count)


def _check_count(func: str, name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) and not hasattr(n, "__index__"):
        raise TypeError(f"{func}: {name} must be an int >= 1, got {type(n).__name__} {n!r}")
    n = int(n.__index__())
    if n < 1:
        raise ValueError(f"{func}: {name} must be >= 1, got {n}")
    return n


def _from_environment() -> int | None:
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"gpupool: the environment variable {ENV_VAR} must be an int >= 1, "
                         f"got {value!r}") from None
    return _check_count("gpupool", f"the environment variable {ENV_VAR}", number)


def get_num_threads() -> int:
    """The number of threads an op of the NumPy backend runs on (see the module docstring)."""
    global _requested
    if _requested is None:
        _requested = _from_environment() or available_cpus()
    return _requested


def set_num_threads(n: int) -> None:
    """Run ops of the NumPy backend on ``n`` threads from now on (1: in the calling thread).

    ``n`` is an int >= 1 (``TypeError``/``ValueError`` otherwise); it may exceed
    :func:`available_cpus`, as the user asked. Ops already running finish on the old pool.
    """
    global _requested
    _requested = _check_count("gpupool.set_num_threads", "n", n)


def _mark_pool_thread() -> None:
    _in_pool.active = True


def run_all(func, bounds) -> None:
    """``func(start, stop)`` for every pair in ``bounds``, on :func:`get_num_threads` threads:
    the caller and up to that many minus one pool threads take pairs in turn until none is
    left. Pool threads that have not started by the time the caller runs out of pairs are
    not waited for, so a call never waits on a pool busy elsewhere (with work that waits on
    this caller, say). A caller that is itself a pool thread, or a count of 1, runs them all
    inline, in order. An exception from ``func`` reaches the caller once no thread is left
    running ``func`` for this call."""
    global _pool, _pool_size
    count = get_num_threads()
    workers = min(count, len(bounds))
    if workers == 1 or in_pool():
        for start, stop in bounds:
            func(start, stop)
        return
    pairs = iter(bounds)
    take = threading.Lock()

    def drain():
        while True:
            with take:
                pair = next(pairs, None)
            if pair is None:
                return
            func(*pair)

    helpers = count - 1
    with _lock:  # submits too: no other caller may shut this pool down in between
        if _pool is None or _pool_size != helpers:
            if _pool is not None:
                _pool.shutdown(wait=False)  # its queued work still runs; it then exits
            _pool = ThreadPoolExecutor(helpers, thread_name_prefix="gpupool",
                                       initializer=_mark_pool_thread)
            _pool_size = helpers
        futures = [_pool.submit(drain) for _ in range(workers - 1)]
    try:
        drain()
    finally:
        started = [future for future in futures if not future.cancel()]
        wait(started)
        for future in started:
            future.result()


def in_pool() -> bool:
    """Whether the calling thread is one of the pool's."""
    return getattr(_in_pool, "active", False)


def blas_threads():
    """A context in which every BLAS that threadpoolctl finds runs on :func:`get_num_threads`
    threads (a process-wide setting while it lasts; threadpoolctl restores the old one)."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController().select(user_api="blas")
    n = get_num_threads()
    if all(lib.get_num_threads() == n for lib in _blas.lib_controllers):
        return contextlib.nullcontext()  # already so: skip threadpoolctl's set and restore
    return _blas.limit(limits=n)
