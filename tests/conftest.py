"""Shared test setup: one test body runs on every backend.

* ``backend`` fixture, parametrized over ``numpy`` and ``cupy``; the CuPy case carries the
  ``gpu`` marker.
* Tests marked ``gpu`` run on CuPy when it sees a CUDA device; otherwise on the CPU executor
  for ``kernels_cu/`` (``tests/cudacpu``: the kernels compiled with the host C++ compiler,
  behind a stand-in ``cupy``), so they run wherever a host compiler exists. The report
  header says which; where neither exists they are left out, with one summary line.
  ``GPUPOOL_GPU_TESTS=executor`` asks for the executor even with a GPU;
  ``GPUPOOL_CUPY_POOL=0`` turns CuPy's memory pool off (:func:`configure_memory_pool`).
* Hypothesis runs derandomized, without an example database and without deadlines, so CI is
  deterministic.
"""
from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py, whatever the import mode

import cudacpu  # noqa: E402
from cudacpu import executor  # noqa: E402

settings.register_profile(
    "gpupool", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("GPUPOOL_HYPOTHESIS_PROFILE", "gpupool"))


def _real_gpu_reason() -> str | None:
    """None when CuPy imports and sees at least one CUDA device, else why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    return None if count > 0 else "no CUDA device"


def _choose_gpu_runtime() -> tuple[str | None, str]:
    """("cupy" | "executor" | None, description) for the ``gpu`` tests of this run."""
    no_gpu = ("executor requested" if os.environ.get("GPUPOOL_GPU_TESTS") == "executor"
              else _real_gpu_reason())
    if no_gpu is None:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return "cupy", f"CuPy {cupy.__version__} on {name.decode() if isinstance(name, bytes) else name}"
    no_compiler = executor.host_compiler_reason()
    if no_compiler is not None:
        return None, f"not run: {no_gpu}; {no_compiler}"
    build = executor.Build.from_env()
    schedule = os.environ.get("CUDACPU_SCHEDULE", "forward")
    return "executor", (f"CPU executor for kernels_cu/ ({no_gpu}): {build.cxx} {build.opt}"
                        f"{' -fsanitize=' + build.sanitize if build.sanitize else ''}, "
                        f"schedule {schedule}")


def configure_memory_pool(cupy, environ) -> None:
    """``GPUPOOL_CUPY_POOL=0``: CuPy allocates each array by itself, outside its memory pool,
    so that compute-sanitizer sees an access past an array's end (inside a pooled block it
    cannot)."""
    if environ.get("GPUPOOL_CUPY_POOL", "1") == "0":
        cupy.cuda.set_allocator(None)


#: Nsight Compute's executed warp instructions, in all and per pipe, of every modeled case's
#: launches on an H200 (``bench/issued.py``): of the kernels as they are, and the newest run
#: whose times are at 1500 MHz, on which the pipe efficiency is fitted.
RESULTS = pathlib.Path(__file__).parents[1] / "bench" / "results"
ISSUED = RESULTS / "issued-h200-2026-11-28.json"
ISSUED_AT_1500_MHZ = RESULTS / "issued-h200-2026-11-27.json"
#: CuPy's NVRTC (compiler, core) for the compile tests, captured before the stand-in.
REAL_NVRTC = cudacpu.real_nvrtc()
GPU_RUNTIME, GPU_RUNTIME_WORDS = _choose_gpu_runtime()
STANDIN = cudacpu.install() if GPU_RUNTIME == "executor" else None
if GPU_RUNTIME is not None:
    import cupy as _cupy
    configure_memory_pool(_cupy, os.environ)


def pytest_report_header(config):
    return f"gpu tests: {GPU_RUNTIME_WORDS}"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    if GPU_RUNTIME is None:  # left out with one summary line, not one skip line per test
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        config.hook.pytest_deselected(items=gpu_items)
        config.stash[_GPU_LEFT_OUT] = len(gpu_items)
    elif GPU_RUNTIME == "executor":
        cudacpu.build_all(STANDIN)


_GPU_LEFT_OUT = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(_GPU_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} gpu tests {GPU_RUNTIME_WORDS}")


@pytest.fixture(scope="session")
def modeled_suite():
    """The GPU model (gpumodel) of every benchmark case, by name: traced on the CPU executor,
    compiled with the real NVRTC."""
    from gpumodel import benchmodel
    models = benchmodel.model_suite(benchmodel.modeled_cases(), REAL_NVRTC)
    return {m.case.name: m for m in models}


@pytest.fixture
def real_nvrtc():
    """CuPy's NVRTC compiler pieces (no GPU needed); skips where CuPy is not installed."""
    if REAL_NVRTC is None:
        pytest.skip("CuPy's NVRTC is not importable")
    with cudacpu.installed_cupy():
        yield REAL_NVRTC


def to_numpy(a):
    """A NumPy copy-or-view of a NumPy or CuPy array (or a scalar)."""
    if type(a).__module__.split(".")[0] == "cupy":
        return a.get()
    return np.asarray(a)


class Backend:
    """Array helpers for one backend, so that test bodies never name NumPy or CuPy."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp

    def __repr__(self) -> str:
        return f"Backend({self.name})"

    def to_backend(self, a, dtype=None):
        """A C-contiguous array of this backend holding the values of ``a``."""
        a = np.asarray(a, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        return self.xp.asarray(a)

    @staticmethod
    def to_numpy(a):
        return to_numpy(a)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype=dtype)

    def is_native(self, a) -> bool:
        """``a`` is an array of this backend (NumPy in -> NumPy out, CuPy in -> CuPy out)."""
        return isinstance(a, self.xp.ndarray)

    def relayout(self, a, mode: str):
        """Same values as ``a``, in another memory layout, built on this backend.

        ``C``: contiguous; ``F``: Fortran order; ``strided``: a step-2 slice of the last axis of
        a larger buffer; ``reversed``: a negative-stride view; ``transposed``: a transposed view
        of a contiguous array with the axes swapped back.
        """
        xp = self.xp
        if mode == "C":
            return a
        if mode == "F":
            return xp.asfortranarray(a)
        if mode == "strided":
            buf = xp.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
            buf[..., ::2] = a
            return buf[..., ::2]
        if mode == "reversed":
            return xp.ascontiguousarray(a[..., ::-1])[..., ::-1]
        if mode == "transposed":
            return xp.ascontiguousarray(a.T).T
        raise AssertionError(mode)


@pytest.fixture(scope="session",
                params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def backend(request) -> Backend:
    if request.param == "numpy":
        return Backend("numpy", np)
    import cupy
    return Backend("cupy", cupy)
