"""Tests of the CPU executor for CUDA kernels (``tests/cudacpu``) itself.

Every expectation comes from NumPy or from a plain Python model of CUDA's documented
semantics, so these tests say whether the executor can be trusted to check the project's
kernels: ``__half`` and ``__nv_bfloat16`` conversions, warp shuffles and votes, barriers and
``__shared__``, the schedules, the errors it reports, argument checking, the out-of-bounds guard
and subnormal flushing.
"""
from __future__ import annotations

import platform

import ml_dtypes
import numpy as np
import pytest

import conftest
from cudacpu import executor

NO_COMPILER = executor.host_compiler_reason()
pytestmark = pytest.mark.skipif(NO_COMPILER is not None, reason=f"{NO_COMPILER}")
BF16 = np.dtype(ml_dtypes.bfloat16)

SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ int global_thread() { return blockIdx.x * blockDim.x + threadIdx.x; }

__global__ void half_to_float_kernel(const __half* in, float* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = __half2float(in[i]);
}

__global__ void float_to_half_kernel(const float* in, __half* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = __float2half_rn(in[i]);
}

__global__ void double_to_half_kernel(const double* in, __half* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = __half(in[i]);
}

__global__ void bfloat16_to_float_kernel(const __nv_bfloat16* in, float* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void float_to_bfloat16_kernel(const float* in, __nv_bfloat16* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void double_to_bfloat16_kernel(const double* in, __nv_bfloat16* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = __nv_bfloat16(in[i]);
}

// kind 0 __shfl_sync, 1 __shfl_xor_sync, 2 __shfl_up_sync, 3 __shfl_down_sync; one result
// per argument 0..31 (source lane, lane mask or delta): out[arg * total threads + thread],
// threads numbered row-major within a block of any shape, blocks along x.
template <typename T>
__global__ void shuffle_kernel(const T* in, T* out, int kind, int width) {
  const int per_block = blockDim.x * blockDim.y * blockDim.z, total = gridDim.x * per_block;
  const int t = blockIdx.x * per_block + threadIdx.x +
                blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  for (int arg = 0; arg < 32; ++arg) {
    T r;
    switch (kind) {
      case 0: r = __shfl_sync(0xffffffffu, in[t], arg, width); break;
      case 1: r = __shfl_xor_sync(0xffffffffu, in[t], arg, width); break;
      case 2: r = __shfl_up_sync(0xffffffffu, in[t], (unsigned)arg, width); break;
      default: r = __shfl_down_sync(0xffffffffu, in[t], (unsigned)arg, width); break;
    }
    out[arg * total + t] = r;
  }
}

// Votes over the full warp (split 0) or over each half warp separately (split 1), in one
// block of any shape (lanes numbered by the thread's row-major index in the block).
__global__ void vote_kernel(const int* pred, unsigned* ballot, int* any, int* all, int split) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned mask = !split ? 0xffffffffu : (t % 32 < 16 ? 0x0000ffffu : 0xffff0000u);
  ballot[t] = __ballot_sync(mask, pred[t]);
  any[t] = __any_sync(mask, pred[t]);
  all[t] = __all_sync(mask, pred[t]);
}

// Tree sum of each block's slice of `in`; Barrier false omits every __syncthreads.
template <bool Barrier>
__global__ void block_sum_kernel(const int* in, int* out) {
  __shared__ int partial[256];
  const unsigned t = threadIdx.x;
  partial[t] = in[global_thread()];
  if (Barrier) __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    if (Barrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void reverse_in_block_kernel(const int* in, int* out) {
  __shared__ int tile[128];
  tile[threadIdx.x] = in[global_thread()];
  __syncthreads();
  out[global_thread()] = tile[blockDim.x - 1 - threadIdx.x];
}

// Each thread writes the ids it sees at its row-major position in the launch.
__global__ void indices_kernel(unsigned* out) {
  const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned* o = out + 12 * (bx * blockDim.x * blockDim.y * blockDim.z + tx);
  const unsigned v[12] = {blockIdx.z, blockIdx.y, blockIdx.x, threadIdx.z, threadIdx.y, threadIdx.x,
                          gridDim.z, gridDim.y, gridDim.x, blockDim.z, blockDim.y, blockDim.x};
  for (int i = 0; i < 12; ++i) o[i] = v[i];
}

// mode 0: every lane broadcasts lane 0's value; the others misuse a barrier or collective.
__global__ void misuse_kernel(int* out, int mode) {
  const int lane = threadIdx.x % 32;
  int r = 0;
  switch (mode) {
    case 0: r = __shfl_sync(0xffffffffu, lane + 100, 0); break;
    case 1: if (lane >= 16) return; r = __shfl_sync(0xffffffffu, lane, 0); break;
    case 2: if (lane >= 16) return; __syncthreads(); break;
    case 3: if (lane < 16) __syncthreads(); else r = __shfl_sync(0xffffffffu, lane, 0); break;
    case 4:
      if (lane < 16) r = __shfl_sync(0xffffffffu, lane, 0); else __ballot_sync(0xffffffffu, 1);
      break;
    case 5: r = __shfl_sync(1u, lane, 0); break;
    case 6: if (lane == 3) __trap(); break;
    case 7: r = __shfl_sync(0xffffffffu, lane, 0, 12); break;
  }
  out[threadIdx.x] = r;
}

__global__ void fill_kernel(int* out) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[t + blockDim.x * blockDim.y * blockDim.z * (blockIdx.x + gridDim.x * blockIdx.y)] = 1;
}

__global__ void mark_first_kernel(int* out) {
  if (!(threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z)) out[0] = 1;
}

__global__ void scalars_kernel(int* out, int i, double d, unsigned u) {
  out[0] = i + (int)d + (int)u;
}

__global__ void write_at_kernel(int* out, int index, int value) {
  if (threadIdx.x == 0) out[index] = value;
}

__global__ void copy_kernel(const int* __restrict__ in, int* __restrict__ out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = in[i];
}

__global__ void add_kernel(const int* a, const int* b, int* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}

static int recorded;
__global__ void reset_record_kernel() { recorded = 0; }
__global__ void record_block_kernel(int* order) {
  if (threadIdx.x == 0)
    order[recorded++] = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__global__ void record_thread_kernel(int* order) {
  order[recorded++] = threadIdx.x;
  __syncthreads();
  order[recorded++] = threadIdx.x;
}

__global__ void vmax_kernel(const unsigned* a, const unsigned* b, unsigned* s, unsigned* u, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) {
    s[i] = __vmaxs4(a[i], b[i]);
    u[i] = __vmaxu4(a[i], b[i]);
  }
}

__global__ void vmax2_perm_kernel(const unsigned* a, const unsigned* b, const unsigned* sel,
                                  unsigned* s, unsigned* u, unsigned* p, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) {
    s[i] = __vmaxs2(a[i], b[i]);
    u[i] = __vmaxu2(a[i], b[i]);
    p[i] = __byte_perm(a[i], b[i], sel[i]);
  }
}

__global__ void scale_kernel(const float* in, float* out, float factor, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * factor;
}

// The address of `in` modulo 512, as the kernel sees it.
__global__ void address_kernel(const unsigned char* in, unsigned long long* out) {
  out[0] = (unsigned long long)(uintptr_t)in % 512;
}

// out[i]: the sum of the 4 floats of vector i of `in`, read with one 16-byte load (a float4's
// on a GPU, where a misaligned one traps); at most 64 threads per block, set through a macro.
struct alignas(16) Vec4 {
  float x, y, z, w;
};
#define VECTOR_BOUNDS(n) __launch_bounds__(n, 2)
__global__ void VECTOR_BOUNDS(64) vector_sum_kernel(const float* in, float* out, int n) {
  for (int i = global_thread(); i < n; i += gridDim.x * blockDim.x) {
    const Vec4 v = reinterpret_cast<const Vec4*>(in)[i];
    out[i] = v.x + v.y + v.z + v.w;
  }
}
"""

NAMES = ("half_to_float_kernel", "float_to_half_kernel", "double_to_half_kernel",
         "bfloat16_to_float_kernel", "float_to_bfloat16_kernel", "double_to_bfloat16_kernel",
         "shuffle_kernel<int>", "shuffle_kernel<double>", "vote_kernel",
         "block_sum_kernel<true>", "block_sum_kernel<false>", "reverse_in_block_kernel",
         "indices_kernel", "misuse_kernel", "fill_kernel", "mark_first_kernel",
         "scalars_kernel", "write_at_kernel", "copy_kernel", "add_kernel",
         "reset_record_kernel", "record_block_kernel", "record_thread_kernel", "vmax_kernel",
         "vmax2_perm_kernel", "scale_kernel", "address_kernel", "vector_sum_kernel")

SCHEDULES = ("forward", "reverse", "random:1")


@pytest.fixture(scope="module")
def lib() -> executor.Library:
    """Every test kernel, compiled once."""
    build = executor.Build.from_env()
    return executor.Library(executor.build_library(SOURCE, NAMES, build), NAMES)


@pytest.fixture(autouse=True)
def _default_runtime(monkeypatch):
    """The runtime's defaults, whatever the calling environment sets."""
    for name in ("CUDACPU_SCHEDULE", "CUDACPU_WORKERS", "CUDACPU_ALLOW_EXIT_BARRIER"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------ __half conversions

def _half_roundings() -> np.ndarray:
    """float32 inputs that exercise every branch of float -> half rounding."""
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 100_000, dtype=np.uint32)
    # exponents from below half's subnormals to above its overflow, random significands
    in_range = ((rng.integers(0, 2, 100_000, dtype=np.uint32) << 31)
                | (rng.integers(98, 145, 100_000, dtype=np.uint32) << 23)
                | rng.integers(0, 2**23, 100_000, dtype=np.uint32))
    halves = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    ties = ((halves[:-1] + halves[1:]) / 2).astype(np.float32)  # exact in float32
    near_ties = np.concatenate([np.nextafter(ties, np.float32(0)),
                                np.nextafter(ties, np.float32(np.inf))])
    tiny, smallest_normal = np.float32(2.0**-24), np.float32(2.0**-14)  # of half
    edges = np.array([0.0, 65504.0, 65519.996, 65520.0, 65536.0, 1e5, 3.4e38, np.inf, np.nan,
                      tiny, tiny / 2, np.nextafter(tiny / 2, np.float32(1)), tiny / 4,
                      tiny * 1.5, tiny * 2.5, 1e-45, smallest_normal,
                      np.nextafter(smallest_normal, np.float32(0))], dtype=np.float32)
    nans = np.array([0x7F800001, 0x7FC00000, 0x7FBFFFFF], np.uint32)  # payload below half's
    values = np.concatenate([random_bits.view(np.float32), in_range.view(np.float32), ties,
                             near_ties, edges, nans.view(np.float32)])
    return np.concatenate([values, -values])


def test_half_to_float_matches_numpy_for_all_65536_bit_patterns(lib):
    """__half2float of every half bit pattern is NumPy's float16 -> float32, bit for bit
    (NaN payloads included)."""
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    out = np.zeros(65536, np.float32)
    lib.kernel("half_to_float_kernel")((8,), (64,), (halves, out, np.int32(65536)))
    np.testing.assert_array_equal(out.view(np.uint32), halves.astype(np.float32).view(np.uint32))


def test_float_to_half_rounds_to_nearest_even_like_numpy(lib):
    """__float2half_rn of random float32 bit patterns, half ties and their neighbours, the
    overflow edge (65520 -> inf), subnormal halves and values below half the smallest one,
    +-0, +-inf and NaN is NumPy's float32 -> float16, but every NaN is 0x7FFF (as an H100
    narrows it; NumPy keeps the sign and the payload's top bits)."""
    values = _half_roundings()
    out = np.zeros(values.size, np.float16)
    lib.kernel("float_to_half_kernel")((8,), (64,), (values, out, np.int32(values.size)))
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])
    assert nan.sum() > 100 and (out.view(np.uint16)[nan] == 0x7FFF).all()


