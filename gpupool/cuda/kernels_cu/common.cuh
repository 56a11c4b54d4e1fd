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
//   thread, when W takes several chunks: one output column o_w, rows r*TY + threadIdx.y of its
//   chunk (consecutive lanes -> consecutive o_w), of plane thread_plane(). When W fits one
//   chunk (OW <= TX), the block's TX*TY threads take the chunk's outputs in row-major order
//   instead, thread t outputs t, t + TX*TY, ...: a row narrower than TX leaves no lane idle
//   (consecutive lanes -> consecutive outputs, a warp crossing into the next row).
template <typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs_nchw(const Geo<I>& g, const T* __restrict__ x, F f) {
  const long long plane = thread_plane();
  if (plane >= (long long)g.planes) return;
  const I nwb = (g.ow + (I)blockDim.x - 1) / (I)blockDim.x;
  const I nrows = g.od * g.oh;
  const I p = (I)plane;
  const T* __restrict__ xp = x + p * (g.id * g.ih * g.iw);
  const auto output = [&](I row, I o_w) {
    I o_d = 0, o_h = row;
    if (g.od > 1) {
      o_d = row / g.oh;
      o_h = row - o_d * g.oh;
    }
    f(xp, (I)1, o_d, o_h, o_w, (p * nrows + row) * g.ow + o_w);
  };
  if (nwb == 1) {
    const I first = (I)blockIdx.x * (I)blockDim.y * (I)g.rows;
    const I last = first + (I)blockDim.y * (I)g.rows < nrows ? first + (I)blockDim.y * (I)g.rows
                                                             : nrows;
    const I count = (last - first) * g.ow;
    const I step = (I)blockDim.x * (I)blockDim.y;
    for (I q = (I)threadIdx.y * (I)blockDim.x + (I)threadIdx.x; q < count; q += step) {
      const I r = q / g.ow;
      output(first + r, q - r * g.ow);
    }
    return;
  }
  const I wchunk = (I)blockIdx.x % nwb;
  const I rchunk = (I)blockIdx.x / nwb;
  const I o_w = wchunk * (I)blockDim.x + (I)threadIdx.x;
  if (o_w >= g.ow) return;
  const I row0 = rchunk * (I)blockDim.y * (I)g.rows + (I)threadIdx.y;
  for (int r = 0; r < g.rows; ++r) {
    const I row = row0 + (I)r * (I)blockDim.y;
    if (row >= nrows) break;
    output(row, o_w);
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

// One dim of a window: tap t in [0, n) lies at position first + t * step; the taps inside
// [0, size) are valid, the others fall in the padding.
template <typename I>
struct TapLine {
  I first, n, step, size;
};

// The window walk, written once, over the valid taps of the lines (d, h, w); a tap's flat
// position in the spatial plane is pos = (pd * h.size + ph) * w.size + pw. NH, NW: the H and W
// tap counts when compiled in (0: h.n, w.n).
//
// Row-major order (D, then H, then W), calling f(pos) per tap: the order of max pooling's
// first-tap rule and of the integer sums.
template <int NH, int NW, typename I, typename F>
__device__ __forceinline__ void walk_row_major(const TapLine<I>& d, const TapLine<I>& h,
                                               const TapLine<I>& w, F& f) {
  const I nh = NH ? (I)NH : h.n;
  const I nw = NW ? (I)NW : w.n;
  for (I a = 0; a < d.n; ++a) {
    const I pd = d.first + a * d.step;
    if (pd < 0 || pd >= d.size) continue;
#pragma unroll
    for (I b = 0; b < nh; ++b) {
      const I ph = h.first + b * h.step;
      if (ph < 0 || ph >= h.size) continue;
      const I rowbase = (pd * h.size + ph) * w.size;
#pragma unroll
      for (I c = 0; c < nw; ++c) {
        const I pw = w.first + c * w.step;
        if (pw < 0 || pw >= w.size) continue;
        f(rowbase + pw);
      }
    }
  }
}

// Separable order, the NumPy backend's, so that float sums round alike on both backends:
// the sum over W taps of the sums over H taps of the sums over D taps of term(pos), each
// starting from `zero` (-0 for averages: adding -0 leaves every value as it is, so each sum
// starts from its first tap; +0 for Lp terms, which are never negative, so that an empty
// window sums to +0). `count` gets the number of valid taps.
template <int NH, int NW, typename A, typename I, typename F>
__device__ __forceinline__ A sum_separable(const TapLine<I>& d, const TapLine<I>& h,
                                           const TapLine<I>& w, const F& term, A zero,
                                           long long& count) {
  const I nh = NH ? (I)NH : h.n;
  const I nw = NW ? (I)NW : w.n;
  A sum_w = zero;
  count = 0;
#pragma unroll
  for (I c = 0; c < nw; ++c) {
    const I pw = w.first + c * w.step;
    if (pw < 0 || pw >= w.size) continue;
    A sum_h = zero;
#pragma unroll
    for (I b = 0; b < nh; ++b) {
      const I ph = h.first + b * h.step;
      if (ph < 0 || ph >= h.size) continue;
      A sum_d = zero;
      for (I a = 0; a < d.n; ++a) {
        const I pd = d.first + a * d.step;
        if (pd < 0 || pd >= d.size) continue;
        sum_d += term((pd * h.size + ph) * w.size + pw);
        ++count;
      }
      sum_h += sum_d;
    }
    sum_w += sum_h;
  }
  return sum_w;
}

// Sliding windows: output o of a dim spans the taps o*s - pb + t*dil, t in [0, k). K: the H
// and W window size when compiled in (0: g.kh, g.kw).
template <int K, typename I>
struct WindowTaps {
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I o_d, I o_h, I o_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    d = {o_d * (I)g.sd - (I)g.pd, (I)g.kd, (I)g.dd, g.id};
    h = {o_h * (I)g.sh - (I)g.ph, (I)(K ? K : g.kh), (I)g.dh, g.ih};
    w = {o_w * (I)g.sw - (I)g.pw, (I)(K ? K : g.kw), (I)g.dw, g.iw};
  }
  // f(pos) for every valid tap, row-major (see walk_row_major).
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    walk_row_major<K, K>(d, h, w, f);
  }
  // The separable sum of term(pos) over the valid taps (see sum_separable).
  template <typename A, typename F>
  __device__ __forceinline__ A sum(I o_d, I o_h, I o_w, const F& term, A zero,
                                   long long& count) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    return sum_separable<K, K>(d, h, w, term, zero, count);
  }
};

