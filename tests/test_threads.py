"""The NumPy backend's thread policy: how many threads, from where, and nothing beyond them."""
from __future__ import annotations

import os
import itertools
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import pytest

import gpupool
from gpupool.cpu import numpy_backend, reduce, threads

import reference as ref


@pytest.fixture
def restore_threads():
    before = threads._requested
    yield
    threads._requested = before


def multi_block_cases():
    """One op of each NumPy-backend code path, on inputs of several cache blocks."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 16, 64, 64)).astype(np.float32)  # 1.5 MiB: several blocks
    h = x.astype(np.float16)
    small_planes = rng.standard_normal((32, 64, 7, 7)).astype(np.float32)  # BLAS's mat-vec
    return {
        "global avg 7x7": lambda a: gpupool.global_avg_pool(small_planes),
        "global avg 7x7 f16 NHWC": lambda a: gpupool.global_avg_pool(
            small_planes.astype(np.float16).transpose(0, 2, 3, 1).copy(), layout="NHWC"),
        "max": lambda a: gpupool.max_pool(a, 3, 2, 1),
        "max indices": lambda a: gpupool.max_pool(a, 3, 2, 1, return_indices=True)[1],
        "avg f16": lambda a: gpupool.avg_pool(a.astype(np.float16), 2),
        "lp": lambda a: gpupool.lp_pool(a, 2, 3),
        "global avg": lambda a: gpupool.global_avg_pool(a),
        "global avg f16 NHWC": lambda a: gpupool.global_avg_pool(h.transpose(0, 2, 3, 1).copy(),
                                                                 layout="NHWC"),
        "global max": lambda a: gpupool.global_max_pool(a),
        "adaptive": lambda a: gpupool.adaptive_avg_pool(a, (5, 7)),
    }, x


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(reduce, "BLOCK_BYTES", 1 << 14)


def test_results_do_not_depend_on_the_thread_count(restore_threads, small_blocks):
    """Blocks are computed independently: 1, 2 and 5 threads give the same bits."""
    cases, x = multi_block_cases()
    results = {}
    for n in (1, 2, 5):
        gpupool.set_num_threads(n)
        results[n] = {name: f(x) for name, f in cases.items()}
    for name in cases:
        for n in (2, 5):
            np.testing.assert_array_equal(results[n][name], results[1][name], err_msg=name)


def test_one_thread_never_starts_the_pool(restore_threads, small_blocks, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pool was started with one thread")
    monkeypatch.setattr(threads, "ThreadPoolExecutor", refuse)
    monkeypatch.setattr(threads, "_pool", None)
    gpupool.set_num_threads(1)
    cases, x = multi_block_cases()
    for f in cases.values():
        f(x)


def test_work_runs_on_at_most_the_requested_threads(restore_threads, small_blocks, monkeypatch):
    seen = set()
    original = numpy_backend.separable_window

    def spy(*args, **kwargs):
        seen.add(threading.get_ident())
        return original(*args, **kwargs)
    monkeypatch.setattr(numpy_backend, "separable_window", spy)
    gpupool.set_num_threads(3)
    cases, x = multi_block_cases()
    for _ in range(3):
        cases["max"](x)
    assert 1 < len(seen) <= 3, seen  # the caller and two pool threads


def test_a_call_from_inside_the_pool_runs_inline(restore_threads, small_blocks):
    """An op called from a pool thread (a callback, a nested library) must not wait on the
    pool it occupies: with two threads both busy, that would deadlock."""
    gpupool.set_num_threads(2)
    cases, x = multi_block_cases()
    results = {}
    threads.run_all(lambda a, b: results.update({a: cases["max"](x[a:b])}), [(0, 3), (3, 6)])
    np.testing.assert_array_equal(np.concatenate([results[0], results[3]]), cases["max"](x))


def _avg_2x2(x):
    """2x2 average pooling of an NCHW array with even sides, straight from NumPy."""
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))


def _pool_threads() -> int:
    return sum(t.name.startswith("gpupool_") for t in threading.enumerate())


def test_set_num_threads_while_other_threads_pool(restore_threads, small_blocks):
    """The count may change while other threads run ops: theirs finish, with the same values,
    and the pools it replaces end once their work is done."""
    x = np.random.default_rng(11).standard_normal((4, 16, 32, 32)).astype(np.float32)
    want = _avg_2x2(x)  # 256 KiB: 16 blocks
    errors = []
    stop = threading.Event()

    def caller():
        try:
            while not stop.is_set():
                np.testing.assert_allclose(gpupool.avg_pool(x, 2), want, rtol=1e-6, atol=1e-6)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(3)]
    for t in callers:
        t.start()
    deadline = time.monotonic() + 3
    for n in itertools.cycle((1, 2, 3)):
        if stop.is_set() or time.monotonic() > deadline:
            break
        gpupool.set_num_threads(n)
        time.sleep(0.001)
    stop.set()
    for t in callers:
        t.join(30)
    assert not any(t.is_alive() for t in callers), "a caller hung"
    if errors:
        raise errors[0]
    deadline = time.monotonic() + 10
    while _pool_threads() > threads._pool_size and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _pool_threads() <= threads._pool_size


def test_gpupool_in_user_threads_waited_on_from_the_pool(restore_threads, small_blocks):
    """Work on a pool thread may start threads of its own (a user's executor, a Dask callback)
    and wait on their gpupool calls: those calls are not pool threads, but must not wait for
    pool threads, which are all busy waiting on them."""
    gpupool.set_num_threads(2)  # one pool thread
    x = np.random.default_rng(5).standard_normal((4, 16, 32, 32)).astype(np.float32)
    on_pool = threading.Event()
    outcome = {}

    def pair(start, stop):
        if not threads.in_pool():
            on_pool.wait(10)  # leaves the other pair to the pool thread
            return
        on_pool.set()
        user = ThreadPoolExecutor(2)
        futures = [user.submit(gpupool.avg_pool, x, 2) for _ in range(2)]
        done, waiting = wait(futures, timeout=10)
        user.shutdown(wait=False)  # after a deadlock, frees this thread so that all can end
        outcome.update(waiting=len(waiting), results=[f.result() for f in done])

    scenario = threading.Thread(target=threads.run_all, args=(pair, [(0, 1), (1, 2)]),
                                daemon=True)
    scenario.start()
    scenario.join(30)
    assert not scenario.is_alive(), "run_all hung"
    assert outcome["waiting"] == 0, "gpupool calls in a user's threads waited on a busy pool"
    for got in outcome["results"]:
        np.testing.assert_allclose(got, _avg_2x2(x), rtol=1e-6, atol=1e-6)


def test_every_pair_runs_once_and_errors_reach_the_caller(restore_threads):
    gpupool.set_num_threads(3)
    for _ in range(200):
        seen = []
        threads.run_all(lambda a, b: seen.append(a), [(i, i + 1) for i in range(7)])
        assert sorted(seen) == list(range(7))

    def fail_on(bad):
        def func(a, b):
            if a == bad:
                raise KeyError(a)
        return func
    for bad in range(7):
        with pytest.raises(KeyError) as info:
            threads.run_all(fail_on(bad), [(i, i + 1) for i in range(7)])
        assert info.value.args == (bad,)


def test_blas_runs_only_in_the_calling_thread_on_gpupool_threads(restore_threads, small_blocks,
                                                                  monkeypatch):
    """BLAS may start threads of its own (how many depends on the library and its settings):
    the backend calls it only from the calling thread, never from the pool, and holds it to
    gpupool's thread count while it runs."""
    from threadpoolctl import threadpool_info
    calls = []
    matmul = np.matmul

    def spy(*args, **kwargs):
        blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        calls.append((threading.get_ident(), blas))
        return matmul(*args, **kwargs)
    for name in ("dot", "vdot", "inner", "tensordot"):
        monkeypatch.setattr(np, name, lambda *a, **k: pytest.fail("BLAS called"))
    monkeypatch.setattr(np, "matmul", spy)
    cases, x = multi_block_cases()
    for n in (1, 3):
        gpupool.set_num_threads(n)
        calls.clear()
        for f in cases.values():
            f(x)
        assert calls, "the global average no longer uses BLAS: update this test"
        for ident, blas in calls:
            assert ident == threading.get_ident()
            assert blas and all(count == n for count in blas), (n, blas)


def test_global_avg_matches_the_reference_on_several_blocks(restore_threads, small_blocks):
    rng = np.random.default_rng(3)
    for layout, shape in (("NCHW", (9, 40, 7, 7)), ("NHWC", (9, 7, 7, 40)),
                          ("NCHW", (3, 2, 30, 31)), ("NHWC", (3, 30, 31, 2))):
        x = rng.standard_normal(shape)
        for dtype, tol in (("float64", 1e-12), ("float32", 1e-5), ("float16", 1e-3)):
            a = x.astype(dtype)
            got = gpupool.global_avg_pool(a, layout=layout)
            want = ref.global_avg_pool(a.astype(np.float64), 2, layout)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [0, -2])