def test_half_from_double_rounds_once_like_numpy(lib):
    """__half(double) rounds the double straight to half (CUDA: __double2half), as NumPy's
    float64 -> float16 does: a double just off a tie between two halves goes to the nearer
    one, not to the even one as double -> float -> half does (the float is the tie)."""
    halves = np.arange(0x0001, 0x7BFF, dtype=np.uint16).view(np.float16).astype(np.float64)
    ties = (halves[:-1] + halves[1:]) / 2
    values = np.concatenate([ties * (1 + 2.0**-40), ties * (1 - 2.0**-40), ties])
    out = np.zeros(values.size, np.float16)
    lib.kernel("double_to_half_kernel")((8,), (64,), (values, out, np.int32(values.size)))
    np.testing.assert_array_equal(out.view(np.uint16), values.astype(np.float16).view(np.uint16))


# ------------------------------------------------------------------ __nv_bfloat16 conversions

def _bfloat16_roundings() -> np.ndarray:
    """float32 inputs that exercise every branch of float -> bfloat16 rounding: random bit
    patterns, bfloat16 ties and their neighbours, the overflow edge, subnormals, NaNs."""
    rng = np.random.default_rng(1)
    random_bits = rng.integers(0, 2**32, 100_000, dtype=np.uint32)
    upper = np.arange(0, 0x7F80, dtype=np.uint32) << 16
    ties = upper | 0x8000  # exactly halfway between two bfloat16s (even and odd below)
    near_ties = np.concatenate([ties - 1, ties + 1])
    edges = np.array([0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0x00000001, 0x00008000,
                      0x00018000, 0x007FFFFF, 0x7F800001, 0x7FC00000, 0x7FBFFFFF, 0x7FFFFFFF],
                     np.uint32)
    bits = np.concatenate([random_bits, upper, ties, near_ties, edges])
    return np.concatenate([bits, bits | 0x80000000]).view(np.float32)


