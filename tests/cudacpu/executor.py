"""Run CUDA C++ kernels on the CPU: compile with the host C++ compiler, launch through ctypes.

The source is compiled against ``include/cudacpu.h`` (CUDA's qualifiers, built-in variables,
``__shared__``, barriers and warp collectives on fibers; ``include/cuda_fp16.h`` for
``__half``) into a shared library holding, per name expression, a launcher and a description
of the kernel's parameters. Libraries are cached under ``$CUDACPU_CACHE`` (default
``~/.cache/gpupool-cudacpu``) by a hash of everything that goes into them.

A launch checks each argument against the kernel's parameters before anything runs (a
pointer takes a C-contiguous array of the pointee's element size; a scalar takes a NumPy
scalar of the same kind and width; a Python int or float counts as int64 or float64, as CuPy
passes it), refuses arrays that alias a written pointer (the kernels declare ``__restrict__``)
and blocks larger than the kernel's ``__launch_bounds__``, and guards every array: without a
sanitizer it runs on a copy fenced by canary bytes checked after the launch, so a write out of
bounds fails the launch; with AddressSanitizer on an exact-size copy, so ASan sees any access
past either end. Each copy lies at the array's own address modulo ``ALIGN`` (a misaligned view
stays misaligned, and UBSan's alignment check, part of ``undefined``, fails a misaligned load
as it traps on a GPU).

Build options come from the environment: ``CUDACPU_SANITIZE`` (e.g. ``address,undefined``;
ASan needs its runtime preloaded into Python, see :func:`asan_preload`), ``CUDACPU_OPT``
(default ``-O1``), ``CXX`` (default ``g++``). Schedule and limits are read by the runtime at
each launch: ``CUDACPU_SCHEDULE`` (``forward``, ``reverse``, ``random[:seed]``),
``CUDACPU_WORKERS``, ``CUDACPU_STACK_KB``.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INCLUDE = Path(__file__).resolve().parent / "include"
CANARY_BYTES = 4096
CANARY = 0xA5
#: A guarded copy keeps its array's address modulo ALIGN (CuPy's pool hands out blocks
#: aligned to 512 bytes; the widest vector load is 32).
ALIGN = 512
_LIBC = ctypes.CDLL(None)
_LIBC.posix_memalign.restype = ctypes.c_int
_LIBC.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]
_LIBC.free.argtypes = [ctypes.c_void_p]


#: The recorder of ``trace.py`` while one is active, else None: it builds the libraries
#: (``tracer.build_library``, same arguments as :func:`build_library`) and is told of each launch
#: (``tracer.begin(kernel, grid, block, arrays, parameters)`` with the address and size of each
#: array argument's guarded copy and the bytes of each parameter, a pointer's as 8 zero bytes;
#: then ``tracer.end(kernel)``).
tracer = None


class CompileError(RuntimeError):
    """The host compiler rejected the source."""


class LaunchError(RuntimeError):
    """A launch was refused or failed: bad arguments or configuration, misuse of a barrier or
    warp collective, deadlock, or an out-of-bounds write."""


@dataclass(frozen=True)
class Build:
    """How kernels are compiled: optimisation level and sanitizers."""

    opt: str = "-O1"
    sanitize: str = ""
    cxx: str = "g++"

    @classmethod
    def from_env(cls) -> "Build":
        return cls(os.environ.get("CUDACPU_OPT", "-O1"), os.environ.get("CUDACPU_SANITIZE", ""),
                   os.environ.get("CXX", "g++"))

    @property
    def asan(self) -> bool:
        return "address" in self.sanitize.split(",")

    def flags(self) -> list[str]:
        # -ffp-contract=off: no fused multiply-add, as the NVRTC options (--fmad=false)
        flags = ["-std=c++17", self.opt, "-ffp-contract=off", "-fPIC", "-shared", "-Wall",
                 "-Wno-unknown-pragmas",
                 "-Wno-unused-variable", "-Wno-unused-but-set-variable", f"-I{INCLUDE}"]
        if self.sanitize:
            flags += ["-g", f"-fsanitize={self.sanitize}", "-fno-omit-frame-pointer",
                      "-fno-sanitize-recover=all"]
        return flags


def host_compiler_reason(build: Build | None = None) -> str | None:
    """None when the host C++ compiler works, else why not."""
    cxx = (build or Build.from_env()).cxx
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no host C++ compiler ({cxx}: {exc})"
    return None if done.returncode == 0 else f"{cxx} --version failed"


def asan_preload(build: Build | None = None) -> str:
    """Path of the compiler's ASan runtime, for ``LD_PRELOAD`` of the Python process."""
    cxx = (build or Build.from_env()).cxx
    return subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=True).stdout.strip()


