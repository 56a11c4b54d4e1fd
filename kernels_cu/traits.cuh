// Element traits of the kernels' types: the accumulator type of each element type, its lowest
// value, the NaN test, the conversions in and out, and PyTorch's max rule.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gp {

// An unsigned word of B bytes, moved whole by one load or store instruction.
template <int B> struct Word;
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<8> { typedef unsigned long long type; };
template <> struct Word<16> { typedef uint4 type; };

// T where B holds, else F.
template <bool B, typename T, typename F> struct Select { typedef T type; };
template <typename T, typename F> struct Select<false, T, F> { typedef F type; };

// V elements of T loaded or stored as one aligned vector.
template <typename T, int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

// Element traits. `acc` is the type a window is reduced in: float for half and bfloat16 (exact
// for max, float accumulation for sums; the result rounded once, to nearest even), the element
// type itself otherwise (integers only ever take the
// max path, which never does arithmetic).
template <typename T> struct Num;

// A type reduced in itself: its lowest value and its NaN test (``v`` the value tested).
#define GP_TRAITS(T, LOWEST, IS_NAN)                                                           \
  template <> struct Num<T> {                                                                  \
    typedef T acc;                                                                             \
    static __device__ __forceinline__ acc lowest() { return LOWEST; }                          \
    static __device__ __forceinline__ acc load(T v) { return v; }                              \
    static __device__ __forceinline__ T store(acc v) { return v; }                             \
    static __device__ __forceinline__ bool is_nan(acc v) { return IS_NAN; }                    \
  };
GP_TRAITS(float, __int_as_float(0xff800000), isnan(v))
GP_TRAITS(double, __longlong_as_double(0xfff0000000000000ULL), isnan(v))

// The 16-bit floats: float32 arithmetic, each tap widened exactly (WIDEN) and each result
// rounded once to nearest even (ROUND); __float2bfloat16_rn gives 0x7FFF for every NaN (the
// NumPy backend rounds the same way).
#define GP_WIDENED_TRAITS(T, WIDEN, ROUND)                                              \
  template <> struct Num<T> {                                                           \
    typedef float acc;                                                                  \
    static __device__ __forceinline__ acc lowest() { return __int_as_float(0xff800000); } \
    static __device__ __forceinline__ acc load(T v) { return WIDEN(v); }                \
    static __device__ __forceinline__ T store(acc v) { return ROUND(v); }               \
    static __device__ __forceinline__ bool is_nan(acc v) { return isnan(v); }           \
  };
GP_WIDENED_TRAITS(__half, __half2float, __float2half_rn)
GP_WIDENED_TRAITS(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn)
#undef GP_WIDENED_TRAITS

GP_TRAITS(signed char, (signed char)(-128), ((void)v, false))
GP_TRAITS(unsigned char, (unsigned char)0, ((void)v, false))
GP_TRAITS(short, (short)(-32768), ((void)v, false))
GP_TRAITS(int, (int)(-2147483647 - 1), ((void)v, false))
GP_TRAITS(long long, (long long)(-9223372036854775807LL - 1), ((void)v, false))
#undef GP_TRAITS

// The max of two elements as stored where one instruction takes it: the 16-bit floats'
// HMNMX2 (NaN if either is NaN, as 0x7FFF, the NaN every 16-bit float result carries; of -0
// and +0 either may come out). The values-only max of the row tiles reduces their taps so.
template <typename T> struct StoredMax { static constexpr bool exists = false; };
#define GP_STORED_MAX(T)                                                           \
  template <> struct StoredMax<T> {                                                \
    static constexpr bool exists = true;                                           \
    static __device__ __forceinline__ T of(T a, T b) { return __hmax_nan(a, b); } \
  };
GP_STORED_MAX(__half)
GP_STORED_MAX(__nv_bfloat16)
#undef GP_STORED_MAX

// PyTorch's max rule: NaN wins and stays (a later NaN replaces it), ties keep the first.
template <typename A>
__device__ __forceinline__ bool max_takes(A v, A m) {
  return v > m || Num<A>::is_nan(v);
}

// a - b modulo 2**32 (2**64): defined for any a and b, such as an index not yet checked.
__device__ __forceinline__ int wrapping_sub(int a, int b) {
  return (int)((unsigned)a - (unsigned)b);
}
__device__ __forceinline__ long long wrapping_sub(long long a, long long b) {
  return (long long)((unsigned long long)a - (unsigned long long)b);
}

}  // namespace gp
