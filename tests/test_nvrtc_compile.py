"""Every CUDA kernel instantiation the runtime can request compiles with NVRTC for sm_90, and
its float32 and bfloat16, 32-bit-offset ones for sm_80 too, with no error and no warning.
Needs CuPy and its NVRTC library, not a GPU. (sm_80 goes through the same front end; its code generator differs
in registers, which only sm_90 bounds (accumulate.cuh window_blocks), so a sample of it keeps
the compile time of the suite in check.)

sm_100 and sm_120, what CuPy builds for Blackwell GPUs with NVRTC 13, build the instantiations
whose code the kernels choose by architecture (``for_arch``): max_pool's, avg_pool's and
max_pool_packs's register bounds (accumulate.cuh GP_BY_ARCH; float, half and bfloat16 elements with 32-bit
offsets, which GP_WINDOW_BOUNDS holds to them) and the run-time walks of the backward gathers
with 64-bit offsets (walk.cuh runtime_span), which sit at 255 registers on every architecture.
Every instantiation for both would add about 25 minutes to the suite.

The options are the ones ``cupy.RawModule`` uses at run time: CuPy's own include paths and
``--std=c++17`` (``cupy._core.core.assemble_cupy_compiler_options``), the backend's OPTIONS,
``-arch=sm_XX`` and ``--device-as-default-execution-space`` (added by CuPy's NVRTC path when
jitify is off, the RawModule default). The source is the same text (``source``) and the
name expressions the same list (``instantiations``) the runtime uses. ``compile_using_nvrtc``
itself asks the driver for the device's architecture, so the test drives CuPy's NVRTC program
wrapper directly with an explicit architecture.

ptxas reports each kernel's resources (``-Xptxas=-v``): no kernel may keep a stack frame or
spill registers, since either puts per-thread arrays or spilled values in local memory (DRAM
traffic that the roofline of a memory-bound kernel does not count).

NVRTC 12, what the ``cuda12`` extra brings for a CUDA 12 driver, compiles every instantiation
for sm_90 the same way, through ctypes (``nvrtc_ctypes``: a process's CuPy binds one NVRTC);
its wheels come from the directory named by ``GPUPOOL_TEST_NVRTC12`` (``.ci/run`` fills one).
The backend compiles each kernel alone (one name expression per program), and NVRTC's front
end warns about what such a program leaves unused, which a batch of names hides: each
instantiation also goes through the front end alone.
"""
from __future__ import annotations

import functools
import io
import os
import re
import types
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nvrtc_ctypes
import pytest

from gpupool.cuda import kernels as cuda_kernels
from gpupool.cuda import names as kernel_names
from gpupool.cuda import probe

pytestmark = pytest.mark.nvrtc

ARCHS = ("80", "90", "100", "120")
#: The quantized kernels (int8 and uint8 codes).
QUANTIZED_KERNELS = ("qmax_", "qavg_")
#: The kernels whose register bound names a count per architecture (GP_BY_ARCH), and those
#: that walk run-time line counts (walk_lines_runtime) in the backward gathers.
ARCH_BOUND_KERNELS = ("max_pool<", "avg_pool<", "max_pool_packs<")
RUNTIME_WALK_KERNELS = ("max_window_backward<", "avg_window_backward<", "lp_window_backward<",
                        "max_adaptive_backward<", "avg_adaptive_backward<")
#: A directory filled by ``pip install --target`` with ``nvidia-cuda-nvrtc-cu12`` and
#: ``nvidia-cuda-runtime-cu12`` (its CUDA headers); unset, the NVRTC 12 tests skip.
NVRTC12_DIR = "GPUPOOL_TEST_NVRTC12"


def for_arch(names, arch: str) -> list[str]:
    """The instantiations compiled for sm_``arch``: all for sm_90; for sm_80 those of float32
    and bfloat16 elements, 32-bit words or int8/uint8 codes, with 32-bit offsets (and
    accumulators); for sm_100 and sm_120 the
    kernels with a bound per architecture of float, half and bfloat16 elements with 32-bit
    offsets and the run-time walks with 64-bit offsets."""
    if arch == "90":
        return list(names)
    if arch in ("100", "120"):
        return [n for n in names
                if n.startswith(ARCH_BOUND_KERNELS)
                and re.match(r"\w+<(float|__half|__nv_bfloat16), int,", n)
                or n.startswith(RUNTIME_WALK_KERNELS) and ", long long," in n]
    return [n for n in names
            if ("float" in n or "unsigned int" in n or n.startswith(QUANTIZED_KERNELS))
            and "long long" not in n and "double" not in n and "__half" not in n]


