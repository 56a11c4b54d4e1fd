"""The executed-instruction count of the GPU model (gpumodel.instructions): hand-written kernels
whose executed warp instructions follow from their machine code by construction (straight
code, loops of one iteration per load, a loop nest), the counts ncu published for PyTorch's
average-pool kernel (../shared/calibration/measured.json notes) and those ncu counted of
gpupool's own kernels on an H200 (bench/issued.py). The kernels are compiled with NVRTC for
sm_90 and traced on the CPU executor; no GPU is needed.
"""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

import conftest
from cudacpu import executor, installed_cupy
from gpumodel import benchmodel, calibration, instructions, pipes, sass, trace

pytestmark = [
    pytest.mark.skipif(executor.host_compiler_reason() is not None,
                       reason=f"{executor.host_compiler_reason()}"),
    pytest.mark.skipif(conftest.REAL_NVRTC is None, reason="CuPy's NVRTC is not importable"),
]

SOURCE = r"""
// y[i] = 2 x[i]: straight code, every thread in range
__global__ void twice_kernel(const float* __restrict__ x, float* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = 2.0f * x[i];
}

// y[i] = the sum of n elements of x a block apart: one load per iteration, not unrolled
__global__ void row_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0;
#pragma unroll 1
  for (int k = 0; k < n; ++k) s += x[i + k * blockDim.x * gridDim.x];
  y[i] = s;
}

// y[i] = the sum of an r x c window of x (rows of w elements) at i: a loop over rows, each
// a loop over c contiguous elements, neither unrolled
__global__ void window_kernel(const float* __restrict__ x, float* __restrict__ y, int r,
                              int c, int w) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float* p = x + (long long)i * c;
  float s = 0;
#pragma unroll 1
  for (int h = 0; h < r; ++h) {
#pragma unroll 1
    for (int k = 0; k < c; ++k) s += p[h * w + k];
  }
  y[i] = s;
}

// threads past n leave at once
__global__ void guarded_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = x[i] + 1.0f;
}

// y[i] = x[i], plus x[i + n] where n > 0: the second load predicated, not branched around
__global__ void predicated_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float s = x[i];
  if (n > 0) s += x[i + n];
  y[i] = s;
}

// y[i] = x[i] after 32 rounds of v * v + 1 where flag != 0: a branch on a parameter alone, its
// long side without a load or store
__global__ void flag_kernel(const float* __restrict__ x, float* __restrict__ y, int flag) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i];
  if (flag != 0) {
#pragma unroll
    for (int k = 0; k < 32; ++k) v = v * v + 1.0f;
  }
  y[i] = v;
}

// y[i] = one of two chains of 32 rounds, by the sign of x[i]: lanes on either side of a branch
// on data, neither side with a load or store
__global__ void sign_kernel(const float* __restrict__ x, float* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i];
  if (v > 0.0f) {
#pragma unroll
    for (int k = 0; k < 32; ++k) v = v * v + 1.0f;
  } else {
#pragma unroll
    for (int k = 0; k < 32; ++k) v = v * 0.5f - 1.0f / (v - 2.0f);
  }
  y[i] = v;
}
"""
NAMES = ("twice_kernel", "row_kernel", "window_kernel", "guarded_kernel", "predicated_kernel",
         "flag_kernel", "sign_kernel")
BLOCKS, THREADS = 4, 128
WARPS = BLOCKS * THREADS // 32


@pytest.fixture(scope="module")
def compiled():
    """(control flow, SASS instructions) of each test kernel, and its trace build."""
    with installed_cupy():
        code = sass.compile_kernels(conftest.REAL_NVRTC, SOURCE, NAMES)
    text = sass.disassemble(code.cubin)
    flows = {n: instructions.control_flow(text[code.mangled[n]]) for n in NAMES}
    parsed = {n: instructions.parse(text[code.mangled[n]])[0] for n in NAMES}
    with trace.Recorder():
        lib = executor.Library(executor.build_library(SOURCE, NAMES, executor.Build.from_env()),
                               NAMES)
    return flows, parsed, lib


