"""CUDA backend: CuPy arrays in, CUDA kernels from ``kernels_cu/`` compiled with NVRTC.

Its ``window``, ``adaptive`` and ``unpool`` are entry points of
:class:`gpupool.cuda.entry_points.CudaBackend`, imported when the first CuPy array arrives.

* Kernel source: ``kernels_cu/`` (:data:`KERNEL_DIR`), package data in a wheel: one ``.cu``
  per op family and the ``.cuh`` headers it includes, inlined by :func:`read_source` after the
  file's :data:`DEFINES` (:func:`source`), so the on-disk kernel cache keys on the full text.
* Every static choice (element type, index type, layout, specialised window size, lanes) is a
  template argument: a kernel is one ``name_expression``, compiled once per (device, file,
  name expression) by :func:`load_module` (memoized per device, and kept on disk), never on a
  warm call. :func:`instantiations` lists every name expression the runtime can ask for; the
  NVRTC test compiles exactly that list.
* Compiled with NVRTC directly (``OPTIONS``): ``cupy.RawModule`` appends ``-ftz=true``, which
  flushes float32 subnormals to zero on the GPU, where the NumPy backend keeps them.
* Launch plans come from :mod:`gpupool.cuda.planner`; the per-spec launch steps (kernel objects,
  grid, block, scalar arguments) are cached per (spec, device), so a warm call only checks
  contiguity, allocates scratch when a two-pass reduction needs it and launches.
* Launches go to CuPy's current stream; nothing synchronises, nothing is copied to the host
  (the one exception: window and adaptive pooling with more than 3 spatial dims, which the
  kernels do not cover, run on the NumPy backend through a host round trip).
* Non-contiguous inputs are first copied with ``cupy.ascontiguousarray`` (on the current
  stream); the kernels assume C-contiguous input (NCHW: planes of ``prod(spatial)``; NHWC:
  rows of ``prod(spatial) * C``).
"""
from __future__ import annotations

import functools
import hashlib
import io
import itertools
import math
import operator
import os
import re
import struct
from pathlib import Path
from typing import NamedTuple

import cupy
import numpy as np

from . import planner
from ..arrays import dtype_name
from ..quantized_spec import HEAD, LEVELS
from ..spec import (ACC_DTYPES, FLOAT_DTYPES, INT_DTYPES, AdaptiveSpec, UnpoolSpec, WindowSpec,
                    window_spec)

#: dtype name -> C type of the kernels (the only dtypes the kernels are instantiated for).
CTYPES = {
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "int32": "int",
    "int64": "long long",
}
#: unsigned word moved by max_unpool for each element size.
WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
INDEX_TYPES = ("int", "long long")
#: NVRTC options of every kernel (plus CuPy's include paths, and -arch from the device): IEEE
#: float32, subnormals kept, division and square root correctly rounded, and no multiply-add
#: fused into one rounding (the NumPy backend rounds each, and both backends' sums must agree
#: bit for bit).
OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "--fmad=false")

FAMILY_FILES = {
    "max_pool": "max_pool.cu", "max_pool_indices": "max_pool.cu", "max_unpool": "max_pool.cu",
    "max_pool_rows": "max_pool.cu", "avg_pool_rows": "avg_pool.cu",
    "max_unpool_gather": "max_pool.cu",
    "avg_pool": "avg_pool.cu", "lp_pool": "avg_pool.cu",
    "adaptive_max": "adaptive_pool.cu", "adaptive_max_indices": "adaptive_pool.cu",
    "adaptive_avg": "adaptive_pool.cu", "adaptive_max_lanes": "adaptive_pool.cu",
    "adaptive_max_indices_lanes": "adaptive_pool.cu", "adaptive_avg_lanes": "adaptive_pool.cu",
    "global_lanes": "global_pool.cu", "global_block": "global_pool.cu",
    "global_channels": "global_pool.cu",
}