def test_bfloat16_to_float_is_the_upper_half_for_all_65536_bit_patterns(lib):
    """__bfloat162float of every bfloat16 bit pattern is ml_dtypes' bfloat16 -> float32, bit
    for bit (NaN payloads included): the bits moved to the upper half."""
    bits = np.arange(65536, dtype=np.uint32)
    out = np.zeros(65536, np.float32)
    lib.kernel("bfloat16_to_float_kernel")((8,), (64,), (bits.astype(np.uint16).view(BF16), out,
                                                          np.int32(65536)))
    np.testing.assert_array_equal(out.view(np.uint32), bits << 16)
    np.testing.assert_array_equal(
        out.view(np.uint32), bits.astype(np.uint16).view(BF16).astype(np.float32).view(np.uint32))


def test_float_to_bfloat16_rounds_to_nearest_even_and_makes_nan_0x7fff(lib):
    """__float2bfloat16_rn is ml_dtypes' float32 -> bfloat16 (round to nearest even, overflow
    to inf, subnormals kept) on every number; every NaN becomes 0x7FFF, as in CUDA's
    cuda_bf16.hpp."""
    values = _bfloat16_roundings()
    out = np.zeros(values.size, BF16)
    lib.kernel("float_to_bfloat16_kernel")((8,), (64,), (values, out, np.int32(values.size)))
    nan = np.isnan(values)
    with np.errstate(over="ignore"):
        expected = values[~nan].astype(BF16)
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], expected.view(np.uint16))
    assert nan.sum() > 500 and (out.view(np.uint16)[nan] == 0x7FFF).all()


def test_bfloat16_from_double_rounds_once(lib):
    """__nv_bfloat16(double) rounds the double straight to bfloat16 (CUDA: __double2bfloat16):
    a double just above or below a tie between two bfloat16s goes to the nearer one (float
    first would make it the tie, then the even one)."""
    finite = np.arange(0x0001, 0x7F7F, dtype=np.uint16)
    values64 = finite.view(BF16).astype(np.float64)
    ties = (values64[:-1] + values64[1:]) / 2
    values = np.concatenate([ties * (1 + 2.0**-40), ties * (1 - 2.0**-40), -ties * (1 + 2.0**-40)])
    out = np.zeros(values.size, BF16)
    lib.kernel("double_to_bfloat16_kernel")((8,), (64,), (values, out, np.int32(values.size)))
    nearest = np.concatenate([finite[1:], finite[:-1], finite[1:] | 0x8000])
    np.testing.assert_array_equal(out.view(np.uint16), nearest)


# ------------------------------------------------------------------ warp collectives

def _shuffle_source(kind: str, lane: int, arg: int, width: int) -> int:
    """The lane whose value ``lane`` receives, per the CUDA programming guide."""
    group, position = divmod(lane, width)
    if kind == "idx":  # srcLane modulo width, within the caller's group
        return group * width + arg % width
    if kind == "xor":  # a later group's lane is not read: own value
        source = lane ^ arg
        return lane if source // width > group else source
    if kind == "up":  # no wrap: the first delta lanes of a group keep their value
        return lane - arg if position - arg >= 0 else lane
    return lane + arg if position + arg < width else lane  # down