def cache_dir() -> Path:
    """Where built libraries are kept (``$CUDACPU_CACHE``, default ``~/.cache/gpupool-cudacpu``)."""
    path = Path(os.environ.get("CUDACPU_CACHE", Path.home() / ".cache" / "gpupool-cudacpu"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def kernel_name(name_expression: str) -> str:
    """The function name of a name expression (``ns::k<float, 3>`` -> ``k``)."""
    return name_expression.split("<")[0].split("::")[-1].strip()


_BOUNDS_MARK = re.compile(r"\bcudacpu_launch_bounds_mark\s*\(")


def _read_bounds(preprocessed: str) -> dict[str, int]:
    """Kernel name -> max threads per block, from the marks ``__launch_bounds__`` leaves in
    the preprocessed source (cudacpu.h, CUDACPU_MARK_LAUNCH_BOUNDS)."""
    bounds: dict[str, int] = {}
    for mark in _BOUNDS_MARK.finditer(preprocessed):
        depth, i, first_end = 1, mark.end(), None
        while depth:
            c = preprocessed[i]
            depth += (c == "(") - (c == ")")
            if c == "," and depth == 1 and first_end is None:
                first_end = i
            i += 1
        first = preprocessed[mark.end():first_end or i - 1].strip().strip("()").rstrip("uU")
        name = re.match(r"\s*(\w+)\s*\(", preprocessed[i:])
        if name is None or not first.isdigit():
            raise CompileError(f"cudacpu: cannot read __launch_bounds__({first}, ...) "
                               f"before {preprocessed[i:i + 80]!r}: the executor needs an "
                               f"integer literal for the maximum threads per block")
        if bounds.setdefault(name.group(1), int(first)) != int(first):
            raise CompileError(f"cudacpu: {name.group(1)} declared with two launch bounds")
    return bounds


def launch_bounds(code: str, build: Build) -> dict[str, int]:
    """Kernel name -> the maximum threads per block of its ``__launch_bounds__`` in ``code``
    (read from the preprocessed source, so a bound set through a macro counts; cached)."""
    headers = "".join(p.read_text() for p in sorted(INCLUDE.glob("*.h")))
    key = hashlib.sha256("\0".join([build.cxx, headers, code]).encode()).hexdigest()[:32]
    path = cache_dir() / f"bounds_{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "unit.cpp").write_text('#include "cudacpu.h"\n#include "kernel.cu"\n')
        (Path(tmp) / "kernel.cu").write_text(code)
        done = subprocess.run([build.cxx, "-E", "-P", "-std=c++17", f"-I{INCLUDE}",
                               "-DCUDACPU_MARK_LAUNCH_BOUNDS", str(Path(tmp) / "unit.cpp")],
                              capture_output=True, text=True)
    if done.returncode:
        raise CompileError(f"{build.cxx} -E failed:\n{done.stderr[-8000:]}")
    bounds = _read_bounds(done.stdout)
    # a name of this thread's own: build_libraries reads the bounds of one code in several
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(bounds))
    os.replace(partial, path)
    return bounds


def translation_unit(names: tuple[str, ...], defines: tuple[str, ...],
                     bounds: dict[str, int]) -> str:
    """The C++ unit that includes the runtime and ``kernel.cu`` and exports a launcher (that
    enforces the kernel's entry of ``bounds``, :func:`launch_bounds`) and a signature query for
    each of ``names``."""
    parts = [f"#define {d} 1" for d in defines]
    parts += ['#include "cudacpu.h"', '#include "kernel.cu"', ""]
    for i, name in enumerate(names):
        parts.append(
            f'extern "C" int cudacpu_launch_{i}(const unsigned* g, const unsigned* b, '
            f"void** a, char* e, size_t n) {{\n"
            f"  return cudacpu::launch_kernel(&{name}, g, b, a, e, n, "
            f"{bounds.get(kernel_name(name), 0)}u);\n}}\n"
            f'extern "C" int cudacpu_signature_{i}(char* out, size_t n) {{\n'
            f"  return cudacpu::signature(&{name}, out, n);\n}}")
    return "\n".join(parts) + "\n"


def compile_cached(cxx: str, flags: list[str], unit: str, code: str, prefix: str,
                   extra_key: tuple[str, ...] = ()) -> Path:
    """The shared library of ``unit`` (with ``code`` as its ``kernel.cu``) built by ``cxx
    flags``, kept in :func:`cache_dir` as ``<prefix><hash>.so`` under a hash of everything
    that goes into it (the runtime headers, ``extra_key`` too)."""
    headers = "".join(p.read_text() for p in sorted(INCLUDE.glob("*.h")))
    key = hashlib.sha256("\0".join(
        [cxx, " ".join(flags), headers, *extra_key, code, unit]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{prefix}{key}.so"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "unit.cpp").write_text(unit)
        (Path(tmp) / "kernel.cu").write_text(code)
        partial = Path(tmp) / "k.so"
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        done = subprocess.run([cxx, *flags, str(Path(tmp) / "unit.cpp"), "-o", str(partial)],
                              capture_output=True, text=True, env=env)
        if done.returncode:
            raise CompileError(f"{cxx} {' '.join(flags)} failed on {unit.count('cudacpu_launch_')} "
                               f"kernels:\n{done.stderr[-8000:]}")
        os.replace(partial, path)
    return path


def build_library(code: str, names: tuple[str, ...], build: Build,
                  defines: tuple[str, ...] = ()) -> Path:
    """The shared library of ``code`` with launchers for ``names`` (compiled once, cached).
    ``defines``: macros set before the runtime header (``CUDACPU_FTZ``: flush subnormals)."""
    if tracer is not None:
        return tracer.build_library(code, names, build, defines)
    unit = translation_unit(names, defines, launch_bounds(code, build))
    return compile_cached(build.cxx, build.flags(), unit, code, "k_")


def build_libraries(jobs: list[tuple[str, tuple[str, ...]]], build: Build,
                    defines: tuple[str, ...] = ()) -> list[Path]:
    """:func:`build_library` for each ``(code, names)``, on every core."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda job: build_library(job[0], job[1], build, defines), jobs))


@dataclass(frozen=True)
class Param:
    kind: str  # p pointer, b bool, f float, i signed, u unsigned
    size: int
    pointee_kind: str
    pointee_size: int  # 0: void
    const: bool


class Library:
    """A loaded kernel library: :meth:`kernel` by name expression."""

    def __init__(self, path: Path, names: tuple[str, ...]):
        self.path, self.names = path, names
        self.lib = ctypes.CDLL(str(path))

    def kernel(self, name: str) -> "Kernel":
        return Kernel(self, self.names.index(name), name)


_PY_SCALARS = {bool: np.bool_, int: np.int64, float: np.float64}


class Kernel:
    """One kernel: ``kernel(grid, block, args)`` launches it on the calling thread."""

    def __init__(self, library: Library, index: int, name: str):
        self.library, self.name = library, name
        self._launch = getattr(library.lib, f"cudacpu_launch_{index}")
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                 ctypes.c_size_t]
        describe = getattr(library.lib, f"cudacpu_signature_{index}")
        describe.restype = ctypes.c_int
        text = ctypes.create_string_buffer(8192)
        describe(text, len(text))
        self.params = []
        for entry in filter(None, text.value.decode().split(";")):
            kind, size, pkind, psize, const = entry.split()
            self.params.append(Param(kind, int(size), pkind, int(psize), const == "1"))

    def _refuse(self, message: str, exc=LaunchError):
        raise exc(f"{self.name}: {message}")

    def check_args(self, args) -> None:
        """Raise ``TypeError`` unless ``args`` match the kernel's parameters."""
        if len(args) != len(self.params):
            self._refuse(f"{len(args)} arguments for {len(self.params)} parameters", TypeError)
        for i, (a, p) in enumerate(zip(args, self.params)):
            if p.kind == "p":
                if not isinstance(a, np.ndarray):
                    self._refuse(f"argument {i} must be an array (pointer parameter), got "
                                 f"{type(a).__name__}", TypeError)
                if p.pointee_size and a.itemsize != p.pointee_size:
                    self._refuse(f"argument {i} has {a.dtype} elements ({a.itemsize} bytes); "
                                 f"the kernel reads {p.pointee_size}-byte elements", TypeError)
                continue
            scalar = a if isinstance(a, np.generic) else None
            if scalar is None and type(a) in _PY_SCALARS:
                scalar = _PY_SCALARS[type(a)](a)
            if scalar is None:
                self._refuse(f"argument {i} must be a scalar for a {p.size}-byte '{p.kind}' "
                             f"parameter, got {type(a).__name__}", TypeError)
            if scalar.dtype.kind != p.kind or scalar.dtype.itemsize != p.size:
                self._refuse(f"argument {i} is {scalar.dtype} ({type(a).__name__}); the "
                             f"parameter is a {p.size}-byte '{p.kind}'", TypeError)

    def __call__(self, grid, block, args) -> None:
        self.check_args(args)
        arrays = [(i, a) for i, (a, p) in enumerate(zip(args, self.params)) if p.kind == "p"]
        for n, (i, a) in enumerate(arrays):
            if not a.flags.c_contiguous:
                self._refuse(f"argument {i} is not C-contiguous")
            for j, b in arrays[n + 1:]:
                written = not self.params[i].const or not self.params[j].const
                if written and a.size and b.size and np.may_share_memory(a, b):
                    self._refuse(f"arguments {i} and {j} overlap, and one is written "
                                 f"(the kernel declares them __restrict__)")
        asan = Build.from_env().asan
        cells, guards, parameters = [], [], []
        try:
            for a, p in zip(args, self.params):
                if p.kind == "p":
                    guard = _AsanCopy(a) if asan else _CanaryCopy(a)
                    guards.append((guard, a, not p.const))
                    cells.append(ctypes.c_void_p(guard.address))
                    parameters.append(bytes(8))
                else:
                    scalar = a if isinstance(a, np.generic) else _PY_SCALARS[type(a)](a)
                    parameters.append(scalar.tobytes())
                    cells.append(ctypes.create_string_buffer(parameters[-1], p.size))
            pointers = (ctypes.c_void_p * max(1, len(cells)))(
                *[ctypes.cast(ctypes.pointer(c), ctypes.c_void_p).value for c in cells])
            g3 = (ctypes.c_uint * 3)(*(tuple(grid) + (1, 1, 1))[:3])
            b3 = (ctypes.c_uint * 3)(*(tuple(block) + (1, 1, 1))[:3])
            err = ctypes.create_string_buffer(4096)
            if tracer is not None:
                tracer.begin(self, grid, block, [(g.address, g.nbytes) for g, _, _ in guards],
                             parameters)
            rc = self._launch(g3, b3, pointers, err, len(err))
            if tracer is not None:
                tracer.end(self)
            problems = [m for guard, _, _ in guards for m in guard.damage()]
            for guard, a, written in guards:
                if written:
                    guard.copy_back(a)
        finally:
            for guard, _, _ in guards:
                guard.release()
        where = f"grid {tuple(grid)} block {tuple(block)}"
        if rc:
            self._refuse(f"{where}: {err.value.decode()}")
        if problems:
            self._refuse(f"{where}: " + "; ".join(problems))


def _host_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of the C-contiguous array ``a`` (a device array of the stand-in too)."""
    return a.view(np.ndarray).reshape(-1).view(np.uint8)


class _CanaryCopy:
    """The array's bytes between two zones of canary bytes, at its address modulo ALIGN."""

    def __init__(self, a: np.ndarray):
        self.nbytes = a.nbytes
        raw = np.empty(a.nbytes + 2 * CANARY_BYTES + 2 * ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN + a.ctypes.data % ALIGN
        self.buf = raw[start:start + a.nbytes + 2 * CANARY_BYTES]
        self.buf[:] = CANARY
        self.buf[CANARY_BYTES:CANARY_BYTES + a.nbytes] = _host_bytes(a)
        self.address = self.buf.ctypes.data + CANARY_BYTES

    def damage(self) -> list[str]:
        out = []
        before = np.flatnonzero(self.buf[:CANARY_BYTES] != CANARY)
        after = np.flatnonzero(self.buf[CANARY_BYTES + self.nbytes:] != CANARY)
        if before.size:
            out.append(f"out-of-bounds write {CANARY_BYTES - int(before[0])} bytes before an "
                       f"array of {self.nbytes} bytes")
        if after.size:
            out.append(f"out-of-bounds write {int(after[0])} bytes past the end of an array "
                       f"of {self.nbytes} bytes")
        return out

    def copy_back(self, a: np.ndarray) -> None:
        _host_bytes(a)[:] = self.buf[CANARY_BYTES:CANARY_BYTES + self.nbytes]

    def release(self) -> None:
        pass


class _AsanCopy:
    """The array's bytes at the end of an ALIGN-aligned heap block, at the array's address
    modulo ALIGN: ASan's redzone follows the last byte, and the bytes before the first (down
    to its 8-byte granule) are poisoned."""

    def __init__(self, a: np.ndarray):
        self.nbytes = a.nbytes
        self.lead = a.ctypes.data % ALIGN
        block = ctypes.c_void_p()
        if _LIBC.posix_memalign(ctypes.byref(block), ALIGN, self.lead + max(1, a.nbytes)):
            raise MemoryError("cudacpu: posix_memalign failed")
        self.block = block.value
        self.address = self.block + self.lead
        _asan_poison("__asan_poison_memory_region", self.block, self.lead & ~7)
        ctypes.memmove(self.address, a.ctypes.data, a.nbytes)

    def damage(self) -> list[str]:
        return []

    def copy_back(self, a: np.ndarray) -> None:
        ctypes.memmove(a.ctypes.data, self.address, self.nbytes)

    def release(self) -> None:
        _asan_poison("__asan_unpoison_memory_region", self.block, self.lead & ~7)
        _LIBC.free(self.block)


def _asan_poison(function: str, address: int, size: int) -> None:
    """ASan's (un)poisoning of ``size`` bytes at ``address`` (nothing without its runtime)."""
    call = getattr(_LIBC, function, None)
    if call is not None and size:
        call.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        call(address, size)