def ctype(dtype: str) -> str:
    """C type of a dtype name; ``TypeError`` before anything is compiled if unsupported."""
    try:
        return CTYPES[dtype]
    except KeyError:
        raise TypeError(f"gpupool (cuda): dtype {dtype} has no CUDA kernel "
                        f"(supported: {', '.join(CTYPES)})") from None


def _acc(dtype: str) -> str:
    """Accumulator dtype of the reductions (Num<T>::acc in traits.cuh): ACC_DTYPES for
    floats, the dtype itself for integers."""
    return ACC_DTYPES.get(dtype, dtype)


def cbool(b) -> str:
    """A C++ bool template argument."""
    return "true" if b else "false"


# ----------------------------------------------------------------- source and compilation


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
                   ("GP_ROW_TILE", str(planner.ROW_TILE)),
                   ("GP_NAMED_GROUP", str(planner.NAMED_GROUP)),
                   ("GP_MAX_PACK", str(planner.MAX_PACK)),
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
    template instantiations ``name_expressions``, on the current device; memoized per device.
    Reusable by other kernel families (e.g. quantized pooling): pass its own ``.cu`` files."""
    from cupy.cuda import function
    cubin, mapping = _compiled(read_source(tuple(source_files), tuple(defines)),
                               tuple(name_expressions))
    module = function.Module()
    module.load(cubin)
    return module, mapping


@cupy.memoize(for_each_device=True)
def kernel(source_file: str, name_expression: str):
    """The compiled kernel ``name_expression`` of ``source_file`` on the current device
    (compiled on first use, then memoized): ``kernel(grid, block, args)`` launches it on
    the current stream."""
    module, mapping = load_module((source_file,), (name_expression,),
                                  DEFINES.get(source_file, ()))
    return module.get_function(mapping[name_expression])


# ----------------------------------------------------------------- name expressions
def window_name(kernel_base: str, dtype: str, itype: str, k: int, nhwc: bool) -> str:
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {k}, {cbool(nhwc)}>"


def rows_name(kernel_base: str, dtype: str, shape: tuple[int, ...]) -> str:
    """A row-tile kernel's name expression; ``shape``: its (KH, KW, SW, VEC, LEAD)
    (:func:`gpupool.cuda.planner.row_tile`)."""
    return f"{kernel_base}<{ctype(dtype)}, {', '.join(map(str, shape))}>"


def row_tile_shapes(op: str, dtype: str) -> list[tuple[int, ...]]:
    """Every (KH, KW, SW, VEC, LEAD) :func:`gpupool.cuda.planner.row_tile` gives ``op``
    ("max" or "avg") on ``dtype``: each window of ROW_TILE_WINDOWS with each W pad up to half
    the window, on rows of 64 elements (packs where the window takes them) and of 37 (none)."""
    shapes = []
    for kh, kw, sw in planner.ROW_TILE_WINDOWS:
        spatial, kernel, stride = ((8,), (kh, kw), (1, sw)) if kh > 1 else ((), (kw,), (sw,))
        for pad, width in itertools.product(range(kw // 2 + 1), (64, 37)):
            spec = window_spec(f"{op}_pool", op, (1, 1) + spatial + (width,), dtype, kernel,
                               stride, pad, 1, False, "NCHW")
            shapes.append(planner.row_tile(spec))
    return list(dict.fromkeys(s for s in shapes if s))


def adaptive_name(kernel_base: str, dtype: str, itype: str, nhwc: bool) -> str:
    """The lane-group kernels (``*_lanes``) take NCHW only and have no layout parameter."""
    if kernel_base.endswith("_lanes"):
        return f"{kernel_base}<{ctype(dtype)}, {itype}>"
    return f"{kernel_base}<{ctype(dtype)}, {itype}, {cbool(nhwc)}>"


def global_name(kernel_base: str, is_max: bool, tin: str, tout: str, itype: str,
                lanes: int | None = None) -> str:
    tail = f", {lanes}" if kernel_base == "global_lanes" else ""
    return f"{kernel_base}<{cbool(is_max)}, {ctype(tin)}, {ctype(tout)}, {itype}{tail}>"


def unpool_name(itemsize: int, indices_dtype: str, itype: str, nhwc: bool | None = None) -> str:
    """The scatter's name expression, or with ``nhwc`` (a bool) the gather's."""
    if nhwc is None:
        return f"max_unpool<{WORDS[itemsize]}, {ctype(indices_dtype)}, {itype}>"
    return (f"max_unpool_gather<{WORDS[itemsize]}, {ctype(indices_dtype)}, {itype}, "
            f"{cbool(nhwc)}>")


def instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) the runtime can request."""
    out = []
    ks = (0,) + planner.SPECIALISED_K
    for itype in INDEX_TYPES:
        for nhwc in (False, True):
            for dtype in CTYPES:
                for base in ("max_pool", "max_pool_indices"):
                    out += [(FAMILY_FILES[base], window_name(base, dtype, itype, k, nhwc))
                            for k in ks]
                for base in ("adaptive_max", "adaptive_max_indices") + (
                        () if nhwc else ("adaptive_max_lanes", "adaptive_max_indices_lanes")):
                    out.append((FAMILY_FILES[base], adaptive_name(base, dtype, itype, nhwc)))
            for dtype in FLOAT_DTYPES:
                for base in ("avg_pool", "lp_pool"):
                    out += [(FAMILY_FILES[base], window_name(base, dtype, itype, k, nhwc))
                            for k in ks]
                for base in ("adaptive_avg",) + (() if nhwc else ("adaptive_avg_lanes",)):
                    out.append((FAMILY_FILES[base], adaptive_name(base, dtype, itype, nhwc)))
        for op in ("max", "avg"):
            if itype == "int":
                base = f"{op}_pool_rows"
                out += [(FAMILY_FILES[base], rows_name(base, dtype, shape))
                        for dtype in planner.ROW_TILE_DTYPES
                        for shape in row_tile_shapes(op, dtype)]
            for dtype in (CTYPES if op == "max" else FLOAT_DTYPES):
                one, first, second = _global_type_pairs(op, dtype)
                pairs = {"global_block": (one, first), "global_channels": (one, first, second)}
                for base, types in pairs.items():
                    out += [(FAMILY_FILES[base], global_name(base, op == "max", tin, tout, itype))
                            for tin, tout in dict.fromkeys(types)]
                out += [(FAMILY_FILES["global_lanes"],
                         global_name("global_lanes", op == "max", *one, itype, lanes))
                        for lanes in planner.LANE_WIDTHS]
                out.append((FAMILY_FILES["global_lanes"],
                            global_name("global_lanes", op == "max", *second, itype, 32)))
        for size in WORDS:
            for idt in INT_DTYPES:
                out += [(FAMILY_FILES["max_unpool"], unpool_name(size, idt, itype, nhwc))
                        for nhwc in (None, False, True)]
    return list(dict.fromkeys(out))


