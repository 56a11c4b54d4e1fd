// Warp-level reductions: a shuffle for every accumulator type, and the reduction of a value
// over aligned groups of lanes with a reduction's own operator.
#pragma once

namespace gp {

// Warp shuffle for every accumulator type (sub-int types travel as int).
template <typename A>
__device__ __forceinline__ A shfl_xor(A v, int off, int width) {
  return __shfl_xor_sync(0xffffffffu, v, off, width);
}
#define GP_SHFL_AS_INT(T)                                                                      \
  template <> __device__ __forceinline__ T shfl_xor<T>(T v, int off, int width) {              \
    return (T)__shfl_xor_sync(0xffffffffu, (int)v, off, width);                                \
  }
GP_SHFL_AS_INT(signed char)
GP_SHFL_AS_INT(unsigned char)
GP_SHFL_AS_INT(short)
#undef GP_SHFL_AS_INT

// Reduce `v` over aligned groups of L lanes (L a power of two <= 32) with r.combine; every
// lane of the group gets the result. Every lane of the warp must take part.
template <int L, typename A, typename R>
__device__ __forceinline__ A group_reduce(A v, const R& r) {
#pragma unroll
  for (int off = L / 2; off > 0; off /= 2) {
    v = r.combine(v, shfl_xor(v, off, L));
  }
  return v;
}

}  // namespace gp
