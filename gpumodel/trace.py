"""Trace mode of the CPU executor: every global load and store a launch makes to its array
arguments, with the CUDA block and thread that made it.

While a :class:`Recorder` is active (``with Recorder() as rec:``), the executor builds its
libraries for tracing and each launch leaves a :class:`Launch` in ``rec.launches``:

* build: the executor's translation unit plus ``trace_rt.h``, compiled with
  ``-fsanitize=thread -static-libtsan``: GCC calls a hook before every memory access and no
  ThreadSanitizer runtime is linked, so ``trace_rt.h``'s hooks record the accesses that fall in
  the launch's arrays. A bare ``#pragma unroll`` becomes ``#pragma GCC unroll 64``, so a loop
  NVCC unrolls fully (the taps of a window of compiled-in size) has one site per iteration, as
  in the GPU's code. Libraries are cached beside the executor's, under their own names.
* launch: the guarded copies of the array arguments are the recorded ranges; one OS thread
  runs the blocks (``CUDACPU_WORKERS=1`` while recording), in the executor's usual order.

A record is (block, thread, site, address, size, write). Its site is the instrumented
instruction: :meth:`Launch.site_lines` gives the source line it came from.
"""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cudacpu import executor

RUNTIME = Path(__file__).resolve().parent / "trace_rt.h"
#: one record of trace_rt.h
RECORD = np.dtype([("addr", "<u8"), ("site", "<u8"), ("block", "<u4"), ("info", "<u4")])
_UNROLL = re.compile(r"^(\s*)#\s*pragma\s+unroll\s*$", re.M)


@dataclass(frozen=True)
class Array:
    """An array argument of a launch: its guarded copy's address range, and whether the
    kernel declares it const (only read)."""

    address: int
    nbytes: int
    const: bool


@dataclass
class Launch:
    """One traced launch: the kernel's name expression, grid, block, array arguments (in
    parameter order), its records (``RECORD``, in the order they were made) and its
    parameter buffer (:func:`parameter_buffer`)."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arrays: list[Array]
    records: np.ndarray
    library: Path
    base: int  # load address of the library: a site minus base is an offset in the file
    recorded_blocks: int  # the blocks of the lowest linear indices whose accesses it holds
    parameters: bytes

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def columns(self) -> dict[str, np.ndarray]:
        """The records as int64 columns: block, thread, write (0/1), size, addr, site."""
        r = self.records
        info = r["info"].astype(np.int64)
        return {"block": r["block"].astype(np.int64), "thread": info >> 16,
                "write": (info >> 15) & 1, "size": info & 0x7FFF,
                "addr": r["addr"].astype(np.int64), "site": r["site"].astype(np.int64)}

    def site_lines(self, sites) -> dict[int, int]:
        """Site -> the line of the kernel source it was compiled from (the innermost inlined
        frame; 1-based), by ``addr2line``; 0 where that is not available."""
        sites = sorted({int(s) for s in sites})
        lines = dict.fromkeys(sites, 0)
        try:
            done = subprocess.run(["addr2line", "-a", "-i", "-e", str(self.library)]
                                  + [hex(s - self.base - 1) for s in sites],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return lines
        frames: dict[int, list[str]] = {}
        for line in done.stdout.splitlines():
            if line.startswith("0x"):
                current = frames.setdefault(int(line, 16) + self.base + 1, [])
            else:
                current.append(line)
        for s in sites:
            file, _, where = (frames.get(s) or [""])[0].partition(":")
            number = where.split()[0] if where.split() else ""
            if file.endswith("kernel.cu") and number.isdigit():
                lines[s] = int(number)
        return lines


def parameter_buffer(parameters) -> bytes:
    """A kernel's parameters laid out as the GPU's constant bank holds them from its first
    parameter on (each aligned to its size; at ``c[0x0][0x210]`` on sm_90)."""
    out = bytearray()
    for p in parameters:
        out += bytes(-len(out) % len(p)) + p
    return bytes(out)


def trace_source(code: str) -> str:
    """``code`` as a trace build compiles it: bare ``#pragma unroll`` unrolls fully."""
    return _UNROLL.sub(r"\1#pragma GCC unroll 64", code)