@functools.cache
def every_instantiation() -> dict[str, list[str]]:
    """Source file -> every name expression the runtime can request
    (:func:`gpupool.cuda.names.instantiations`)."""
    files = defaultdict(list)
    for source_file, name in kernel_names.instantiations():
        files[source_file].append(name)
    return dict(files)


def nvrtc_options(real_nvrtc, arch: str) -> tuple[str, ...]:
    """What the runtime passes to NVRTC: CuPy's include paths, the backend's OPTIONS, then
    -arch and --device-as-default-execution-space (added by ``compile_using_nvrtc``)."""
    return tuple(real_nvrtc.core.assemble_cupy_compiler_options(cuda_kernels.OPTIONS)) + (
        f"-arch=sm_{arch}", "--device-as-default-execution-space")


def test_instantiation_list_covers_every_family():
    """The one list names every kernel template of every ``.cu`` file, each once."""
    files = every_instantiation()
    assert set(files) == {f.name for f in cuda_kernels.KERNEL_DIR.glob("*.cu")}
    names = [n for ns in files.values() for n in ns]
    assert len(names) == len(set(names))
    for base in kernel_names.FAMILY_FILES:
        assert any(n.startswith(base + "<") for n in names), base
    for source_file in files:  # each file's kernels: those FAMILY_FILES gives it
        text = cuda_kernels.source(source_file)
        bases = [b for b, f in kernel_names.FAMILY_FILES.items() if f == source_file]
        assert text.count("__global__") == len(bases), source_file
        assert all(re.search(rf"\b{b}\(", text) for b in bases), source_file


def test_shared_constants_are_defined_once_by_the_host():
    """The constants the kernels share with the host (the planner's block size, row tile and
    gather groups; quantized_spec's LEVELS and HEAD) reach every kernel file as #defines ahead
    of its text, from their one definition on the Python side: no kernel file defines them or
    writes their values as literals where they belong, and a file compiled without them fails
    on an #error naming the host."""
    import re

    from gpupool import quantized_spec as QS
    from gpupool.cuda import planner, row_tiles, tiled_gathers
    want = {"GP_BLOCK_THREADS": planner.BLOCK_THREADS, "GP_ROW_TILE": row_tiles.ROW_TILE,
            "GP_NAMED_GROUP": planner.NAMED_GROUP, "GP_MAX_PACK": planner.MAX_PACK,
            "GP_BROADCAST_PACKS": tiled_gathers.BROADCAST_PACKS,
            "GP_CELL_COLUMNS": tiled_gathers.CELL_COLUMNS,
            "GP_CELL1_ROWS": tiled_gathers.CELL1_ROWS,
            "GP_CELL1_COLUMNS": tiled_gathers.CELL1_COLUMNS,
            **{f"GP_GATHER_GROUP_{c}": g for c, g in planner.GATHER_GROUP.items()}}
    kernels = {f.name: f.read_text() for f in cuda_kernels.KERNEL_DIR.iterdir()}
    for name in cuda_kernels.DEFINES:
        text = cuda_kernels.source(name)
        defines = dict(re.findall(r"^#define (GP\w+|GPQ\w+) (\S+)$", text, re.M))
        assert {k: int(defines[k]) for k in want} == want, name
        if name == "quantized_pool.cu":
            assert (int(defines["GPQ_LEVELS"]), int(defines["GPQ_HEAD"])) == (QS.LEVELS,
                                                                               QS.HEAD)
    for name, text in kernels.items():
        assert not re.search(r"#\s*define\s+(GP_(BLOCK_THREADS|ROW_TILE|NAMED_GROUP|MAX_PACK|"
                             r"BROADCAST_PACKS|CELL_COLUMNS|CELL1_ROWS|CELL1_COLUMNS|"
                             r"GATHER_GROUP_\d)|GPQ_LEVELS|GPQ_HEAD)\b", text), name
        assert not re.search(r"__launch_bounds__\(\s*\d", text), name
    guards = kernels["geometry.cuh"] + kernels["quantized_pool.cu"]
    assert all(f"!defined({k})" in guards for k in want)
    assert "#error" in kernels["geometry.cuh"] and "gpupool.cuda.kernels.DEFINES" in guards