def test_set_num_threads_rejects_counts_below_one(n):
    with pytest.raises(ValueError, match=r"gpupool.set_num_threads: n must be >= 1"):
        gpupool.set_num_threads(n)


@pytest.mark.parametrize("n", [1.0, "2", True, None])
def test_set_num_threads_rejects_non_integers(n):
    with pytest.raises(TypeError, match=r"gpupool.set_num_threads: n must be an int"):
        gpupool.set_num_threads(n)


def test_set_and_get(restore_threads):
    gpupool.set_num_threads(np.int64(3))
    assert gpupool.get_num_threads() == 3
    gpupool.set_num_threads(1)
    assert gpupool.get_num_threads() == 1


def _fresh_process(code: str, **env) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.abspath(gpupool.__file__)))
    environ = dict(os.environ, PYTHONPATH=root, **env)
    environ.pop(threads.ENV_VAR, None)
    environ.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=120)


def test_environment_variable_sets_the_default():
    proc = _fresh_process("import gpupool; print(gpupool.get_num_threads())",
                          GPUPOOL_NUM_THREADS="3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3"


@pytest.mark.parametrize("value", ["zero", "0", "-1"])
def test_a_bad_environment_variable_is_named(value):
    proc = _fresh_process("import gpupool, numpy as np; "
                          "gpupool.max_pool(np.ones((64, 128, 128), np.float32), 2)",
                          GPUPOOL_NUM_THREADS=value)
    assert proc.returncode != 0
    assert "GPUPOOL_NUM_THREADS" in proc.stderr and "ValueError" in proc.stderr


def test_default_is_the_cpus_this_process_may_use():
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two CPUs")
    proc = _fresh_process("""
        import os
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        import gpupool
        print(gpupool.get_num_threads())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"


@pytest.mark.parametrize("files, limit", [
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
    ({}, None),
])
def test_cgroup_cpu_quota(tmp_path, files, limit):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads._cgroup_cpu_limit(str(tmp_path)) == limit


def test_a_cgroup_quota_caps_the_default(monkeypatch):
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: 1.5)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert threads.available_cpus() == 2  # a quota of 1.5 CPUs can keep two threads busy
