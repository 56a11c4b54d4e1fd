// Shared helpers for the gpupool kernels: element traits (accumulator type, lowest value,
// NaN test, conversions), warp reductions and the plane index of a block.
//
// The host (gpupool/cuda_backend.py) inlines this header into each family's source before
// compiling, so CuPy's kernel cache keys on the full text.
#pragma once
#include <cuda_fp16.h>

namespace gp {

// Element traits. `acc` is the type a window is reduced in: float for half (exact for max,
// float accumulation for sums), the element type itself otherwise (integers only ever take the
// max path, which never does arithmetic).
template <typename T> struct Num;

#define GP_FLOAT_TRAITS(T, LOWEST)                                                             \
  template <> struct Num<T> {                                                                  \
    typedef T acc;                                                                             \
    static __device__ __forceinline__ acc lowest() { return LOWEST; }                          \
    static __device__ __forceinline__ acc load(T v) { return v; }                              \
    static __device__ __forceinline__ T store(acc v) { return v; }                             \
    static __device__ __forceinline__ bool is_nan(acc v) { return isnan(v); }                  \
  };
GP_FLOAT_TRAITS(float, __int_as_float(0xff800000))
GP_FLOAT_TRAITS(double, __longlong_as_double(0xfff0000000000000ULL))
#undef GP_FLOAT_TRAITS

template <> struct Num<__half> {
  typedef float acc;
  static __device__ __forceinline__ acc lowest() { return __int_as_float(0xff800000); }
  static __device__ __forceinline__ acc load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(acc v) { return __float2half_rn(v); }
  static __device__ __forceinline__ bool is_nan(acc v) { return isnan(v); }
};

#define GP_INT_TRAITS(T, LOWEST)                                                               \
  template <> struct Num<T> {                                                                  \
    typedef T acc;                                                                             \
    static __device__ __forceinline__ acc lowest() { return LOWEST; }                          \
    static __device__ __forceinline__ acc load(T v) { return v; }                              \
    static __device__ __forceinline__ T store(acc v) { return v; }                             \
    static __device__ __forceinline__ bool is_nan(acc) { return false; }                       \
  };
GP_INT_TRAITS(signed char, (signed char)(-128))
GP_INT_TRAITS(unsigned char, (unsigned char)0)
GP_INT_TRAITS(short, (short)(-32768))
GP_INT_TRAITS(int, (int)(-2147483647 - 1))
GP_INT_TRAITS(long long, (long long)(-9223372036854775807LL - 1))
#undef GP_INT_TRAITS

// PyTorch's max rule: NaN wins and stays (a later NaN replaces it), ties keep the first.
template <typename A>
__device__ __forceinline__ bool max_takes(A v, A m) {
  return v > m || Num<A>::is_nan(v);
}

// Index of this block over grid y, then z (each at most 65535).
__device__ __forceinline__ long long block_plane() {
  return (long long)blockIdx.y + (long long)gridDim.y * (long long)blockIdx.z;
}

// Plane of this thread in the window and adaptive launches: each block holds blockDim.z
// planes (several when a plane has too few outputs to fill a block), threadIdx.z picks one.
__device__ __forceinline__ long long thread_plane() {
  return block_plane() * (long long)blockDim.z + (long long)threadIdx.z;
}

// Combine two partial reductions (max: the NaN rule is order-free for values only).
template <bool IS_MAX, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if (IS_MAX) return max_takes(b, a) ? b : a;
  return a + b;
}

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

// Reduce `v` over aligned groups of L lanes (L a power of two <= 32); every lane of the group
// gets the result.
template <bool IS_MAX, int L, typename A>
__device__ __forceinline__ A group_reduce(A v) {
#pragma unroll
  for (int off = L / 2; off > 0; off /= 2) {
    v = combine<IS_MAX>(v, shfl_xor(v, off, L));
  }
  return v;
}

}  // namespace gp

namespace gp {

// Sliding-window geometry of one launch, canonical 3-D (D, H, W): a 1-D op has D = H = 1, a
// 2-D op D = 1. `chans` is the channel count of an NHWC launch (1 for NCHW); `rows` how many
// outputs one thread computes.
template <typename I>
struct Geo {
  I planes, chans, id, ih, iw, od, oh, ow;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw, rows;
};

}  // namespace gp

// Kernel parameters spelling out a Geo<I>, and the statement that builds it.
#define GP_GEO_PARAMS(I)                                                                       \
  I planes, I chans, I id, I ih, I iw, I od, I oh, I ow, int kd, int kh, int kw, int sd,       \
      int sh, int sw, int pd, int ph, int pw, int dd, int dh, int dw, int rows
