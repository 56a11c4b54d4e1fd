"""The executed-instruction count of the GPU model (gpumodel.instructions): hand-written kernels
whose executed warp instructions follow from their machine code by construction (straight
code, loops of one iteration per load, a loop nest), and the counts ncu published for
PyTorch's average-pool kernel (../shared/calibration/measured.json notes). The kernels are
compiled with NVRTC for sm_90 and traced on the CPU executor; no GPU is needed.
"""
from __future__ import annotations

import numpy as np
import pytest

import conftest
from cudacpu import executor, installed_cupy
from gpumodel import calibration, instructions, sass, trace

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
"""
NAMES = ("twice_kernel", "row_kernel", "window_kernel", "guarded_kernel", "predicated_kernel")
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
