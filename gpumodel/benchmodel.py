"""The time model of gpupool's benchmark suite: every case of
:mod:`gpupool.bench` (the suite and the backward rows, :func:`modeled_cases`) at its full
(``--size large``) shape, modeled from a trace of a smaller shape whose launch plan is the full
shape's. Modeled, not measured.

Needs the stand-in CuPy (:func:`cudacpu.install`) and a host compiler.

Scaling down: the traced input keeps the case's plane (NCHW: spatial dims) or row (NHWC:
spatial dims and channels) and has fewer of them, in one leading dim. The planner fills the
GPU, so the stand-in reports fewer SMs (``CUDACPU_SM_COUNT``), about as many fewer as there
are planes, and the plan's choices come out the same. Plans are compared by a dry run (no
compile, no launch) of each shape: the same launches, each with the same kernel, block and
scalar arguments but the first (the plane or row count). The traced count is the smallest with
such a plan that fills whole warps (:func:`plane_quantum`) and gives every array that scales
with it a multiple of 256 bytes (so each plane meets the sector grid as at full size). Each
block then does the work it does at full size: the traced counts are multiplied by the ratio
of the input sizes, DRAM sectors by each array's own ratio (a table does not grow), and the
full plan's grid bounds the resident warps. A case whose traced input is still above
TRACED_BYTES (no smaller shape has its plan) runs whole and records the blocks of a few whole
planes only (:func:`block_limit`); its counts are multiplied by blocks over recorded blocks.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from cudacpu import executor, installed_cupy

from . import device as devices
from . import instructions, sass, trace, traffic
from .counts import Counts, launch_counts


def modeled_cases(ops=None) -> list:
    """The cases the model covers: the suite's and the backward rows (``ops`` selects among
    them as ``gpupool bench --ops`` does; None: all)."""
    from gpupool.bench import cases
    return cases.select_cases(ops, cases.SUITE + cases.BACKWARD)


def beyond_suite_cases() -> list:
    """Cases outside the suite the model is also run on (``bench/model.py --beyond``): the
    suite's ops in other layouts, dtypes and window shapes."""
    from gpupool.bench.cases import Case
    stem, stem_nhwc = (64, 112, 112), (112, 112, 64)
    k3 = {"kernel": (3, 3), "stride": (2, 2), "padding": 1}
    return [
        Case("max 2x2 s2 NHWC", "max", stem_nhwc, layout="NHWC"),
        Case("max 3x3 s2 p1 f64", "max", stem, "float64", **k3),
        Case("max 3x3 s2 p1 NHWC f16", "max", stem_nhwc, "float16", layout="NHWC", **k3),
        Case("adaptive max 14->7", "amax", (512, 14, 14), output_size=(7, 7)),
        Case("max 2x2 s2 backward", "max_bwd", stem),
        Case("max 3x3 s2 p1 backward f16", "max_bwd", stem, "float16", **k3),
        Case("max 3x3 s2 p1 backward NHWC", "max_bwd", stem_nhwc, layout="NHWC", **k3),
        Case("avg 2x2 s2 backward NHWC", "avg_bwd", (56, 56, 256), layout="NHWC"),
        Case("avg 3x3 s2 p1 backward", "avg_bwd", stem, **k3),
        Case("avg 3x3 s1 p1 backward", "avg_bwd", (64, 56, 56), kernel=(3, 3), stride=(1, 1),
             padding=1),
        Case("max unpool 2x2 s2", "unpool", stem),
    ]


@dataclass(frozen=True)
class PlannedLaunch:
    """A launch as gpupool makes it: kernel source file, name expression, grid, block, its
    scalar arguments and the size in bytes of each array argument."""

    source_file: str
    name: str
    grid: tuple
    block: tuple
    scalars: tuple
    arrays: tuple

    def signature(self) -> tuple:
        """What the launch's blocks do: all but the grid and the first scalar (the plane or
        row count)."""
        return self.source_file, self.name, self.block, self.scalars[1:]