#: Programs compiled at once: NVRTC releases the GIL while it compiles, so a file's names,
#: dealt round robin into this many programs (each with some of every kernel family), build
#: on every core.
PROGRAMS_AT_ONCE = os.cpu_count() or 1


def compile_clean(real_nvrtc, source_file: str, names, arch: str) -> None:
    """Compile ``names`` from ``source_file`` for sm_``arch``; fails the test on a compile
    error, on any NVRTC or ptxas diagnostic, and on a kernel with a stack frame or spills."""
    compile_text(real_nvrtc, cuda_kernels.source(source_file), source_file, names, arch)


def compile_text(real_nvrtc, text: str, source_file: str, names, arch: str) -> None:
    """:func:`compile_clean` of the source ``text`` (named ``source_file``), its names in up to
    :data:`PROGRAMS_AT_ONCE` programs compiled at once."""
    names = list(names)
    shards = [names[i::PROGRAMS_AT_ONCE] for i in range(min(PROGRAMS_AT_ONCE, len(names)))]
    with ThreadPoolExecutor(max(1, len(shards))) as pool:
        list(pool.map(lambda shard: compile_program(real_nvrtc, text, source_file, shard, arch),
                      shards or [[]]))


def compile_program(real_nvrtc, text: str, source_file: str, names, arch: str) -> None:
    """One program of :func:`compile_text`."""
    compiler = real_nvrtc.compiler
    program = compiler._NVRTCProgram(text, source_file, name_expressions=list(names),
                                     method="cubin")
    log = io.StringIO()
    try:
        cubin, mapping = program.compile(nvrtc_options(real_nvrtc, arch) + ("-Xptxas=-v",), log)
    except compiler.CompileException as exc:
        pytest.fail(f"NVRTC failed on {source_file} for sm_{arch}:\n{exc}")
    lines = [line for line in log.getvalue().replace("\0", "").splitlines() if line.strip()]
    report = [line for line in lines if re.match(r"ptxas( info)? *[:.]", line)]
    diagnostics = [line for line in lines if line not in report]
    assert not diagnostics, f"NVRTC/ptxas said for {source_file} sm_{arch}:\n" + "\n".join(diagnostics)
    text = "\n".join(report)
    kernels = re.findall(r"Compiling entry function '(\S+)'", text)
    # every function ptxas emitted (the kernels and any callee it kept, such as pow's)
    functions = re.findall(r"Function properties for (\S+)\n\S+ *\. *(.*)", text)
    assert len(kernels) >= len(names) and set(kernels) <= {f for f, _ in functions}
    heavy = [(f, r) for f, r in functions
             if r.strip() != "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"]
    assert not heavy, f"kernels with local memory for sm_{arch}: {heavy[:5]}"
    mapping = mapping or {}  # CuPy's: None without name expressions
    assert cubin and set(mapping) == set(names) and all(mapping[n] for n in names)


@pytest.mark.parametrize(("source_file", "arch"),
                         [(f, a) for f in sorted(every_instantiation()) for a in ARCHS
                          if for_arch(every_instantiation()[f], a)])
def test_compiles_without_warnings_or_local_memory(real_nvrtc, source_file, arch):
    compile_clean(real_nvrtc, source_file, for_arch(every_instantiation()[source_file], arch),
                  arch)


def test_no_multiply_add_is_fused(real_nvrtc):
    """The backend's options keep ``s + v * v`` two roundings, as the NumPy backend computes
    it (Lp sums agree bit for bit); NVRTC's default (``--fmad=true``) fuses them into one fma."""
    source = 'extern "C" __global__ void k(const float* x, float* s) { s[0] += x[0] * x[0]; }'

    def fused(options) -> int:
        program = real_nvrtc.compiler._NVRTCProgram(source, "k.cu", method="ptx")
        ptx, _ = program.compile(tuple(real_nvrtc.core.assemble_cupy_compiler_options(options))
                                 + ("-arch=compute_90",), io.StringIO())
        return len(re.findall(r"\bfma\.", ptx.decode() if isinstance(ptx, bytes) else ptx))

    assert fused(tuple(o for o in cuda_kernels.OPTIONS if o != "--fmad=false")) > 0
    assert fused(cuda_kernels.OPTIONS) == 0