def counted(compiled, name, args, blocks=BLOCKS):
    flows, _, lib = compiled
    with trace.Recorder() as recorder:
        lib.kernel(name)((blocks,), (THREADS,), args)
    (launch,) = recorder.launches
    return instructions.count(launch, flows[name])


def test_straight_code_runs_every_instruction_to_the_exit_once_per_warp(compiled):
    flows, parsed, _ = compiled
    code = parsed["twice_kernel"]
    to_exit = next(i for i, c in enumerate(code) if c.base == "EXIT" and not c.guarded) + 1
    x = np.arange(BLOCKS * THREADS, dtype=np.float32)
    y = np.empty_like(x)
    c = counted(compiled, "twice_kernel", (x, y))
    np.testing.assert_array_equal(y, 2 * x)
    assert c.warps == WARPS and c.unmatched == 0
    assert c.warp_instructions == WARPS * to_exit


@pytest.mark.parametrize("n", [0, 1])
def test_a_load_predicated_off_still_issues(compiled, n):
    """The trace has no record of a load whose predicate is off (n = 0), yet the warp issues
    it: the path to the exit is the same, and matches the trace either way."""
    _, parsed, _ = compiled
    code = parsed["predicated_kernel"]
    assert any(c.guarded and c.access() == (0, 4) for c in code), "no predicated load"
    to_exit = next(i for i, c in enumerate(code) if c.base == "EXIT" and not c.guarded) + 1
    x = np.arange(BLOCKS * THREADS + 1, dtype=np.float32)
    y = np.empty(BLOCKS * THREADS, np.float32)
    c = counted(compiled, "predicated_kernel", (x, y, np.int32(n)))
    np.testing.assert_array_equal(y, x[:-1] + (x[1:] if n else 0))
    assert c.warps == WARPS and c.unmatched == 0
    assert c.warp_instructions == WARPS * to_exit


def loops(flow):
    """(header, last block) of each loop of a control flow that loads, innermost first."""
    spans = {}
    for b, block in enumerate(flow.blocks):
        for s in block.successors:
            if 0 <= s <= b:
                spans[s] = max(spans.get(s, s), b)
    loading = [(h, e) for h, e in spans.items()
               if any(flow.blocks[k].accesses() for k in range(h, e + 1))]
    return sorted(loading, key=lambda he: he[1] - he[0])


def span_cost(flow, header, last, inner=()):
    """Instructions of blocks header..last, less those of the ``inner`` spans."""
    own = [b for b in range(header, last + 1)
           if not any(h <= b <= e for h, e in inner)]
    return sum(flow.costs[b] for b in own)


@pytest.mark.parametrize("n", [1, 5])
def test_a_loop_runs_its_body_once_per_load(compiled, n):
    """Each further load is one more iteration: the loop's instructions once more."""
    flows, _, _ = compiled
    flow = flows["row_kernel"]
    ((header, last),) = loops(flow)
    body = span_cost(flow, header, last)
    x = np.ones(BLOCKS * THREADS * (n + 3), np.float32)
    y = np.empty(BLOCKS * THREADS, np.float32)
    short = counted(compiled, "row_kernel", (x, y, np.int32(n)))
    np.testing.assert_array_equal(y, n)
    long = counted(compiled, "row_kernel", (x, y, np.int32(n + 3)))
    assert long.warp_instructions - short.warp_instructions == WARPS * 3 * body


def test_a_loop_nest_runs_its_outer_loop_once_per_row(compiled):
    """An r x c window: the inner loop's body r x c times, the outer loop's own code r
    times (the rows come from the trace: each row is a run of contiguous loads)."""
    flows, _, _ = compiled
    flow = flows["window_kernel"]
    (inner, outer) = loops(flow)
    inner_body = span_cost(flow, *inner)
    outer_body = span_cost(flow, *outer, inner=(inner,))
    w = 64
    x = np.ones(BLOCKS * THREADS * 4 + 8 * w, np.float32)
    y = np.empty(BLOCKS * THREADS, np.float32)

    def run(r, c):
        return counted(compiled, "window_kernel", (x, y, np.int32(r), np.int32(c),
                                                   np.int32(w))).warp_instructions
    assert run(3, 3) - run(1, 3) == WARPS * (2 * outer_body + 6 * inner_body)
    assert run(2, 4) - run(2, 2) == WARPS * 4 * inner_body