@dataclass(frozen=True)
class WorkloadCase:
    """A published pooling workload (``../shared/calibration/workloads.json``) as gpupool
    runs it, with the workload's own semantics (PyTorch's: ``count_include_pad``, ceil mode,
    dilation, divisor override as given); its shape is fixed (no batch size). bfloat16 rows
    run as float16 (gpupool has no bfloat16; the bytes are the same)."""

    name: str
    op: str  # max | avg | amax | aavg
    sample: tuple  # the whole input shape
    dtype: str
    kernel: tuple = ()
    stride: tuple = ()
    padding: tuple = ()
    dilation: tuple = ()
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None
    output_size: tuple = ()
    indices: bool = False
    workload: str = ""  # op and label in workloads.json
    layout: str = "NCHW"
    batched: bool = False  # gpupool.bench.batch_size: the shape is fixed

    def shape(self, n: int) -> tuple:
        return self.sample

    def call(self, x):
        """gpupool's call of the workload on ``x``."""
        import gpupool
        if self.op == "max":
            return lambda: gpupool.max_pool(x, self.kernel, self.stride, self.padding,
                                            self.dilation, self.ceil_mode,
                                            return_indices=self.indices)
        if self.op == "avg":
            return lambda: gpupool.avg_pool(x, self.kernel, self.stride, self.padding,
                                            self.ceil_mode, self.count_include_pad,
                                            self.divisor_override)
        if self.op == "amax":
            return lambda: gpupool.adaptive_max_pool(x, self.output_size,
                                                     return_indices=self.indices)
        return lambda: gpupool.adaptive_avg_pool(x, self.output_size)


def workload_cases(path) -> list[WorkloadCase]:
    """Every workload of a ``workloads.json`` (TileOPs' pooling workloads) that gpupool runs,
    in each listed dtype (bfloat16 as float16, once), max and adaptive max also with
    indices."""
    import json
    with open(path) as f:
        rows = json.load(f)
    out = []
    for w in rows:
        op = w["op"][:-2]
        if op not in ("max", "avg", "amax", "aavg"):
            continue
        dtypes = dict.fromkeys("float16" if d == "bfloat16" else d for d in w["dtypes"])
        for dtype in dtypes:
            for indices in ((False, True) if op in ("max", "amax") else (False,)):
                name = (f"{w['op']} {w['label']} {dtype}"
                        f"{' + indices' if indices else ''}")
                out.append(WorkloadCase(
                    name, op, tuple(w["shape"]), dtype, tuple(w["kernel"]), tuple(w["stride"]),
                    tuple(w["padding"]), tuple(w["dilation"]), bool(w["ceil_mode"]),
                    bool(w["count_include_pad"]), w["divisor_override"],
                    tuple(w["output_size"]), indices, f"{w['op']} {w['label']}"))
    return out


def spatial_dims(case) -> int:
    return len(case.output_size) if case.op in ("aavg", "amax") and case.output_size else \
        len(case.kernel)


def full_shape(case) -> tuple:
    from gpupool import bench as benchmark
    return case.shape(benchmark.batch_size(case, "large"))


def plane_count(case, shape) -> int:
    """Planes (NCHW) or rows (NHWC) of an input of ``shape``."""
    nd = spatial_dims(case) + (case.layout == "NHWC")
    return math.prod(shape[:-nd])


def scaled_shape(case, planes: int) -> tuple:
    """The case's input shape with ``planes`` planes (NCHW) or rows (NHWC) in one leading
    dim."""
    nd = spatial_dims(case) + (case.layout == "NHWC")
    return (planes,) + tuple(full_shape(case)[-nd:])


def _clear_backend_caches() -> None:
    """Forget gpupool's device properties, prepared launches and loaded kernels."""
    from gpupool.cuda import kernels as cuda_kernels, launching
    for cached in (launching.device_info, cuda_kernels.load_module, cuda_kernels.kernel):
        cached.cache_clear()
    launching.clear_launches()


