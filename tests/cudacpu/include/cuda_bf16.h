// cuda_bf16.h for the CPU executor (tests/cudacpu): __nv_bfloat16 as a 2-byte struct holding
// the upper half of a float32, with the conversions of CUDA's cuda_bf16.hpp: float -> bfloat16
// rounds to nearest even (overflow to infinity, subnormals kept) and turns every NaN into
// 0x7FFF (__internal_float2bfloat16); double -> bfloat16 rounds once; bfloat16 -> float is
// exact.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda_fp16.h"  // cudacpu::max_nan

struct __nv_bfloat16_raw {
  unsigned short x;
};

namespace cudacpu {
inline unsigned short float_to_bfloat16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fffu;  // NaN
  const uint32_t remainder = x << 16;
  unsigned short r = (unsigned short)(x >> 16);
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (r & 1u))) ++r;
  return r;
}
// double -> bfloat16 rounded once, as __double2bfloat16: narrowed to float with round to odd
// (truncate, then set the last bit when inexact), which keeps what the second rounding needs
// (float holds 16 more bits than bfloat16), then rounded to bfloat16 to nearest even.
inline unsigned short double_to_bfloat16_bits(double d) {
  if (d != d) return (unsigned short)0x7fffu;
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if ((double)f != d) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return float_to_bfloat16_bits(f);
}
inline float bfloat16_bits_to_float(unsigned short b) {
  const uint32_t x = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace cudacpu

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(cudacpu::float_to_bfloat16_bits(f)) {}
  __nv_bfloat16(double f) : __x(cudacpu::double_to_bfloat16_bits(f)) {}
  operator float() const { return cudacpu::bfloat16_bits_to_float(__x); }
};
static_assert(sizeof(__nv_bfloat16) == 2, "__nv_bfloat16 must be 2 bytes");

inline float __bfloat162float(__nv_bfloat16 b) { return cudacpu::bfloat16_bits_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 b;
  b.__x = cudacpu::float_to_bfloat16_bits(f);
  return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16 __double2bfloat16(double d) {
  __nv_bfloat16 b;
  b.__x = cudacpu::double_to_bfloat16_bits(d);
  return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}
inline __nv_bfloat16 __hmax_nan(__nv_bfloat16 a, __nv_bfloat16 b) {
  return cudacpu::max_nan(a, b, __bfloat162float(a), __bfloat162float(b));
}