@pytest.mark.parametrize("block", [(64,), (4, 2, 8)])
@pytest.mark.parametrize("dtype", [np.int32, np.float64])
@pytest.mark.parametrize("width", [8, 16, 32])
@pytest.mark.parametrize("kind", ["idx", "xor", "up", "down"])
def test_shuffle_matches_cuda_rules(lib, kind, width, dtype, block):
    """__shfl_sync / _xor / _up / _down over two warps of two blocks, for every argument
    0..31 at each width, read the lane CUDA's documented rules name (lanes numbered by
    row-major thread index, also in a 3-D block)."""
    total = 2 * 64  # two blocks of 64 threads
    values = (np.arange(total) * 7 + 3).astype(dtype)
    out = np.zeros(32 * total, dtype)
    name = "shuffle_kernel<int>" if dtype == np.int32 else "shuffle_kernel<double>"
    kind_code = ["idx", "xor", "up", "down"].index(kind)
    lib.kernel(name)((2,), block, (values, out, np.int32(kind_code), np.int32(width)))
    expected = np.array([values[t - t % 32 + _shuffle_source(kind, t % 32, arg, width)]
                         for arg in range(32) for t in range(total)], dtype)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("block", [(96,), (8, 3, 4)])
@pytest.mark.parametrize("split", [0, 1])
def test_votes_match_the_predicates_of_the_masked_lanes(lib, split, block):
    """__ballot_sync sets bit i for each lane i of the mask whose predicate is nonzero;
    __any_sync / __all_sync are whether any / all lanes of the mask have one (in a 1-D and
    a 3-D block)."""
    rng = np.random.default_rng(1)
    pred = rng.integers(-2, 3, 96).astype(np.int32) * rng.integers(0, 2, 96).astype(np.int32)
    pred[32:48] = 5  # a half warp whose predicates all hold
    ballot = np.zeros(96, np.uint32)
    any_, all_ = np.zeros(96, np.int32), np.zeros(96, np.int32)
    lib.kernel("vote_kernel")((1,), block, (pred, ballot, any_, all_, np.int32(split)))
    for t in range(96):
        base, lane = t - t % 32, t % 32
        lanes = range(32) if not split else (range(16) if lane < 16 else range(16, 32))
        bits = sum(1 << j for j in lanes if pred[base + j] != 0)
        assert ballot[t] == bits, t
        assert any_[t] == any(pred[base + j] != 0 for j in lanes), t
        assert all_[t] == all(pred[base + j] != 0 for j in lanes), t


# ------------------------------------------------------------------ barriers, __shared__, schedules

def _block_sums(lib, name, schedule, monkeypatch) -> tuple[np.ndarray, np.ndarray]:
    monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
    values = np.random.default_rng(2).integers(-1000, 1000, 4 * 256).astype(np.int32)
    out = np.zeros(4, np.int32)
    lib.kernel(name)((4,), (256,), (values, out))
    return out, values.reshape(4, 256).sum(axis=1)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_block_reduction_with_barriers_is_right_under_every_schedule(lib, schedule, monkeypatch):
    """A shared-memory tree sum with __syncthreads between writes and reads is exact."""
    out, expected = _block_sums(lib, "block_sum_kernel<true>", schedule, monkeypatch)
    np.testing.assert_array_equal(out, expected)


def test_block_reduction_without_barriers_is_wrong_under_some_schedule(lib, monkeypatch):
    """Without __syncthreads, threads read partial sums not yet written: some schedule
    among forward / reverse / random:1 gives a wrong sum (the executor exposes the race)."""
    wrong = [s for s in SCHEDULES
             if not np.array_equal(*_block_sums(lib, "block_sum_kernel<false>", s, monkeypatch))]
    assert wrong


