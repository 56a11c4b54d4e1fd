// Window walks: the taps of a sliding or adaptive window, per dim (TapLine), visited in
// row-major order or summed in the separable order of the NumPy backend.
#pragma once
#include "geometry.cuh"

namespace gp {

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

}  // namespace gp