def _partial_dtype(op: str, dtype: str) -> str:
    """Dtype of the per-chunk partials of a split global reduction."""
    return dtype if op == "max" else _acc(dtype)


def _global_type_pairs(op: str, dtype: str) -> tuple[tuple[str, str], ...]:
    """(Tin, Tout) of the global kernels: one pass (any kernel), first pass (``global_block``
    or ``global_channels``), second pass (``global_lanes`` with 32 lanes or
    ``global_channels``)."""
    part = _partial_dtype(op, dtype)
    return (dtype, dtype), (dtype, part), (part, dtype)


# ----------------------------------------------------------------- launch preparation
@functools.lru_cache(maxsize=None)
def device_info(device_id: int) -> planner.DeviceInfo:
    p = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return planner.DeviceInfo(
        name=name, sm_count=int(p["multiProcessorCount"]),
        max_threads_per_block=int(p["maxThreadsPerBlock"]),
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
        smem_per_block=int(p.get("sharedMemPerBlockOptin", p["sharedMemPerBlock"])),
        smem_per_sm=int(p.get("sharedMemPerMultiprocessor", p["sharedMemPerBlock"])),
        l2_bytes=int(p.get("l2CacheSize", 0)),
        # double data rate: 2 transfers per clock (kHz) of the bus width (bits)
        dram_gbps=2 * p.get("memoryClockRate", 0) * 1e3 * p.get("memoryBusWidth", 0) / 8 / 1e9)