def test_warps_past_the_end_take_the_shortest_way_out(compiled):
    flows, parsed, _ = compiled
    code = parsed["guarded_kernel"]
    first_exit = next(i for i, c in enumerate(code) if c.base == "EXIT") + 1
    x = np.zeros(BLOCKS * THREADS, np.float32)
    y = np.zeros_like(x)
    busy = counted(compiled, "guarded_kernel", (x, y, np.int32(THREADS)))  # one block's warps
    idle = WARPS - THREADS // 32
    every = counted(compiled, "guarded_kernel", (x, y, np.int32(BLOCKS * THREADS)))
    per_busy = every.warp_instructions / WARPS
    assert busy.warp_instructions == (THREADS // 32) * per_busy + idle * first_exit



@pytest.mark.parametrize("flag", [0, 1])
def test_a_branch_on_a_parameter_goes_the_way_the_launch_sets_it(compiled, flag):
    """A branch whose predicate compares a kernel parameter with a constant: the parameter's
    value picks the side, which no load or store tells apart (without it the count takes
    the shortest way)."""
    flows, _, _ = compiled
    blocks = flows["flag_kernel"].blocks
    branch = next(b for b in blocks if b.instructions[-1].base == "BRA"
                  and b.instructions[-1].guarded)
    target, fall = branch.successors
    long_side = sum(len(blocks[k].instructions) for k in range(fall, target))
    x = np.full(BLOCKS * THREADS, 0.5, np.float32)
    y = np.empty_like(x)
    with trace.Recorder() as recorder:
        compiled[2].kernel("flag_kernel")((BLOCKS,), (THREADS,), (x, y, np.int32(flag)))
    (launch,) = recorder.launches
    c = instructions.count(launch, flows["flag_kernel"])
    unknown = instructions.count(dataclasses.replace(launch, parameters=b""),
                                 flows["flag_kernel"])
    assert c.warp_instructions - unknown.warp_instructions == WARPS * long_side * flag


def test_lanes_on_both_sides_of_a_branch_on_data_run_both(compiled):
    """A warp whose lanes split over a branch runs both sides (no load or store inside), the
    calls of a division's slow path apart: every instruction to the exit but those."""
    flows, _, _ = compiled
    blocks = flows["sign_kernel"].blocks
    end = next(k for k, b in enumerate(blocks) if b.instructions[-1].base == "EXIT"
               and not b.instructions[-1].guarded)
    union = sum(len(b.instructions) for b in blocks[:end + 1]
                if not any(i.base == "CALL" for i in b.instructions))
    x = np.where(np.arange(BLOCKS * THREADS) % 2, 1.5, -1.5).astype(np.float32)
    c = counted(compiled, "sign_kernel", (x, np.empty_like(x)))
    assert c.warp_instructions == WARPS * union


#: ncu's issued instructions of PyTorch's avg_pool2d_out_cuda_frame<Half, float> on two
#: measured workloads (measured.json notes), and the share of them the count reaches: the
#: count is of one path per warp (see gpumodel.instructions: a window's taps spread over its rows'
#: unrolled bodies, divergent sides not counted), so it stays below ncu's.
NCU_ISSUED = {"vision-3x3-s2": 4.24e6, "ceil-divisor": 3.28e6}
NCU_SHARE = (0.6, 1.0)


@pytest.mark.skipif(not calibration.calibration_file("measured.json").is_file(),
                    reason="no calibration data (set GPUPOOL_CALIBRATION)")
@pytest.mark.parametrize("workload", sorted(NCU_ISSUED))
def test_the_count_of_pytorchs_avg_kernel_against_ncu(workload):
    rows = calibration.load(calibration.calibration_file("measured.json"))["points"]
    row = next(r for r in rows if r["impl"] == "torch-ref" and r["workload"] == workload
               and str(NCU_ISSUED[workload] / 1e6) + "M issued" in r["note"])
    w, _ = calibration.row_workload(row)
    (counts,) = calibration.model_workloads([w]).values()
    share = counts.warp_instructions / NCU_ISSUED[workload]
    assert NCU_SHARE[0] <= share <= NCU_SHARE[1], share


ISSUED = conftest.ISSUED
#: The model's count over ncu's, at least (0.05 under what it was when counted), where it is
#: under 0.9: a warp's path there turns on what no load or store tells apart, which the model
#: takes its shortest way (a lane's loop over an adaptive window or a general walk's taps, a
#: max gradient's overlapping windows, a pack's channel tail; the global average's gradient:
#: not found yet).
#: Every other case: within 10 %, exact (to 0.5 %) where a warp's path follows from its loads
#: and stores alone (the max row tiles, the int8 max's pair tiles).
ISSUED_AT_LEAST = {
    "resnet stem max NHWC": 0.78, "inception avg 3x3 s1 p1": 0.68, "inception avg NHWC": 0.80,
    "global avg NHWC": 0.75, "3d max 2x2x2": 0.71, "resnet stem max 3x3 s2 p1 backward": 0.59,
    "densenet avg 2x2 s2 backward": 0.84, "resnet50 head global avg backward": 0.56,
}
ISSUED_EXACT = ("resnet stem max 3x3 s2 p1", "resnet stem max f16", "vgg max 2x2 s2",
                "1d max 3 s2 p1", "seed [64,56,56] max 2x2 s2", "int8 max 2x2 s2")
#: The model's count over ncu's, at most, where it is over 1.1: a region charged whole where
#: the lanes agree (0.05 over what it was when counted).
ISSUED_AT_MOST = {"resnet stem max + indices": 1.21}


@functools.lru_cache(maxsize=None)
def _counted_kernels() -> dict:
    with open(ISSUED) as f:
        return {c["case"]: [la["kernel"] for la in c["launches"]]
                for c in json.load(f)["cases"]}


@functools.lru_cache(maxsize=None)
def _issued(count: str = "warp_instructions") -> dict:
    with open(ISSUED) as f:
        return {c["case"]: sum(la[count] for la in c["launches"])
                for c in json.load(f)["cases"]}


@pytest.mark.skipif(conftest.GPU_RUNTIME != "executor",
                    reason="traces gpupool on the CPU executor's stand-in CuPy (a GPU is in use)")
@pytest.mark.parametrize("name", [c.name for c in benchmodel.modeled_cases()])
def test_the_count_of_gpupools_kernels_against_ncu(modeled_suite, name):
    # ncu writes a bool template argument as 1/0
    kernels = [la.name.replace("true", "1").replace("false", "0")
               for la in modeled_suite[name].launches]
    assert kernels == _counted_kernels()[name], "ncu counted other kernels: count them again"
    ratio = modeled_suite[name].warp_instructions / _issued()[name]
    if name in ISSUED_EXACT:
        assert ratio == pytest.approx(1, abs=0.005)
    assert ISSUED_AT_LEAST.get(name, 0.9) <= ratio <= ISSUED_AT_MOST.get(name, 1.1), ratio


@pytest.mark.skipif(conftest.GPU_RUNTIME != "executor",
                    reason="traces gpupool on the CPU executor's stand-in CuPy (a GPU is in use)")
@pytest.mark.parametrize("name", ISSUED_EXACT)
def test_the_pipes_of_gpupools_kernels_against_ncu(modeled_suite, name):
    """Where the count is exact, so is every pipe's: each opcode goes where ncu counts it."""
    modeled = {p: 0.0 for p in pipes.PIPES}
    for la in modeled_suite[name].launches:
        for p, n in pipes.by_pipe(la.counts.opcodes).items():
            modeled[p] += n
    modeled["fma"] += modeled.pop("fmaheavy")  # ncu's fma: both FMA pipes
    counted = {p: _issued(f"{p}_warp_instructions")[name] for p in pipes.PIPES
               if p not in ("fmaheavy", "fp64", "other")}
    counted["other"] = _issued()[name] - sum(counted.values())
    total = _issued()[name]
    for p, n in counted.items():
        assert modeled[p] == pytest.approx(n, abs=0.005 * total), p