@contextlib.contextmanager
def sm_count(sms: int):
    """While inside, the stand-in device has ``sms`` SMs."""
    saved = os.environ.get("CUDACPU_SM_COUNT")
    os.environ["CUDACPU_SM_COUNT"] = str(sms)
    from gpupool.cuda import launching
    launching.device_info.cache_clear()
    launching.clear_launches()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDACPU_SM_COUNT", None)
        else:
            os.environ["CUDACPU_SM_COUNT"] = saved
        launching.device_info.cache_clear()
        launching.clear_launches()


def prepared_call(case, x):
    """gpupool's call of ``case`` on input ``x``, with what it reads set up first (a backward
    case runs its forward op here), and the bytes the call reads: its ``operands`` (the
    gradient, a max's indices), else ``x``."""
    from gpupool import bench as benchmark
    f = case.call(x) if isinstance(case, WorkloadCase) else benchmark.gpupool_call(case, x)
    return f, sum(a.nbytes for a in getattr(f, "operands", (x,)))


def run_case(case, x):
    """gpupool's result of ``case`` on input ``x``."""
    return prepared_call(case, x)[0]()


def planned_with_setup(case, shape, sms: int = devices.SM_COUNT
                       ) -> tuple[list[PlannedLaunch], list[PlannedLaunch]]:
    """(the launches that set up the call, those of the call) that gpupool makes for ``case``
    on an input of ``shape`` on ``sms`` SMs, without compiling or running anything (the input
    is never written: any size costs nothing)."""
    import cupy
    from gpupool.cuda import kernels as cuda_kernels, launching, names
    launches = []

    def kernel(name):
        def launch(grid, block, args, **_):
            scalars = tuple(getattr(a, "item", lambda: a)() for a in args
                            if not isinstance(a, np.ndarray))
            arrays = tuple(a.nbytes for a in args if isinstance(a, np.ndarray))
            launches.append(PlannedLaunch(names.source_file(name), name, tuple(grid),
                                          tuple(block), scalars, arrays))
        return launch

    real = cuda_kernels.kernel
    cuda_kernels.kernel = kernel
    try:
        with sm_count(sms):
            f, _ = prepared_call(case, cupy.empty(shape, case.dtype))
            setup = list(launches)
            f()
    finally:
        cuda_kernels.kernel = real
        launching.clear_launches()
    return setup, launches[len(setup):]


def planned(case, shape, sms: int = devices.SM_COUNT) -> list[PlannedLaunch]:
    """The launches of gpupool's call of ``case`` (:func:`planned_with_setup`)."""
    return planned_with_setup(case, shape, sms)[1]


def plane_quantum(case, full: list[PlannedLaunch]) -> int:
    """The fewest planes that fill whole warps in every launch of ``full``: a power of two,
    above 1 where a warp covers several planes (a plane has fewer than 32 threads)."""
    total = plane_count(case, full_shape(case))
    per_plane = min(math.prod(la.grid) * math.prod(la.block) / total for la in full)
    if per_plane >= traffic.WARP:
        return 1
    return 1 << math.ceil(math.log2(traffic.WARP / per_plane))


def _whole(traced: list[PlannedLaunch], full: list[PlannedLaunch], planes: int,
           total: int) -> bool:
    """Every array of ``traced`` is the full one (a table) or its ``planes / total`` share,
    a multiple of 256 bytes (whole alignment periods: the sectors it touches per plane are
    those of the full size)."""
    return all(t == f or (t * total == f * planes and t % traffic.ALIGNMENT == 0)
               for a, b in zip(traced, full) for t, f in zip(a.arrays, b.arrays))