def itype_scalar(itype: str):
    """The NumPy scalar type of an index type (``int`` or ``long long``)."""
    return np.int32 if itype == "int" else np.int64


def geo_args(spec, it, windowed: bool) -> tuple:
    """Scalars of GP_GEO_PARAMS but the last (rows): planes, chans, in D/H/W, out D/H/W,
    then kernel, stride, pad begin and dilation (zeros for adaptive) for a window or adaptive
    spec."""
    g = spec.geom
    nhwc = g.layout == "NHWC"
    planes = g.batch if nhwc else g.planes
    idd, ih, iw = planner.canonical3(g.spatial, 1)
    od, oh, ow = planner.canonical3(spec.out_spatial, 1)
    sizes = tuple(it(v) for v in (planes, g.channels if nhwc else 1, idd, ih, iw, od, oh, ow))
    if windowed:
        small = (planner.canonical3(spec.kernel, 1) + planner.canonical3(spec.stride, 1)
                 + planner.canonical3(tuple(pb for pb, _ in spec.pads), 0)
                 + planner.canonical3(spec.dilation, 1))
    else:
        small = (0,) * 12
    return sizes + tuple(np.int32(v) for v in small)


class GlobalPass(NamedTuple):
    """One launch of a global plan: ``second`` when it reduces the first's partials; ``io``
    the (input, output) array keys ("x", "partial", "out"); ``tin``, ``tout`` their dtypes;
    ``sizes`` the scalars after the two arrays (lanes ``nseg, seglen``; block ``nseg, seglen,
    nchunks, chunklen``; channels ``nbatch, seglen, chans, nchunks, chunklen``); ``lanes``
    those of a ``global_lanes`` launch, else None."""

    launch: planner.Launch
    second: bool
    io: tuple[str, str]
    tin: str
    tout: str
    sizes: tuple
    lanes: int | None


def global_passes(spec, pl: planner.Plan, it, partial: str) -> list[GlobalPass]:
    """The passes of a global plan over ``spec``'s input (dtype ``spec.geom.dtype``): one
    straight to the output, or a first to partials of dtype ``partial`` and a second from
    them. ``it``: the index scalar type."""
    g = spec.geom
    seglen = math.prod(g.spatial)
    first = pl.launches[0]
    lanes = [la.get("lanes") if la.kernel == "global_lanes" else None for la in pl.launches]
    if first.kernel == "global_lanes":
        sizes = (it(g.planes), it(seglen))
    else:
        chunks = (it(first.get("nchunks")), it(first.get("chunklen")))
        sizes = ((it(g.planes), it(seglen)) if first.kernel == "global_block"
                 else (it(g.batch), it(seglen), it(g.channels))) + chunks
    if len(pl.launches) == 1:
        return [GlobalPass(first, False, ("x", "out"), g.dtype, g.dtype, sizes, lanes[0])]
    second = pl.launches[1]
    nchunks = it(first.get("nchunks"))
    sizes2 = ((it(g.planes), nchunks) if second.kernel == "global_lanes"
              else (it(g.batch), nchunks, it(g.channels), it(1), nchunks))
    return [GlobalPass(first, False, ("x", "partial"), g.dtype, partial, sizes, lanes[0]),
            GlobalPass(second, True, ("partial", "out"), partial, g.dtype, sizes2, lanes[1])]