#define GP_GEO(I)                                                                              \
  const gp::Geo<I> g = {planes, chans, id, ih, iw, od, oh, ow, kd, kh, kw, sd,                 \
                        sh, sw, pd, ph, pw, dd, dh, dw, rows}

namespace gp {

// Thread-to-output maps shared by the window and adaptive kernels: call
//   f(xp, cs, o_d, o_h, o_w, oi)
// for each output of this thread, where xp points at this thread's input plane (NHWC: already
// offset to its channel), cs is the element step between spatial neighbours (1 for NCHW, the
// channel count for NHWC), (o_d, o_h, o_w) the output coordinates and oi the flat index of the
// output element (into out and indices). Planes: see thread_plane (block z packs planes).
//
// NCHW -- grid: x = (W chunks of blockDim.x) x (row chunks of blockDim.y * rows rows, a row
//   being one (d, h) of the output), y/z = plane groups of blockDim.z. block: (TX, TY, TZ).
//   thread: one output column o_w, rows r*TY + threadIdx.y of its chunk (consecutive lanes ->
//   consecutive o_w), of plane thread_plane().
template <typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs_nchw(const Geo<I>& g, const T* __restrict__ x, F f) {
  const long long plane = thread_plane();
  if (plane >= (long long)g.planes) return;
  const I nwb = (g.ow + (I)blockDim.x - 1) / (I)blockDim.x;
  const I wchunk = (I)blockIdx.x % nwb;
  const I rchunk = (I)blockIdx.x / nwb;
  const I o_w = wchunk * (I)blockDim.x + (I)threadIdx.x;
  if (o_w >= g.ow) return;
  const I nrows = g.od * g.oh;
  const I p = (I)plane;
  const T* __restrict__ xp = x + p * (g.id * g.ih * g.iw);
  const I row0 = rchunk * (I)blockDim.y * (I)g.rows + (I)threadIdx.y;
  for (int r = 0; r < g.rows; ++r) {
    const I row = row0 + (I)r * (I)blockDim.y;
    if (row >= nrows) break;
    I o_d = 0, o_h = row;
    if (g.od > 1) {
      o_d = row / g.oh;
      o_h = row - o_d * g.oh;
    }
    f(xp, (I)1, o_d, o_h, o_w, (p * nrows + row) * g.ow + o_w);
  }
}

// NHWC -- grid: x = (channel chunks of blockDim.x) x (position chunks of blockDim.y * rows
//   output positions (d, h, w)), y/z = batch row groups of blockDim.z. block: (TX along
//   channels, TY along positions, TZ batch rows). thread: one channel, positions r*TY +
//   threadIdx.y of its chunk (consecutive lanes -> consecutive channels, so loads and stores
//   are contiguous), of batch row thread_plane().
template <typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs_nhwc(const Geo<I>& g, const T* __restrict__ x, F f) {
  const long long plane = thread_plane();
  if (plane >= (long long)g.planes) return;
  const I ncb = (g.chans + (I)blockDim.x - 1) / (I)blockDim.x;
  const I cchunk = (I)blockIdx.x % ncb;
  const I qchunk = (I)blockIdx.x / ncb;
  const I c = cchunk * (I)blockDim.x + (I)threadIdx.x;
  if (c >= g.chans) return;
  const I npos = g.od * g.oh * g.ow;
  const I p = (I)plane;
  const T* __restrict__ xp = x + p * (g.id * g.ih * g.iw * g.chans) + c;
  const I q0 = qchunk * (I)blockDim.y * (I)g.rows + (I)threadIdx.y;
  for (int r = 0; r < g.rows; ++r) {
    const I q = q0 + (I)r * (I)blockDim.y;
    if (q >= npos) break;
    const I t = q / g.ow;
    const I o_w = q - t * g.ow;
    const I o_d = t / g.oh;
    const I o_h = t - o_d * g.oh;
    f(xp, g.chans, o_d, o_h, o_w, (p * npos + q) * g.chans + c);
  }
}

template <bool NHWC, typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs(const Geo<I>& g, const T* __restrict__ x, F f) {
  if constexpr (NHWC) {
    for_outputs_nhwc<I>(g, x, f);
  } else {
    for_outputs_nchw<I>(g, x, f);
  }
}

// The window walk, written once. Calls f(pos) for every tap of the window of output
// (o_d, o_h, o_w) that lies inside the input -- taps in the padding are skipped -- in
// row-major tap order (D, then H, then W); pos = (d * IH + h) * IW + w is the tap's flat
// position in the spatial plane. K: the H and W window size when compiled in (0: g.kh, g.kw).
template <int K, typename I>
struct WindowTaps {
  const Geo<I>& g;
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    const int kh = K ? K : g.kh;
    const int kw = K ? K : g.kw;
    const I d0 = o_d * (I)g.sd - (I)g.pd;
    const I h0 = o_h * (I)g.sh - (I)g.ph;
    const I w0 = o_w * (I)g.sw - (I)g.pw;
    for (int a = 0; a < g.kd; ++a) {
      const I d = d0 + (I)a * (I)g.dd;
      if (d < 0 || d >= g.id) continue;
#pragma unroll
      for (int b = 0; b < kh; ++b) {
        const I h = h0 + (I)b * (I)g.dh;
        if (h < 0 || h >= g.ih) continue;
        const I rowbase = (d * g.ih + h) * g.iw;
#pragma unroll
        for (int c = 0; c < kw; ++c) {
          const I w = w0 + (I)c * (I)g.dw;
          if (w < 0 || w >= g.iw) continue;
          f(rowbase + w);
        }
      }
    }
  }
};