// Adaptive windows: output o of a dim of input size n pooled to m spans
// [floor(o*n/m), ceil((o+1)*n/m)), never empty, in integer arithmetic of I (the host picks
// long long when (m + 1) * n does not fit in int). Every tap is valid.
template <typename I>
__device__ __forceinline__ TapLine<I> adaptive_line(I o, I n, I m) {
  const I start = (o * n) / m;
  const I end = ((o + 1) * n + m - 1) / m;
  return {start, end - start, (I)1, n};
}

template <typename I>
struct AdaptiveTaps {
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I o_d, I o_h, I o_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    d = adaptive_line<I>(o_d, g.id, g.od);
    h = adaptive_line<I>(o_h, g.ih, g.oh);
    w = adaptive_line<I>(o_w, g.iw, g.ow);
  }
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    walk_row_major<0, 0>(d, h, w, f);
  }
  template <typename A, typename F>
  __device__ __forceinline__ A sum(I o_d, I o_h, I o_w, const F& term, A zero,
                                   long long& count) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    return sum_separable<0, 0>(d, h, w, term, zero, count);
  }
};

// Accumulators and terms the walks feed, one tap position at a time.

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

// The summed term of a tap in A (float for half): x (LP false) or |x|**p (LP true; p == 1 and
// p == 2 without pow).
template <typename T, typename I, bool LP>
struct TapTerm {
  typedef typename Num<T>::acc A;
  const T* __restrict__ xp;
  I cs;
  A p;
  __device__ __forceinline__ A operator()(I pos) const {
    A v = Num<T>::load(xp[pos * cs]);
    if (LP) {
      v = fabs(v);
      if (p == (A)2) {
        v = v * v;
      } else if (p != (A)1) {
        v = pow(v, p);
      }
    }
    return v;
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