@pytest.mark.parametrize("workers", ["1", "3"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_shared_memory_is_per_block_and_visible_after_a_barrier(lib, schedule, workers,
                                                                monkeypatch):
    """Each block reverses its own slice through __shared__: after __syncthreads a thread
    reads what another thread of its block wrote, and blocks (also on several OS threads)
    do not see each other's tile."""
    monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
    monkeypatch.setenv("CUDACPU_WORKERS", workers)
    values = np.arange(6 * 128, dtype=np.int32) * 3 - 100
    out = np.zeros_like(values)
    lib.kernel("reverse_in_block_kernel")((6,), (128,), (values, out))
    np.testing.assert_array_equal(out, values.reshape(6, 128)[:, ::-1].reshape(-1))


def test_thread_and_block_indices_cover_a_3d_launch(lib):
    """Every thread of a 3-D grid of 3-D blocks sees its own threadIdx and blockIdx and the
    launch's blockDim and gridDim (x varies fastest)."""
    grid, block = (2, 3, 2), (4, 2, 3)
    out = np.zeros((2, 3, 2, 3, 2, 4, 12), np.uint32)  # blockIdx z,y,x, threadIdx z,y,x
    lib.kernel("indices_kernel")(grid, block, (out,))
    ids = np.stack(np.meshgrid(*[np.arange(n) for n in (2, 3, 2, 3, 2, 4)], indexing="ij"), -1)
    dims = np.broadcast_to(np.array(grid[::-1] + block[::-1], np.uint32), ids.shape)
    np.testing.assert_array_equal(out, np.concatenate([ids, dims], -1))


def _recorded_order(lib, kernel, grid, block, size, schedule, monkeypatch) -> list[int]:
    monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
    order = np.full(size, -1, np.int32)
    lib.kernel("reset_record_kernel")((1,), (1,), ())
    lib.kernel(kernel)(grid, block, (order,))
    return order.tolist()


def test_blocks_run_in_schedule_order(lib, monkeypatch):
    """Blocks (numbered x fastest) run 0..n-1 under forward, n-1..0 under reverse, and in
    another permutation under random:7."""
    def order(schedule):
        return _recorded_order(lib, "record_block_kernel", (4, 2, 2), (32,), 16, schedule,
                               monkeypatch)
    assert order("forward") == list(range(16))
    assert order("reverse") == list(range(15, -1, -1))
    shuffled = order("random:7")
    assert sorted(shuffled) == list(range(16))
    assert shuffled not in (list(range(16)), list(range(15, -1, -1)))


def test_threads_run_in_schedule_order_on_each_side_of_a_barrier(lib, monkeypatch):
    """Between barriers the ready threads of a block run one after another: 0..n-1 under
    forward, n-1..0 under reverse, another permutation under random:7, and nobody passes
    the barrier before everyone reached it."""
    def order(schedule):
        recorded = _recorded_order(lib, "record_thread_kernel", (1,), (64,), 128, schedule,
                                   monkeypatch)
        return recorded[:64], recorded[64:]
    assert order("forward") == (list(range(64)),) * 2
    assert order("reverse") == (list(range(63, -1, -1)),) * 2
    for side in order("random:7"):
        assert sorted(side) == list(range(64))
        assert side not in (list(range(64)), list(range(63, -1, -1)))


# ------------------------------------------------------------------ reported misuse

@pytest.mark.parametrize("mode, block, message", [
    (1, 32, r"__shfl\*_sync mask 0xffffffff names lane 16, which has exited"),
    (0, 16, r"mask 0xffffffff names lane 16, which does not exist \(block of 16 threads\)"),
    (2, 32, r"__syncthreads reached by 16 threads while 16 threads of the block already exited"),
    (3, 32, r"names lane 0, which waits at __syncthreads \(divergent warp: deadlock\)"),
    (4, 32, r"meet with different collectives or masks"),
    (5, 32, r"called with a mask that omits the calling lane"),
    (6, 32, r"thread \(3,0,0\): __trap\(\)"),
    (7, 32, r"shuffle width 12 is not a power of two"),
], ids=["shfl-after-exit", "shfl-missing-lanes", "barrier-after-exit", "divergent-deadlock",
        "mixed-collectives", "mask-omits-self", "trap", "bad-width"])
def test_misuse_fails_the_launch_with_its_reason(lib, mode, block, message):
    """Collective and barrier misuse fails the launch with a message naming the problem."""
    with pytest.raises(executor.LaunchError, match=message):
        lib.kernel("misuse_kernel")((2,), (block,), (np.zeros(block, np.int32), np.int32(mode)))


def test_well_formed_collective_and_allowed_exit_barrier_pass(lib, monkeypatch):
    """The controls of the misuse cases: a full-warp broadcast in a full warp runs, and
    CUDACPU_ALLOW_EXIT_BARRIER=1 releases a barrier some threads exited before."""
    out = np.zeros(64, np.int32)
    lib.kernel("misuse_kernel")((1,), (64,), (out, np.int32(0)))
    np.testing.assert_array_equal(out, np.full(64, 100))
    monkeypatch.setenv("CUDACPU_ALLOW_EXIT_BARRIER", "1")
    lib.kernel("misuse_kernel")((1,), (32,), (out, np.int32(2)))
    np.testing.assert_array_equal(out[:32], [0] * 16 + [100] * 16)  # lanes 16.. exited


@pytest.mark.parametrize("grid, block, message", [
    ((1,), (1025,), r"block \(1025,1,1\) exceeds the CUDA limits"),
    ((1,), (2, 1024), r"block \(2,1024,1\) exceeds the CUDA limits"),
    ((1,), (1, 1, 65), r"block \(1,1,65\) exceeds the CUDA limits"),
    ((1, 65536), (1,), r"grid \(1,65536,1\) exceeds the CUDA limits"),
    ((1, 1, 65536), (1,), r"grid \(1,1,65536\) exceeds the CUDA limits"),
    ((0,), (1,), r"a grid or block dimension is 0"),
    ((1,), (32, 0), r"a grid or block dimension is 0"),
])
def test_invalid_launch_configuration_is_refused(lib, grid, block, message):
    """Launch dimensions beyond CUDA's limits, or zero, fail the launch before it runs."""
    out = np.zeros(1, np.int32)
    with pytest.raises(executor.LaunchError, match=message):
        lib.kernel("mark_first_kernel")(grid, block, (out,))
    assert out[0] == 0


@pytest.mark.parametrize("grid, block", [((1,), (1024,)), ((1,), (16, 1, 64)), ((3, 2), (2, 3))])
def test_launch_configurations_at_the_limits_run_every_thread(lib, grid, block):
    """Blocks of 1024 threads or 64 in z are valid; every thread of the grid runs once."""
    out = np.zeros(int(np.prod(grid)) * int(np.prod(block)), np.int32)
    lib.kernel("fill_kernel")(grid, block, (out,))
    np.testing.assert_array_equal(out, 1)


# ------------------------------------------------------------------ argument checking

@pytest.mark.parametrize("args, message", [
    (lambda out: (out, 1, np.float64(2), np.uint32(3)),
     r"argument 1 is int64 \(int\); the parameter is a 4-byte 'i'"),
    (lambda out: (out, np.int32(1), np.float32(2), np.uint32(3)),
     r"argument 2 is float32 \(float32\); the parameter is a 8-byte 'f'"),
    (lambda out: (out, np.int32(1), np.float64(2), np.int32(3)),
     r"argument 3 is int32 \(int32\); the parameter is a 4-byte 'u'"),
    (lambda out: (out, np.zeros(1, np.int32), np.float64(2), np.uint32(3)),
     r"argument 1 must be a scalar"),
    (lambda out: (np.int32(0), np.int32(1), np.float64(2), np.uint32(3)),
     r"argument 0 must be an array"),
    (lambda out: (out.view(np.int16), np.int32(1), np.float64(2), np.uint32(3)),
     r"argument 0 has int16 elements \(2 bytes\); the kernel reads 4-byte elements"),
    (lambda out: (out, np.int32(1), np.float64(2)), r"3 arguments for 4 parameters"),
    (lambda out: (out, np.int32(1), np.float64(2), np.uint32(3), np.uint32(4)),
     r"5 arguments for 4 parameters"),
], ids=["python-int-for-int", "float32-for-double", "int32-for-unsigned", "array-for-scalar",
        "scalar-for-pointer", "itemsize-mismatch", "too-few", "too-many"])
def test_mismatched_arguments_raise_type_error_before_launch(lib, args, message):
    """An argument of the wrong kind, width or shape, or the wrong number of them, raises
    TypeError and the kernel never runs."""
    out = np.zeros(2, np.int32)
    with pytest.raises(TypeError, match=message):
        lib.kernel("scalars_kernel")((1,), (1,), args(out))
    np.testing.assert_array_equal(out, 0)


def test_matching_arguments_reach_the_kernel(lib):
    """The control: int, double (a Python float counts as one) and unsigned arrive intact."""
    out = np.zeros(2, np.int32)
    lib.kernel("scalars_kernel")((1,), (1,), (out, np.int32(-5), 40.0, np.uint32(3_000)))
    assert out[0] == -5 + 40 + 3_000


# ------------------------------------------------------------------ memory guards

@pytest.fixture
def canary_guarded():
    """Skip where arrays are guarded by ASan (an out-of-bounds write aborts the process)."""
    if executor.Build.from_env().asan:
        pytest.skip("ASan build: out-of-bounds writes abort instead of tripping canaries")


@pytest.mark.parametrize("index, message", [
    (10, r"out-of-bounds write 0 bytes past the end of an array of 40 bytes"),
    (-1, r"out-of-bounds write 4 bytes before an array of 40 bytes"),
])
def test_write_out_of_bounds_fails_the_launch(lib, canary_guarded, index, message):
    """A write one element past either end of an array trips its canary bytes."""
    with pytest.raises(executor.LaunchError, match=message):
        lib.kernel("write_at_kernel")((1,), (1,),
                                      (np.zeros(10, np.int32), np.int32(index), np.int32(7)))


def test_writes_in_bounds_pass_and_reach_the_array(lib, canary_guarded):
    """The first and last elements are in bounds, and the writes are copied back."""
    out = np.zeros(10, np.int32)
    lib.kernel("write_at_kernel")((1,), (1,), (out, np.int32(0), np.int32(7)))
    lib.kernel("write_at_kernel")((1,), (1,), (out, np.int32(9), np.int32(-7)))
    np.testing.assert_array_equal(out, [7] + [0] * 8 + [-7])


@pytest.mark.parametrize("overlap", ["same-array", "shifted-views"])
def test_written_argument_overlapping_another_is_refused(lib, overlap):
    """A non-const pointer argument that shares memory with another argument is refused
    (the kernels declare __restrict__), and the array is left untouched."""
    buf = np.arange(11, dtype=np.int32)
    src, dst = (buf, buf) if overlap == "same-array" else (buf[:-1], buf[1:])
    with pytest.raises(executor.LaunchError, match=r"arguments 0 and 1 overlap"):
        lib.kernel("copy_kernel")((1,), (32,), (src, dst, np.int32(dst.size)))
    np.testing.assert_array_equal(buf, np.arange(11))


def test_const_arguments_may_share_memory(lib):
    """Two read-only pointers to one array are allowed; the result is right."""
    a, out = np.arange(50, dtype=np.int32), np.zeros(50, np.int32)
    lib.kernel("add_kernel")((2,), (32,), (a, a, out, np.int32(50)))
    np.testing.assert_array_equal(out, 2 * a)


def test_non_contiguous_array_is_refused(lib):
    """A strided view cannot be passed as a pointer (the kernel would read the wrong bytes)."""
    buf = np.arange(20, dtype=np.int32)
    with pytest.raises(executor.LaunchError, match=r"argument 0 is not C-contiguous"):
        lib.kernel("copy_kernel")((1,), (32,), (buf[::2], np.zeros(10, np.int32), np.int32(10)))


# ------------------------------------------------------------------ intrinsics, FTZ

def test_vmax4_is_a_bytewise_signed_and_unsigned_max(lib):
    """__vmaxs4 / __vmaxu4 take the max of each byte as int8 / uint8."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, 4096, dtype=np.uint32)
    b = rng.integers(0, 2**32, 4096, dtype=np.uint32)
    a[:4] = [0x807F00FF, 0x7F80FF00, 0x80808080, 0xFFFFFFFF]
    b[:4] = [0x7F80FF00, 0x807F00FF, 0x7F7F7F7F, 0x00000000]
    signed, unsigned = np.zeros_like(a), np.zeros_like(a)
    lib.kernel("vmax_kernel")((4,), (64,), (a, b, signed, unsigned, np.int32(a.size)))
    np.testing.assert_array_equal(signed.view(np.int8),
                                  np.maximum(a.view(np.int8), b.view(np.int8)))
    np.testing.assert_array_equal(unsigned.view(np.uint8),
                                  np.maximum(a.view(np.uint8), b.view(np.uint8)))


def test_vmax2_and_byte_perm(lib):
    """__vmaxs2 / __vmaxu2 take the max of each halfword as int16 / uint16; __byte_perm(x, y,
    s) picks byte (s >> 4i) & 7 of the 8 bytes y:x for its byte i."""
    rng = np.random.default_rng(5)
    a, b, sel = (rng.integers(0, 2**32, 4096, dtype=np.uint32) for _ in range(3))
    a[:2] = [0x80007FFF, 0xFFFF0000]
    b[:2] = [0x7FFF8000, 0x0000FFFF]
    sel[:2] = [0x6420, 0x3311]
    signed, unsigned, perm = (np.zeros_like(a) for _ in range(3))
    lib.kernel("vmax2_perm_kernel")((4,), (64,), (a, b, sel, signed, unsigned, perm,
                                                   np.int32(a.size)))
    np.testing.assert_array_equal(signed.view(np.int16),
                                  np.maximum(a.view(np.int16), b.view(np.int16)))
    np.testing.assert_array_equal(unsigned.view(np.uint16),
                                  np.maximum(a.view(np.uint16), b.view(np.uint16)))
    pool = np.stack([a, b], axis=1).view(np.uint8).reshape(-1, 8)  # bytes of x, then of y
    picks = (sel[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & 7
    expected = np.take_along_axis(pool, picks.astype(np.intp), axis=1)
    np.testing.assert_array_equal(perm.view(np.uint8).reshape(-1, 4), expected)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="CUDACPU_FTZ sets the SSE MXCSR (x86-64 only)")
def test_ftz_define_flushes_subnormals_and_only_inside_the_launch(lib):
    """With CUDACPU_FTZ, x * 1.0 on float32 subnormals is 0 and on normal floats x; without
    it, and in a launch after it, subnormals survive. (The 1.0 is a kernel argument, so the
    compiler cannot fold the product away.)"""
    subnormal = np.array([1e-45, -1e-45, 1e-40, -5.8e-39, np.nextafter(np.float32(2.0**-126), 0)],
                         np.float32)
    normal = np.array([2.0**-126, -1.5, 3e38], np.float32)
    values = np.concatenate([subnormal, normal])
    names = ("scale_kernel",)
    ftz = executor.Library(executor.build_library(SOURCE, names, executor.Build.from_env(),
                                                  ("CUDACPU_FTZ",)), names)
    flushed, kept = np.full_like(values, np.nan), np.full_like(values, np.nan)
    args = (np.float32(1.0), np.int32(values.size))
    ftz.kernel("scale_kernel")((1,), (8,), (values, flushed) + args)
    lib.kernel("scale_kernel")((1,), (8,), (values, kept) + args)
    np.testing.assert_array_equal(flushed, np.concatenate([np.zeros_like(subnormal), normal]))
    np.testing.assert_array_equal(kept.view(np.uint32), values.view(np.uint32))


# ------------------------------------------------------------------ launch bounds, alignment

def test_launch_bounds_read_through_macros_and_enforced(lib):
    """A kernel's __launch_bounds__ (here set through a macro) is its limit of threads per
    block: a larger block fails the launch, as on a GPU; its bound passes."""
    bounds = executor.launch_bounds(SOURCE, executor.Build.from_env())
    assert bounds == {"vector_sum_kernel": 64}
    values = np.arange(4 * 64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    lib.kernel("vector_sum_kernel")((1,), (64,), (values, out, np.int32(64)))
    np.testing.assert_array_equal(out, values.reshape(64, 4).sum(axis=1))
    with pytest.raises(executor.LaunchError,
                       match=r"block of 128 threads, more than the kernel's __launch_bounds__ "
                             r"\(64\)"):
        lib.kernel("vector_sum_kernel")((1,), (32, 4), (values, out, np.int32(64)))


def test_unreadable_launch_bound_is_a_compile_error():
    """A bound the executor cannot read as an integer is refused rather than ignored."""
    code = "template <int N> __global__ void __launch_bounds__(N) k(int* out) {}\n"
    with pytest.raises(executor.CompileError, match=r"__launch_bounds__\(N, ...\)"):
        executor.launch_bounds(code, executor.Build.from_env())


def test_arguments_keep_their_address_modulo_512(lib):
    """The kernel sees each array at its caller's address modulo 512 (a guarded copy used to
    start on a fresh, aligned buffer, so a misaligned view could never show)."""
    buf = np.zeros(2048, np.uint8)
    out = np.zeros(1, np.uint64)
    for offset in (0, 1, 4, 8, 16, 100, 511):
        view = buf[offset:offset + 64]
        lib.kernel("address_kernel")((1,), (1,), (view, out))
        assert int(out[0]) == view.ctypes.data % 512


_MISALIGNED_LOAD = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from cudacpu import executor
from test_cudacpu import SOURCE
build = executor.Build.from_env()
lib = executor.Library(executor.build_library(SOURCE, ("vector_sum_kernel",), build),
                       ("vector_sum_kernel",))
buf = np.arange(72, dtype=np.float32)
first = (-buf.ctypes.data) % 16 // 4
out = np.zeros(16, np.float32)
lib.kernel("vector_sum_kernel")((1,), (16,), (buf[first:first + 64], out, np.int32(16)))
print("aligned ok", flush=True)
lib.kernel("vector_sum_kernel")((1,), (16,), (buf[first + 1:first + 65], out, np.int32(16)))
print("misaligned ran")
"""


def test_misaligned_vector_load_fails_under_ubsan():
    """A 16-byte load from an array that starts 4 bytes past a 16-byte boundary (a float4 read
    of a shifted view: a misaligned address on a GPU) aborts the sanitized build with UBSan's
    report; the aligned launch before it runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    tests = str(Path(__file__).resolve().parent)
    env = dict(os.environ, CUDACPU_SANITIZE="alignment")
    done = subprocess.run([sys.executable, "-c", _MISALIGNED_LOAD.format(tests=tests)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert "aligned ok" in done.stdout, done.stderr[-3000:]
    assert "misaligned ran" not in done.stdout
    assert done.returncode != 0 and "misaligned address" in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------ the stand-in CuPy

standin_only = pytest.mark.skipif(conftest.GPU_RUNTIME != "executor",
                                  reason="tests the executor's stand-in CuPy")


@pytest.fixture
def standin():
    return conftest.STANDIN


@pytest.fixture
def standin_kernels(standin):
    """The test kernels compiled and loaded through the stand-in, as gpupool loads its own."""
    image, _ = standin.cuda.compiler.compile_using_nvrtc(SOURCE, name_expressions=NAMES)
    module = standin.cuda.function.Module()
    module.load(image)
    return module


@pytest.mark.gpu
@standin_only
def test_unwritten_output_shows_poison(standin, standin_kernels):
    """Fresh memory from empty / empty_like is poison (NaN, -1), as a GPU hands back stale
    pool bytes: an output element a kernel never writes shows (zeroed memory hid it)."""
    out = standin.empty(4, np.int32)
    standin_kernels.get_function("write_at_kernel")((1,), (1,), (out, np.int32(0),
                                                                  np.int32(7)))
    np.testing.assert_array_equal(out.get(), [7, -1, -1, -1])
    assert np.isnan(standin.empty_like(standin.zeros((2, 3), np.float32)).get()).all()
    assert standin.empty((3, 5), np.float64, order="F").flags.f_contiguous


@pytest.mark.gpu
@standin_only
def test_launch_through_the_standin_enforces_launch_bounds(standin, standin_kernels):
    x, out = standin.zeros(4 * 256, np.float32), standin.empty(256, np.float32)
    with pytest.raises(executor.LaunchError, match=r"__launch_bounds__ \(64\)"):
        standin_kernels.get_function("vector_sum_kernel")((1,), (256,), (x, out, np.int32(256)))


@pytest.mark.gpu
@standin_only
def test_fresh_arrays_start_on_512_byte_boundaries_and_views_keep_their_offset(
        standin, standin_kernels):
    """As CuPy's pool blocks: every fresh array (empty, a copy, an op's result) at a multiple
    of 512 bytes; a kernel sees a view at its offset from there."""
    a = standin.empty(1000, np.uint8)
    for fresh in (a, a.copy(), a.astype(np.int16), a[1:] + 1,
                  standin.asarray(np.arange(7.0)), standin.ascontiguousarray(a[::2])):
        assert fresh.data.ptr % 512 == 0
    out = standin.empty(1, np.uint64)
    standin_kernels.get_function("address_kernel")((1,), (1,), (a[3:], out))
    assert int(out.get()[0]) == 3


@pytest.mark.gpu
@standin_only
def test_current_stream_is_per_device(standin, standin_kernels):
    """Each device has its own current stream (a stream entered on device 0 is not device 1's
    current stream), and a launch on device 1 with device 0's stream is refused."""
    if standin.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two devices")
    stream = standin.cuda.Stream(non_blocking=True)
    with stream:
        assert standin.cuda.get_current_stream() is stream
        with standin.cuda.Device(1):
            assert standin.cuda.get_current_stream() is standin.cuda.Stream.null
            out = standin.zeros(1, np.int32)
            with pytest.raises(executor.LaunchError, match=r"on a stream of device 0"):
                standin_kernels.get_function("mark_first_kernel")((1,), (1,), (out,),
                                                                  stream=stream)
        assert standin.cuda.get_current_stream(1) is standin.cuda.Stream.null
    assert standin.cuda.get_current_stream() is standin.cuda.Stream.null