def matching_scale(case, min_planes: int = 1) -> tuple[int, int, list[PlannedLaunch]]:
    """(planes, SM count, the full shape's plan) of the smallest traced shape of at least
    ``min_planes`` planes whose plan is the full shape's, in whole warps and whole alignment
    periods; ``LookupError`` when none is."""
    full = planned(case, full_shape(case))
    want = [la.signature() for la in full]
    total = plane_count(case, full_shape(case))
    quantum = plane_quantum(case, full)
    for planes in range(-(-min_planes // quantum) * quantum, total + 1, quantum):
        guess = max(1, round(devices.SM_COUNT * planes / total))
        for sms in sorted(range(1, devices.SM_COUNT + 1), key=lambda s: (abs(s - guess), s)):
            traced = planned(case, scaled_shape(case, planes), sms)
            if [la.signature() for la in traced] == want:
                if _whole(traced, full, planes, total):
                    return planes, sms, full
                break
    raise LookupError(f"{case.name}: no smaller shape has the full shape's launch plan")


#: Input bytes of a traced shape above which a case records only some of its planes' blocks
#: (:func:`block_limit`): a trace holds some 24 bytes per access.
TRACED_BYTES = 4 << 20


def block_limit(case, planes: int, full: list[PlannedLaunch]) -> int | None:
    """The blocks whose accesses the trace of ``case`` at ``planes`` planes records: None
    (all) when its input is at most TRACED_BYTES; else, for a single launch whose grid's y
    walks the planes (the blocks of a plane alike), the blocks of as many whole planes as
    TRACED_BYTES holds (the counts are multiplied by blocks over recorded blocks: exact, since
    planes are alike). ``LookupError`` for a case too large that does not walk planes so."""
    per_plane = math.prod(full_shape(case)) // plane_count(case, full_shape(case))
    traced = planes * per_plane * np.dtype(case.dtype).itemsize
    if traced <= TRACED_BYTES:
        return None
    if len(full) != 1 or full[0].grid[1] != planes or full[0].grid[2] != 1:
        raise LookupError(f"{case.name}: its trace ({traced >> 20} MiB of input) is too large "
                          f"and its grid does not walk its planes along y")
    keep = max(1, planes * TRACED_BYTES // traced)
    return full[0].grid[0] * keep


def source_lines(source_file: str) -> list[str]:
    """``file:line`` of each line of the text gpupool compiles for ``source_file``
    (``gpupool.cuda.kernels.source``: its defines, then the file with its includes inlined); "" for
    a blank line or a define."""
    from gpupool.cuda import kernels as cuda_kernels
    root = cuda_kernels.KERNEL_DIR
    seen = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        # blank lines and includes stay as they are, so that the include pattern (whose
        # trailing \s* takes line ends) expands the marked text as it does the plain one
        marked = "\n".join(
            line if not line.strip() or cuda_kernels.QUOTED_INCLUDE.fullmatch(line) else
            f"{line}\0{name}:{number}"
            for number, line in enumerate((root / name).read_text().split("\n"), 1))
        return cuda_kernels.QUOTED_INCLUDE.sub(lambda m: expand(m.group(1)), marked)

    defines = [""] * len(cuda_kernels.DEFINES.get(source_file, ()))
    return defines + [line.partition("\0")[2] for line in expand(source_file).split("\n")]


def make_input(case, shape, rng):
    import cupy
    if case.dtype in ("int8", "uint8"):
        info = np.iinfo(case.dtype)
        host = rng.integers(info.min, info.max + 1, size=shape, dtype=case.dtype)
    else:
        host = rng.standard_normal(shape, dtype=np.float32).astype(case.dtype)
    return cupy.asarray(host)


@dataclass
class LaunchModel:
    """One launch of a case at full size."""

    name: str
    grid: tuple  # full size
    block: tuple
    counts: Counts
    batching: sass.LoadBatching  # the compiled code's global loads in runs
    sites: dict  # site -> "file:line: text" of its source line

    @property
    def traffic(self) -> traffic.Traffic:
        return self.counts.traffic  # traced size


@dataclass
class CaseModel:
    """A benchmark case at full size, from its trace at ``traced_shape`` on ``sms`` SMs."""

    case: object
    shape: tuple
    traced_shape: tuple
    sms: int
    scale: float  # full over traced input bytes
    ideal_bytes: float  # full size: input read once, output written once
    outputs: int  # full size: elements of the result
    launches: list[LaunchModel]
    checked_bytes: float = 0.0  # full size: a max's indices the call checks first (read twice)

    @property
    def dram_bytes(self) -> float:
        return sum(la.counts.dram_bytes for la in self.launches)

    @property
    def warp_instructions(self) -> float:
        return sum(la.counts.warp_instructions for la in self.launches)

    def seconds(self, device: devices.Device) -> float:
        return sum(la.counts.time(device).seconds for la in self.launches)

    def longest(self, device: devices.Device) -> devices.LaunchTime:
        """The time of the launch that takes longest."""
        return max((la.counts.time(device) for la in self.launches), key=lambda t: t.seconds)

    def bound(self, device: devices.Device) -> str:
        """The binding limit of the launch that takes longest."""
        return self.longest(device).bound

    def floor_seconds(self, device: devices.Device) -> float:
        """The memory floor: the ideal bytes at the triad bandwidth, plus the fixed cost of
        each launch."""
        return (self.ideal_bytes / device.dram_bandwidth
                + len(self.launches) * device.launch_seconds)

    def percent_of_triad(self, device: devices.Device) -> float:
        """The ideal bytes' time at the triad bandwidth as a percentage of the modeled
        time."""
        return 100.0 * self.ideal_bytes / device.dram_bandwidth / self.seconds(device)


def _site_labels(launch, counts, source_file) -> dict[int, str]:
    """Site -> "file:line: text" of the kernel source line it came from."""
    from gpupool.cuda import kernels as cuda_kernels
    text = cuda_kernels.source(source_file).split("\n")
    origins = source_lines(source_file)
    labels = {}
    for site, line in launch.site_lines([s.site for s in counts.sites]).items():
        if 0 < line <= len(text):
            labels[site] = f"{origins[line - 1]}: {text[line - 1].strip()}"
    return labels


@contextlib.contextmanager
def tracing(names_by_file: dict[str, list[str]]):
    """While inside, gpupool's kernels are trace builds of the given names only (one library
    per source file, built now in parallel) and a :class:`trace.Recorder` records launches."""
    import cupy
    from gpupool.cuda import kernels as cuda_kernels
    saved_batches = dict(cupy.batches)
    saved_cache = os.environ.get("GPUPOOL_CACHE_DIR")
    kernel_cache = tempfile.mkdtemp(prefix="gpupool-trace-kernels-")
    os.environ["GPUPOOL_CACHE_DIR"] = kernel_cache
    cupy.batches.clear()
    jobs = []
    for source_file, names in names_by_file.items():
        code = cuda_kernels.source(source_file)
        cupy.batches[code] = tuple(sorted(set(names)))
        jobs += cupy.chunks(code, cupy.batches[code])
    _clear_backend_caches()
    try:
        with trace.Recorder() as recorder:
            executor.build_libraries(jobs, executor.Build.from_env())
            yield recorder
    finally:
        cupy.batches.clear()
        cupy.batches.update(saved_batches)
        if saved_cache is None:
            os.environ.pop("GPUPOOL_CACHE_DIR", None)
        else:
            os.environ["GPUPOOL_CACHE_DIR"] = saved_cache
        shutil.rmtree(kernel_cache, ignore_errors=True)
        _clear_backend_caches()


def model_suite(cases, nvrtc, sites: bool = False,
                min_planes: int = 1) -> list[CaseModel]:
    """The model of each case (see the module docstring). ``nvrtc``: CuPy's NVRTC pieces
    (:func:`cudacpu.real_nvrtc`) for the machine code: registers, load batching, control flow
    (:mod:`gpumodel.sass`, :mod:`gpumodel.instructions`; nvdisasm missing: ``FileNotFoundError``).
    ``sites``: name each load and store site by its source line (``LaunchModel.sites``).
    ``min_planes``: trace at least this many planes."""
    from gpupool import bench as benchmark
    from gpupool.bench import cases as bench_cases
    from gpupool.cuda import kernels as cuda_kernels
    scales = {case.name: matching_scale(case, min_planes) for case in cases}
    names_by_file: dict[str, list[str]] = {}
    for case in cases:
        planes, sms, _ = scales[case.name]
        for la in sum(planned_with_setup(case, scaled_shape(case, planes), sms), []):
            names_by_file.setdefault(la.source_file, []).append(la.name)
    registers, batching, flows = {}, {}, {}
    sass.nvdisasm()  # before compiling: fail at once when it is missing
    with installed_cupy():
        for source_file, names in names_by_file.items():
            compiled = sass.compile_kernels(nvrtc, cuda_kernels.source(source_file), names)
            registers.update(traffic.register_usage(compiled))
            batching.update(sass.load_batching(compiled))
            code = sass.disassemble(compiled.cubin)
            flows.update({n: instructions.control_flow(code[m]) for n, m in compiled.mangled.items()})
    rng = np.random.default_rng(0)
    models = []
    with tracing(names_by_file) as recorder:
        for case in cases:
            planes, sms, full = scales[case.name]
            shape = scaled_shape(case, planes)
            x = make_input(case, shape, rng)
            with sm_count(sms):
                f, read = prepared_call(case, x)
                first = len(recorder.launches)
                recorder.block_limit = block_limit(case, planes, full)
                result = f()
                recorder.block_limit = None
            traced = recorder.launches[first:]
            if [(la.name, la.block) for la in traced] != [(la.name, la.block) for la in full]:
                raise AssertionError(f"{case.name}: the traced launches are not the plan's")
            scale = math.prod(full_shape(case)) / math.prod(shape)
            ideal = scale * (read + benchmark.output_bytes(result))
            launches = []
            for la, plan in zip(traced, full):
                sampled = la.blocks / la.recorded_blocks
                counts = launch_counts(
                    la, flows[la.name], batching[la.name], registers.get(la.name),
                    scale * sampled,
                    [sampled * f / a.nbytes for f, a in zip(plan.arrays, la.arrays)],
                    math.prod(plan.grid))
                lines = _site_labels(la, counts.traffic, plan.source_file) if sites else {}
                launches.append(LaunchModel(la.name, plan.grid, la.block, counts,
                                            batching[la.name], lines))
            outputs = round(scale * bench_cases.values(result).size)
            checked = 0.0  # the indices among the operands, where a launch checks them
            if any(la.name.startswith("max_index_check<") for la in launches):
                checked = scale * sum(a.nbytes for a in f.operands if a.dtype.kind in "iu")
            models.append(CaseModel(case, full_shape(case), shape, sms, scale, ideal, outputs,
                                    launches, checked))
    return models


@dataclass(frozen=True)
class Estimate:
    """A case's calibrated model on one device."""

    case: str
    seconds: float
    bound: str  # dram, l2, l1, latency or issue: the limit of its longest launch
    warp_instructions_per_output: float
    percent_of_triad: float  # the ideal bytes' time at the triad bandwidth, of the time
    memory_floor_seconds: float  # the ideal bytes at the triad bandwidth + the fixed costs


def estimate(cases, nvrtc, device: devices.Device | None = None) -> list[Estimate]:
    """The calibrated time, binding limit and executed warp instructions per output of each
    case (a :mod:`gpupool.bench` case or a :class:`WorkloadCase`) on ``device`` (default: an
    H200 at 1500 MHz), as gpupool's kernels compile now. ``nvrtc``: CuPy's NVRTC pieces
    (:func:`cudacpu.real_nvrtc`, taken before :func:`cudacpu.install`, which the model needs).

    >>> nvrtc = cudacpu.real_nvrtc(); cudacpu.install()  # doctest: +SKIP
    >>> estimate(workload_cases(calibration.calibration_file("workloads.json")), nvrtc)
    ... # doctest: +SKIP
    """
    device = device or devices.h200()
    return [Estimate(m.case.name, m.seconds(device), m.bound(device),
                     m.warp_instructions / m.outputs, m.percent_of_triad(device),
                     m.floor_seconds(device))
            for m in model_suite(list(cases), nvrtc)]