// Adaptive windows: output o of a dim of input size n pooled to m spans
// [floor(o*n/m), ceil((o+1)*n/m)), never empty, in integer arithmetic of I (the host picks
// long long when (m + 1) * n does not fit in int). Calls f(pos) as WindowTaps does.
template <typename I>
__device__ __forceinline__ void adaptive_bounds(I o, I n, I m, I& start, I& end) {
  start = (o * n) / m;
  end = ((o + 1) * n + m - 1) / m;
}

template <typename I>
struct AdaptiveTaps {
  const Geo<I>& g;
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    I d0, d1, h0, h1, w0, w1;
    adaptive_bounds<I>(o_d, g.id, g.od, d0, d1);
    adaptive_bounds<I>(o_h, g.ih, g.oh, h0, h1);
    adaptive_bounds<I>(o_w, g.iw, g.ow, w0, w1);
    for (I d = d0; d < d1; ++d) {
      for (I h = h0; h < h1; ++h) {
        const I rowbase = (d * g.ih + h) * g.iw;
        for (I w = w0; w < w1; ++w) f(rowbase + w);
      }
    }
  }
};

// Accumulators the walks feed, one tap position at a time.

// Max with PyTorch's rules; with IDX also the winner's position: the first tap holding the
// max, or the last NaN; -1 (and the lowest value) when no tap is valid.
template <typename T, typename I, bool IDX>
struct MaxOfTaps {
  typedef typename Num<T>::acc A;
  const T* __restrict__ xp;
  I cs;
  A m;
  I best;
  __device__ __forceinline__ MaxOfTaps(const T* __restrict__ xp_, I cs_)
      : xp(xp_), cs(cs_), m(Num<T>::lowest()), best(-1) {}
  __device__ __forceinline__ void operator()(I pos) {
    const A v = Num<T>::load(xp[pos * cs]);
    if (IDX) {
      if (best < 0 || max_takes(v, m)) {
        m = v;
        best = pos;
      }
    } else if (max_takes(v, m)) {
      m = v;
    }
  }
};

// Sum over the taps of x (LP false) or of |x|**p (LP true; p == 1 and p == 2 without pow),
// in A (float for half), and the number of taps.
template <typename T, typename I, bool LP>
struct SumOfTaps {
  typedef typename Num<T>::acc A;
  const T* __restrict__ xp;
  I cs;
  A p;
  A s;
  long long n;
  __device__ __forceinline__ SumOfTaps(const T* __restrict__ xp_, I cs_, A p_)
      : xp(xp_), cs(cs_), p(p_), s(0), n(0) {}
  __device__ __forceinline__ void operator()(I pos) {
    A v = Num<T>::load(xp[pos * cs]);
    if (LP) {
      v = fabs(v);
      if (p == (A)2) {
        v = v * v;
      } else if (p != (A)1) {
        v = pow(v, p);
      }
    }
    s += v;
    ++n;
  }
};

// Max pooling over any walk (WindowTaps, AdaptiveTaps): values, and with IDX int64 indices.
template <typename T, typename I, bool IDX, bool NHWC, typename Taps>
__device__ __forceinline__ void max_outputs(const T* __restrict__ x, T* __restrict__ out,
                                            long long* __restrict__ indices, const Taps& taps,
                                            const Geo<I>& g) {
  for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    MaxOfTaps<T, I, IDX> acc(xp, cs);
    taps(o_d, o_h, o_w, acc);
    out[oi] = Num<T>::store(acc.m);
    if (IDX) indices[oi] = (long long)acc.best;
  });
}

}  // namespace gp
