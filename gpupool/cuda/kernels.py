"""The CUDA kernels' source and its compilation: ``kernels_cu/`` compiled with NVRTC.

* Kernel source: ``kernels_cu/`` (:data:`KERNEL_DIR`), package data in a wheel: one ``.cu``
  per op family and the ``.cuh`` headers it includes, inlined by :func:`read_source` after the
  file's :data:`DEFINES` (:func:`source`), so the on-disk kernel cache keys on the full text.
* Every static choice (element type, index type, layout, specialised window size, lanes) is a
  template argument: a kernel is one name expression (:mod:`gpupool.cuda.names`), compiled
  once per (device, file, name expression) by :func:`load_module` (memoized per device, and
  kept on disk), never on a warm call.
* Compiled with NVRTC directly (:data:`OPTIONS`): ``cupy.RawModule`` appends ``-ftz=true``,
  which flushes float32 subnormals to zero on the GPU, where the NumPy backend keeps them.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import struct
from pathlib import Path

import cupy

from . import planner, row_tiles, tiled_gathers
from .names import source_file as source_file_of
from ..quantized_spec import HEAD, LEVELS

#: NVRTC options of every kernel (plus CuPy's include paths, and -arch from the device): IEEE
#: float32, subnormals kept, division and square root correctly rounded, and no multiply-add
#: fused into one rounding (the NumPy backend rounds each, and both backends' sums must agree
#: bit for bit).
OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "--fmad=false")


def _kernel_dir() -> Path:
    """``kernels_cu/``, the ``.cu`` and ``.cuh`` files: inside the package in an installed wheel
    (which maps it there, pyproject's ``force-include``), beside the package at the project's
    root in a checkout or an editable install."""
    package = Path(__file__).resolve().parent.parent
    for where in (package / "kernels_cu", package.parent / "kernels_cu"):
        if where.is_dir():
            return where
    raise FileNotFoundError(f"gpupool: the CUDA kernels (kernels_cu/) are neither in {package} "
                            f"nor beside it; reinstall gpupool")


KERNEL_DIR = _kernel_dir()
#: Macros set before a source file's text: the constants its kernels share with the Python
#: side, taken from their one definition there.
PLANNER_DEFINES = (("GP_BLOCK_THREADS", str(planner.BLOCK_THREADS)),
                   ("GP_ROW_TILE", str(row_tiles.ROW_TILE)),
                   ("GP_NAMED_GROUP", str(planner.NAMED_GROUP)),
                   ("GP_MAX_PACK", str(planner.MAX_PACK)),
                   ("GP_CELL_COLUMNS", str(tiled_gathers.CELL_COLUMNS)),
                   ("GP_CELL1_ROWS", str(tiled_gathers.CELL1_ROWS)),
                   ("GP_CELL1_COLUMNS", str(tiled_gathers.CELL1_COLUMNS)),
                   ("GP_BROADCAST_PACKS", str(tiled_gathers.BROADCAST_PACKS)),
                   *((f"GP_GATHER_GROUP_{c}", str(g)) for c, g in sorted(
                       planner.GATHER_GROUP.items())))
DEFINES = {f.name: {"quantized_pool.cu": (("GPQ_LEVELS", str(LEVELS)), ("GPQ_HEAD", str(HEAD)))
                    }.get(f.name, ()) + PLANNER_DEFINES
           for f in KERNEL_DIR.glob("*.cu")}
#: A quoted include line, as read_source inlines it.
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


@functools.lru_cache(maxsize=None)
def read_source(source_files: tuple[str, ...], defines: tuple[tuple[str, str], ...] = ()) -> str:
    """The text NVRTC compiles: ``#define``s, then each file with its quoted includes
    (in :data:`KERNEL_DIR`) inlined once."""
    root = KERNEL_DIR
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (root / name).read_text()
        return QUOTED_INCLUDE.sub(lambda m: expand(m.group(1)), text)

    head = "".join(f"#define {k} {v}\n" for k, v in defines)
    return head + "\n".join(expand(f) for f in source_files)


def source(source_file: str) -> str:
    """The text compiled for ``source_file``: :func:`read_source` with its :data:`DEFINES`."""
    return read_source((source_file,), DEFINES.get(source_file, ()))


def compile_options() -> tuple[str, ...]:
    """``OPTIONS`` with CuPy's include paths, as NVRTC receives them (without -arch)."""
    from cupy._core import core
    return tuple(core.assemble_cupy_compiler_options(OPTIONS))


def cache_dir() -> Path:
    """Where compiled kernels are kept between processes: ``$GPUPOOL_CACHE_DIR``, else
    ``~/.cache/gpupool``."""
    return Path(os.environ.get("GPUPOOL_CACHE_DIR") or Path.home() / ".cache" / "gpupool")


def _compiled(source: str, name_expressions: tuple[str, ...]) -> tuple[bytes, dict]:
    """(cubin, name expression -> lowered name) of ``source`` for the current device, from the
    disk cache when an identical compile is there."""
    from cupy.cuda import compiler
    options = compile_options()
    arch = cupy.cuda.Device().compute_capability
    nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    key = hashlib.sha256("\0".join(
        (source, *options, arch, nvrtc, *name_expressions)).encode()).hexdigest()
    path = cache_dir() / f"{key}.kernel"
    try:
        blob = path.read_bytes()
        (head,) = struct.unpack("<Q", blob[:8])
        names = blob[8:8 + head].decode().split("\0")
        return blob[8 + head:], dict(zip(name_expressions, names))
    except (OSError, struct.error, UnicodeDecodeError):
        pass
    log = io.StringIO()
    cubin, mapping = compiler.compile_using_nvrtc(source, options,
                                                  name_expressions=name_expressions,
                                                  log_stream=log)
    head = "\0".join(mapping[n] for n in name_expressions).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(struct.pack("<Q", len(head)) + head + cubin)
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: compile again next time
    return cubin, mapping


@cupy.memoize(for_each_device=True)
def load_module(source_files: tuple[str, ...], name_expressions: tuple[str, ...],
                defines: tuple[tuple[str, str], ...] = ()):
    """``(module, lowered names)`` of ``source_files`` (see :func:`read_source`) with the
    template instantiations ``name_expressions``, on the current device; memoized per device."""
    from cupy.cuda import function
    cubin, mapping = _compiled(read_source(tuple(source_files), tuple(defines)),
                               tuple(name_expressions))
    module = function.Module()
    module.load(cubin)
    return module, mapping


@cupy.memoize(for_each_device=True)
def kernel(name_expression: str):
    """The compiled kernel ``name_expression`` (from its family's ``.cu`` file,
    :func:`gpupool.cuda.names.source_file`) on the current device, compiled on first use,
    then memoized: ``kernel(grid, block, args)`` launches it on the current stream."""
    source_file = source_file_of(name_expression)
    module, mapping = load_module((source_file,), (name_expression,),
                                  DEFINES.get(source_file, ()))
    return module.get_function(mapping[name_expression])
