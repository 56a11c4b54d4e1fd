"""NVRTC through ctypes, from any ``libnvrtc``: the compile tests build the kernels with an
NVRTC other than the one CuPy loaded (a process's CuPy binds one NVRTC for good).

:class:`Program` takes and returns what CuPy's ``cupy.cuda.compiler._NVRTCProgram`` does
(source, file name, name expressions; ``compile(options, log)`` -> (cubin, lowered names)),
so a test drives either the same way. No GPU is needed.
"""
from __future__ import annotations

import contextlib
import ctypes
import types
from pathlib import Path


class CompileException(Exception):
    """NVRTC refused the source; the message holds its log."""


class Library:
    """One ``libnvrtc`` shared library, loaded on its own (``RTLD_LOCAL``)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lib = lib = ctypes.CDLL(str(self.path))
        p, ptr, char_pp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        signatures = {
            "nvrtcVersion": (ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)),
            "nvrtcCreateProgram": (ptr, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                   char_pp, char_pp),
            "nvrtcDestroyProgram": (ptr,),
            "nvrtcAddNameExpression": (p, ctypes.c_char_p),
            "nvrtcCompileProgram": (p, ctypes.c_int, char_pp),
            "nvrtcGetProgramLogSize": (p, size_p),
            "nvrtcGetProgramLog": (p, ctypes.c_char_p),
            "nvrtcGetCUBINSize": (p, size_p),
            "nvrtcGetCUBIN": (p, ctypes.c_char_p),
            "nvrtcGetLoweredName": (p, ctypes.c_char_p, char_pp),
        }
        for name, argtypes in signatures.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = ctypes.c_int
        lib.nvrtcGetErrorString.argtypes = (ctypes.c_int,)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return major.value, minor.value

    def check(self, result: int) -> None:
        if result:
            raise RuntimeError(f"{self.path.name}: {self.lib.nvrtcGetErrorString(result).decode()}")


def _strings(items) -> ctypes.Array:
    return (ctypes.c_char_p * len(items))(*(s.encode() for s in items))


class Program:
    """One NVRTC program of ``library``, as CuPy's ``_NVRTCProgram`` with ``method="cubin"``."""

    def __init__(self, library: Library, source: str, filename: str, name_expressions=(),
                 method: str = "cubin"):
        if method != "cubin":
            raise ValueError(f"Program: method must be 'cubin', got {method!r}")
        self.library, self.names = library, tuple(name_expressions)
        self.source, self.filename = source, filename

    def compile(self, options=(), log_stream=None) -> tuple[bytes, dict[str, str]]:
        """(cubin, name expression -> lowered name); the program log goes to ``log_stream``;
        :class:`CompileException` with the log when NVRTC fails."""
        lib, check = self.library.lib, self.library.check
        with self._compiled(options) as (prog, log):
            if log_stream is not None:
                log_stream.write(log)
            size = ctypes.c_size_t()
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            cubin = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetCUBIN(prog, cubin))
            mapping = {}
            for name in self.names:
                lowered = ctypes.c_char_p()
                check(lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(lowered)))
                mapping[name] = lowered.value.decode()
            return cubin.raw, mapping

    def front_end_log(self, options=()) -> str:
        """The log of the C++ front end alone (``--fdevice-syntax-only``: no code generated);
        :class:`CompileException` with the log when it fails."""
        with self._compiled(tuple(options) + ("--fdevice-syntax-only",)) as (_, log):
            return log

    @contextlib.contextmanager
    def _compiled(self, options):
        """(program handle, log) of a successful compile, destroyed on leaving."""
        lib, check = self.library.lib, self.library.check
        prog = ctypes.c_void_p()
        check(lib.nvrtcCreateProgram(ctypes.byref(prog), self.source.encode(),
                                     self.filename.encode(), 0, None, None))
        try:
            for name in self.names:
                check(lib.nvrtcAddNameExpression(prog, name.encode()))
            result = lib.nvrtcCompileProgram(prog, len(options), _strings(options))
            size = ctypes.c_size_t()
            check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
            buffer = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetProgramLog(prog, buffer))
            log = buffer.value.decode(errors="replace")
            if result:
                raise CompileException(f"{self.filename}: {log}")
            yield prog, log
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cupy_library(real_nvrtc) -> Library:
    """The libnvrtc that CuPy binds (``real_nvrtc``: ``cudacpu.real_nvrtc()``), loaded by CuPy
    first: cuda-pathfinder, CuPy's loader, takes any libnvrtc already in the process."""
    real_nvrtc.compiler.nvrtc.getVersion()
    from cuda.pathfinder import load_nvidia_dynamic_lib
    return Library(load_nvidia_dynamic_lib("nvrtc").abs_path)


def toolchain(library: Library, cuda_include: Path, cupy_core) -> types.SimpleNamespace:
    """``library`` in the shape of ``cudacpu.real_nvrtc()``: ``compiler`` (``_NVRTCProgram``,
    ``CompileException``) and ``core.assemble_cupy_compiler_options``, which gives CuPy's
    options with the CUDA headers of ``library``'s release (``cuda_include``) in place of
    those CuPy found for its own NVRTC."""
    def program(source, filename, name_expressions=(), method="cubin"):
        return Program(library, source, filename, name_expressions, method)

    def assemble_cupy_compiler_options(options):
        own = tuple(cupy_core.assemble_cupy_compiler_options(options))
        cuda = [o for o in own if o.startswith("-I") and (Path(o[2:]) / "cuda_fp16.h").exists()]
        if len(cuda) != 1:
            raise RuntimeError(f"no single CUDA include directory among CuPy's options {own}")
        return tuple(f"-I{cuda_include}" if o == cuda[0] else o for o in own)

    return types.SimpleNamespace(
        compiler=types.SimpleNamespace(_NVRTCProgram=program, CompileException=CompileException),
        core=types.SimpleNamespace(assemble_cupy_compiler_options=assemble_cupy_compiler_options),
        library=library)