class Step:
    """One prepared launch: kernel, grid, block, and the argument tuple with the arrays
    named by ``io`` ("x", "out", "indices", "partial") put in front of ``scalars``."""

    __slots__ = ("fn", "grid", "block", "io", "scalars", "_pick")

    def __init__(self, fn, grid, block, io, scalars):
        self.fn, self.grid, self.block, self.io, self.scalars = fn, grid, block, io, scalars
        self._pick = operator.itemgetter(*io)  # two or more names: a tuple

    def __call__(self, arrays: dict) -> None:
        self.fn(self.grid, self.block, self._pick(arrays) + self.scalars)


_LAUNCH_CACHES: list = []


def launch_cache(build):
    """Memoize a builder of launch lists (``functools.lru_cache``); :func:`clear_launches`
    forgets every such list at once (the float ops' here, the quantized ops')."""
    cached = functools.lru_cache(maxsize=1024)(build)
    _LAUNCH_CACHES.append(cached)
    return cached


def clear_launches() -> None:
    """Forget every prepared launch list: later calls plan and ask for their kernels again."""
    for cached in _LAUNCH_CACHES:
        cached.cache_clear()


@launch_cache
def prepared(spec, device_id: int, indices_dtype: str = "int64", scatter: bool = False,
             align: int = 16) -> tuple[tuple[Step, ...], tuple | None]:
    """Launch steps of ``spec`` on ``device_id`` and the (size, dtype) of scratch partials
    (None when a single pass). Compiles the kernels it needs (once per device).
    ``indices_dtype``: dtype of an unpool's indices; ``scatter``: an unpool's scatter plan
    even where its gather applies; ``align``: the bytes the input's start is aligned to
    (:func:`gpupool.cuda.planner.plan`)."""
    pl = planner.plan(spec, device_info(device_id), scatter=scatter, align=align)
    itype = pl.index_type
    it = itype_scalar(itype)
    g = spec.geom
    nhwc = g.layout == "NHWC"
    steps = []
    scratch = None
    if pl.family in ("window", "adaptive"):
        la = pl.launches[0]
        geo = geo_args(spec, it, pl.family == "window") + (np.int32(la.rows),)
        if pl.family == "window":
            if la.kernel.endswith("_rows"):
                name = rows_name(la.kernel, g.dtype, tuple(
                    la.get(k) for k in ("kh", "kw", "sw", "vec", "lead")))
            else:
                name = window_name(la.kernel, g.dtype, itype, planner.static_window(spec), nhwc)
            extra = ()
            if spec.op == "avg":
                pe = planner.canonical3(tuple(e for _, e in spec.pads), 0)
                extra = tuple(np.int32(v) for v in pe) + (
                    np.int32(spec.count_include_pad), np.int32(spec.divisor_override or 0))
            elif spec.op == "lp":
                extra = (np.dtype(_acc(g.dtype)).type(spec.p),)
        else:
            name = adaptive_name(la.kernel, g.dtype, itype, nhwc)
            extra = ()
        io = ("x", "out", "indices") if "_indices" in la.kernel else ("x", "out")
        fn = kernel(FAMILY_FILES[la.kernel], name)
        steps.append(Step(fn, la.grid, la.block, io, geo + extra))
    elif pl.family == "global":
        part = _partial_dtype(spec.op, g.dtype)
        # an average sums value * (1 / count): finite where the mean is
        scales = (np.dtype(_acc(g.dtype)).type(1.0 / math.prod(g.spatial)),
                  np.dtype(_acc(part)).type(1.0))
        for p in global_passes(spec, pl, it, part):
            name = global_name(p.launch.kernel, spec.op == "max", p.tin, p.tout, itype, p.lanes)
            steps.append(Step(kernel(FAMILY_FILES[p.launch.kernel], name), p.launch.grid,
                               p.launch.block, p.io, p.sizes + (scales[p.second],)))
        if len(pl.launches) > 1:
            scratch = (g.planes * pl.launches[0].get("nchunks"), part)
    else:  # unpool
        la = pl.launches[0]
        gather = la.kernel == "max_unpool_gather"
        name = unpool_name(np.dtype(g.dtype).itemsize, indices_dtype, itype,
                           nhwc if gather else None)
        if gather:  # the geometry of the pooling that the indices come from
            pool = spec.pooling
            scalars = geo_args(pool, it, True) + (np.int32(la.rows),) + tuple(
                np.int32(math.gcd(s, d)) for s, d in zip(planner.canonical3(pool.stride, 1),
                                                         planner.canonical3(pool.dilation, 1)))
        else:
            scalars = (it(math.prod(g.shape)), it(math.prod(g.spatial)), it(spec.plane_size),
                       it(g.channels))
        steps.append(Step(kernel(FAMILY_FILES[la.kernel], name), la.grid, la.block,
                           ("x", "indices", "out"), scalars))
    return tuple(steps), scratch