@functools.cache
def _nvrtc12_library(root: str) -> nvrtc_ctypes.Library:
    library = nvrtc_ctypes.Library(Path(root) / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    assert library.version()[0] == 12, library.version()
    return library


@pytest.fixture
def nvrtc12(real_nvrtc):
    """NVRTC 12 and its CUDA headers (``GPUPOOL_TEST_NVRTC12``) in the shape of ``real_nvrtc``."""
    root = os.environ.get(NVRTC12_DIR)
    if not root:
        pytest.skip(f"{NVRTC12_DIR} is not set (pip install --target DIR "
                    f"nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12, as .ci/run does)")
    nvrtc_ctypes.cupy_library(real_nvrtc)  # CuPy binds its own NVRTC before ours is loaded
    return nvrtc_ctypes.toolchain(_nvrtc12_library(root),
                                  Path(root) / "nvidia" / "cuda_runtime" / "include",
                                  real_nvrtc.core)


@pytest.fixture(params=["cupy", "12"], ids=["cupy-nvrtc", "nvrtc12"])
def nvrtc(request, real_nvrtc):
    """CuPy's NVRTC, then NVRTC 12, each with ``library`` (``nvrtc_ctypes.Library``)."""
    if request.param == "12":
        return request.getfixturevalue("nvrtc12")
    return types.SimpleNamespace(compiler=real_nvrtc.compiler, core=real_nvrtc.core,
                                 library=nvrtc_ctypes.cupy_library(real_nvrtc))


def per_kernel_and_types(names) -> list[str]:
    """The first of ``names`` of each kernel template and its type arguments (element,
    index and word types; the constants aside)."""
    kept: dict[tuple, str] = {}
    for name in names:
        kernel, _, arguments = name.partition("<")
        types = tuple(a for a in (a.strip(" >") for a in arguments.split(","))
                      if a not in ("true", "false") and not a.lstrip("-").isdigit())
        kept.setdefault((kernel, types), name)
    return list(kept.values())


@pytest.mark.parametrize("source_file", sorted(every_instantiation()))
def test_nvrtc12_compiles_without_warnings_or_local_memory(nvrtc12, source_file):
    """NVRTC 12 builds (ptxas included) one instantiation of each kernel and its types for
    sm_90; its front end sees every instantiation (below). Building all of them would about
    double this file's CI time for what the two compilers share."""
    compile_clean(nvrtc12, source_file, per_kernel_and_types(every_instantiation()[source_file]),
                  "90")


def test_probe_kernel_compiles(nvrtc):
    """gpu_usable's probe kernel, with the backend's options, by every NVRTC the extras bring."""
    compile_text(nvrtc, probe.PROBE_SOURCE, "probe.cu", (), "90")


@pytest.mark.parametrize("source_file", sorted(every_instantiation()))
def test_each_instantiation_alone_passes_the_front_end_without_warnings(nvrtc, source_file):
    """A name expression of each kernel and its types in a program of its own, as the backend
    compiles it: a program of one kernel leaves unused what other kernels use (NVRTC warns
    #177-D about a constant at namespace scope only they reference). What a program holds
    decides that, not an instantiation's constants: a warning inside an instantiation shows in
    the batch compiles above too."""
    text = cuda_kernels.source(source_file)
    options = nvrtc_options(nvrtc, "90")
    names = per_kernel_and_types(every_instantiation()[source_file])
    said = {}
    for name in names:
        log = nvrtc_ctypes.Program(nvrtc.library, text, source_file, (name,)).front_end_log(options)
        if log.strip():
            said[name] = log.strip()
    shown = "\n".join(f"{name}: {log}" for name, log in list(said.items())[:3])
    assert not said, f"{len(said)} of {len(names)} said:\n{shown}"