def build_library(code: str, names: tuple[str, ...], build: executor.Build,
                  defines: tuple[str, ...] = ()) -> Path:
    """The trace build of ``code`` with launchers for ``names`` (as
    :func:`executor.build_library`; cached). Always ``-O1`` (unrolling needs optimisation) and
    without ``build``'s sanitizers; ``build`` gives the compiler."""
    unit = (executor.translation_unit(names, defines + ("CUDACPU_TRACE",),
                                      executor.launch_bounds(code, build))
            + f'#include "{RUNTIME.name}"\n')
    flags = executor.Build("-O1", "", build.cxx).flags() + [
        "-g1", "-gdwarf-4", "-fsanitize=thread", "-static-libtsan", f"-I{RUNTIME.parent}"]
    return executor.compile_cached(build.cxx, flags, unit, trace_source(code), "trace_",
                                   (RUNTIME.read_text(),))


class Recorder:
    """Context manager: while inside, the executor builds trace libraries and every launch is
    recorded into ``launches``. Not reentrant; one recorder at a time."""

    def __init__(self, block_limit: int | None = None):
        """``block_limit``: record only the blocks of a lower linear index (x + grid x *
        (y + grid y * z)) of each launch; None: every block."""
        self.launches: list[Launch] = []
        self.block_limit = block_limit
        self._pending = None
        self._saved_workers = None

    def __enter__(self) -> "Recorder":
        if executor.tracer is not None:
            raise RuntimeError("gpumodel.trace: a recorder is already active")
        self._saved_workers = os.environ.get("CUDACPU_WORKERS")
        os.environ["CUDACPU_WORKERS"] = "1"
        executor.tracer = self
        return self

    def __exit__(self, *exc) -> bool:
        executor.tracer = None
        if self._saved_workers is None:
            os.environ.pop("CUDACPU_WORKERS", None)
        else:
            os.environ["CUDACPU_WORKERS"] = self._saved_workers
        return False

    build_library = staticmethod(build_library)

    def begin(self, kernel: executor.Kernel, grid, block, ranges, parameters) -> None:
        """Before ``kernel``'s launch: record accesses to ``ranges`` ((address, nbytes) of each
        array argument, in parameter order); ``parameters``: each parameter's bytes."""
        lib = kernel.library.lib
        try:
            start = lib.cudacpu_trace_begin
        except AttributeError:
            raise RuntimeError(f"gpumodel.trace: {kernel.name} was built before the recorder "
                               f"was active (not a trace build)") from None
        start.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2 + [ctypes.c_int]
        n = max(1, len(ranges))
        lo = (ctypes.c_uint64 * n)(*[a for a, _ in ranges])
        hi = (ctypes.c_uint64 * n)(*[a + nb for a, nb in ranges])
        if start(lo, hi, len(ranges)):
            raise RuntimeError(f"gpumodel.trace: {kernel.name} has too many array arguments")
        lib.cudacpu_trace_block_limit.argtypes = [ctypes.c_uint32]
        lib.cudacpu_trace_block_limit(0xFFFFFFFF if self.block_limit is None
                                      else self.block_limit)
        pointer_params = [p for p in kernel.params if p.kind == "p"]
        arrays = [Array(a, nb, p.const) for (a, nb), p in zip(ranges, pointer_params)]
        self._pending = (tuple((tuple(grid) + (1, 1, 1))[:3]),
                         tuple((tuple(block) + (1, 1, 1))[:3]), arrays,
                         parameter_buffer(parameters))

    def end(self, kernel: executor.Kernel) -> None:
        """After ``kernel``'s launch: keep its records as a :class:`Launch`."""
        lib = kernel.library.lib
        lib.cudacpu_trace_end()
        lib.cudacpu_trace_count.restype = ctypes.c_size_t
        lib.cudacpu_trace_records.restype = ctypes.c_void_p
        lib.cudacpu_trace_base.restype = ctypes.c_uint64
        if lib.cudacpu_trace_overflow():
            raise MemoryError(f"gpumodel.trace: {kernel.name}: the trace did not fit in memory")
        count = lib.cudacpu_trace_count()
        records = np.zeros(0, RECORD)
        if count:
            # not ctypes.string_at: it takes the size as a C int, so a trace past 2 GiB
            # came back cut to a size that is no multiple of a record
            raw = (ctypes.c_char * (count * RECORD.itemsize)).from_address(
                lib.cudacpu_trace_records())
            records = np.frombuffer(raw, RECORD).copy()
        grid, block, arrays, parameters = self._pending
        blocks = grid[0] * grid[1] * grid[2]
        self.launches.append(Launch(kernel.name, grid, block, arrays, records,
                                    kernel.library.path, int(lib.cudacpu_trace_base()),
                                    min(blocks, self.block_limit or blocks), parameters))