def contiguous(a):
    """``a``, or a C-contiguous copy of it (on the current stream)."""
    return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)


def launch(steps, scratch, arrays: dict) -> None:
    """Run prepared ``steps`` on ``arrays`` (named as their ``io``), with a fresh array of
    partials where ``scratch`` gives its (size, dtype)."""
    if scratch is not None:
        arrays["partial"] = cupy.empty(scratch[0], dtype=scratch[1])
    for step in steps:
        step(arrays)


def alignment(a) -> int:
    """The bytes ``a``'s start is aligned to, up to 16 (the widest load of a thread)."""
    return math.gcd(a.data.ptr, 16)


def _run(x, spec, out, indices, indices_dtype: str = "int64") -> None:
    x = contiguous(x)
    steps, scratch = prepared(spec, cupy.cuda.runtime.getDevice(), indices_dtype,
                              align=alignment(x))
    launch(steps, scratch, {"x": x, "out": out, "indices": indices})


def on_host(entry, x, spec, out, /, *rest, **operands) -> None:
    """``entry`` of the NumPy backend, through a host round trip (it synchronises), where the
    kernels do not reach (more than 3 spatial dims): ``entry(x, spec, out, *rest,
    **operands)`` on host copies. ``out`` and the CuPy arrays in ``rest`` (a max's indices)
    are written, so copied back to the device; ``operands`` are only read; other values pass
    as they are (a requantization plan)."""
    def to_host(a):
        return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else a
    written = [(a, np.empty(a.shape, dtype=a.dtype)) for a in (out, *rest)
               if isinstance(a, cupy.ndarray)]
    host = dict((id(a), h) for a, h in written)
    entry(to_host(x), spec, *(host.get(id(a), a) for a in (out, *rest)),
          **{k: to_host(v) for k, v in operands.items()})
    for device, copy in written:
        device.set(copy)


def window(x, spec: WindowSpec, out, indices) -> None:
    if spec.geom.nd > 3:
        from ..cpu import numpy_backend
        on_host(numpy_backend.window, x, spec, out, indices)
        return
    _run(x, spec, out, indices)


def adaptive(x, spec: AdaptiveSpec, out, indices) -> None:
    if spec.geom.nd > 3 and not (spec.is_global and indices is None):
        from ..cpu import numpy_backend
        on_host(numpy_backend.adaptive, x, spec, out, indices)
        return
    _run(x, spec, out, indices)


def unpool(x, spec: UnpoolSpec, out, indices, in_windows: bool = False) -> None:
    """The gather (one pass, each output written once) where it applies
    (:func:`gpupool.cuda.planner.unpool_gathers`) and ``in_windows`` says that every index
    lies in its own window or is -1; else zero fill + scatter."""
    gather = in_windows and planner.unpool_gathers(spec)
    if not gather:
        out.fill(0)
    steps, scratch = prepared(spec, cupy.cuda.runtime.getDevice(), dtype_name(indices.dtype),
                              not gather)
    launch(steps, scratch, {"x": contiguous(x), "out": out, "indices": contiguous(indices)})