@pytest.mark.gpu
@standin_only
def test_implicit_conversions_are_refused(standin):
    """CuPy refuses a NumPy array in its arithmetic (no implicit host-to-device copy) and
    NumPy's conversion of a device array (no implicit device-to-host copy); .get() and
    asnumpy copy."""
    a = standin.arange(3.0)
    for op in (lambda: a + np.ones(3), lambda: standin.maximum(a, np.ones(3))):
        with pytest.raises(TypeError, match=r"NumPy array operand"):
            op()
    for convert in (np.asarray, np.array, np.asanyarray, np.ascontiguousarray):
        with pytest.raises(TypeError, match=r"Implicit conversion to a NumPy array"):
            convert(a)
    assert (a + 1.0).get().tolist() == standin.asnumpy(a + 1.0).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.gpu
@standin_only
def test_standin_ops_flush_float32_subnormals_as_cupy_kernels(standin):
    """CuPy's kernels are compiled with -ftz=true: float32 subnormal operands and results of
    arithmetic, reductions and conversions become zeros of their sign; copies keep them."""
    tiny = np.array([1e-45, -1e-40, 2.0**-126, 1.5], np.float32)
    x = standin.asarray(tiny)
    flushed = [0.0, -0.0, 2.0**-126, 1.5]
    for got in ((x * np.float32(1)).get(), x.astype(np.float64).get(),
                standin.clip(x, -2, 2).get()):
        np.testing.assert_array_equal(got, flushed)
        np.testing.assert_array_equal(np.signbit(got), [False, True, False, False])
    assert x[:1].sum().get() == 0 and tiny[:1].sum() != 0
    halved = standin.asarray(np.array([2.0**-127, 3.0], np.float64)).astype(np.float32)
    np.testing.assert_array_equal(halved.get(), [0.0, 3.0])
    for kept in (x.copy(), standin.ascontiguousarray(x[::-1])[::-1], x.reshape(2, 2).ravel(),
                 standin.where(x != 7, x, x)):
        np.testing.assert_array_equal(kept.get().view(np.uint32), tiny.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("switch, pooled", [("1", True), ("0", False)])
def test_cupy_pool_switch(switch, pooled):
    """GPUPOOL_CUPY_POOL=0 makes CuPy allocate outside its memory pool (for compute-sanitizer,
    which cannot see an overrun inside a pooled block); the default keeps the pool."""
    import cupy
    pool, before = cupy.get_default_memory_pool(), cupy.cuda.get_allocator()
    try:
        cupy.cuda.set_allocator(pool.malloc)
        conftest.configure_memory_pool(cupy, {"GPUPOOL_CUPY_POOL": switch})
        used = pool.used_bytes()
        block = cupy.empty(1 << 20, np.uint8)
        assert (pool.used_bytes() - used >= block.nbytes) == pooled
    finally:
        cupy.cuda.set_allocator(before)


def test_without_gpu_or_compiler_gpu_tests_are_left_out_with_one_line():
    """Where neither a GPU nor a host compiler is usable, the gpu tests are deselected and the
    run says so once, instead of one skip line per test."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, CXX="false", GPUPOOL_GPU_TESTS="executor")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/test_cuda_host.py"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 5, out  # no test left to run
    assert out.count("gpu tests not run") == 1 and "SKIPPED" not in out, out
    assert "7 gpu tests not run: executor requested; false --version failed" in out, out
