"""The CPU executor for ``kernels_cu/``: runs the project's CUDA kernels on a machine with no
GPU, through a stand-in ``cupy`` (``standin/cupy``) over a host-compiled runtime
(``executor.py``, ``include/cudacpu.h``).

:func:`install` swaps the stand-in in for CuPy in this process, so the CUDA backend
(``gpupool.cuda``) runs unchanged on NumPy memory.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "standin"


def real_nvrtc() -> types.SimpleNamespace | None:
    """The installed CuPy's NVRTC pieces (``compiler``, ``core``), importable without a GPU,
    or None. Call before :func:`install`, use inside :func:`installed_cupy`."""
    try:
        from cupy._core import core
        from cupy.cuda import compiler
    except Exception:  # noqa: BLE001  (no CuPy, or a broken CUDA install)
        return None
    return types.SimpleNamespace(compiler=compiler, core=core)


_INSTALLED_CUPY: dict[str, types.ModuleType] = {}


def _pop_cupy() -> dict[str, types.ModuleType]:
    names = [n for n in sys.modules if n.split(".")[0] in ("cupy", "cupyx")]
    return {n: sys.modules.pop(n) for n in names}


@contextlib.contextmanager
def installed_cupy():
    """While inside, ``sys.modules`` holds the installed CuPy again (its NVRTC code imports
    ``cupy`` submodules lazily); nothing changes when the stand-in is not in use."""
    if not _INSTALLED_CUPY:
        yield
        return
    standin = _pop_cupy()
    sys.modules.update(_INSTALLED_CUPY)
    try:
        yield
    finally:
        _pop_cupy()
        sys.modules.update(standin)


def install():
    """Make ``import cupy`` give the stand-in (any CuPy imported so far is dropped from
    ``sys.modules``, cupyx too); register every kernel gpupool can request, so that the executor builds
    them in a few large compiles; keep gpupool's kernel cache in a fresh directory, so a
    kernel built under other executor options is never reused. Returns the stand-in."""
    _INSTALLED_CUPY.update(_pop_cupy())
    sys.path.insert(0, str(STANDIN))
    import cupy
    cache = tempfile.mkdtemp(prefix="gpupool-kernels-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["GPUPOOL_CACHE_DIR"] = cache
    from gpupool.cuda import kernels, names as kernel_names
    by_file: dict[str, list[str]] = {}
    for source_file, name in kernel_names.instantiations():
        by_file.setdefault(source_file, []).append(name)
    for source_file, names in by_file.items():
        cupy.batches[kernels.source(source_file)] = tuple(names)
    return cupy


def build_all(cupy) -> None:
    """Compile every registered kernel now, on every core."""
    from .executor import Build, build_libraries
    jobs = [job for code, names in cupy.batches.items() for job in cupy.chunks(code, names)]
    build_libraries(jobs, Build.from_env())
