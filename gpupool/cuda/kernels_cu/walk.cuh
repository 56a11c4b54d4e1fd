// Window walks: the taps of a sliding or adaptive window, per dim (TapLine), visited in
// row-major order or summed in the nested orders of the NumPy backend (the forward's
// separable sums; the backward kernels walk lines of windows the same way).
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

// Nested sums over three lines, the shape of every float sum of the NumPy backend: the sum
// over l0's positions of the sums over l1's of the sums over l2's of term(at(p0, p1, p2)),
// each sum starting from `zero`; positions outside a line's [0, size) are skipped and `count`
// gets the number of terms. N0, N1: the trip counts of l0 and l1 when compiled in (0: l0.n,
// l1.n).
template <int N0, int N1, typename A, typename I, typename At, typename F>
__device__ __forceinline__ A sum_nested(const TapLine<I>& l0, const TapLine<I>& l1,
                                        const TapLine<I>& l2, const At& at, const F& term,
                                        A zero, long long& count) {
  const I n0 = N0 ? (I)N0 : l0.n;
  const I n1 = N1 ? (I)N1 : l1.n;
  A sum0 = zero;
  count = 0;
#pragma unroll
  for (I a = 0; a < n0; ++a) {
    const I p0 = l0.first + a * l0.step;
    if (p0 < 0 || p0 >= l0.size) continue;
    A sum1 = zero;
#pragma unroll
    for (I b = 0; b < n1; ++b) {
      const I p1 = l1.first + b * l1.step;
      if (p1 < 0 || p1 >= l1.size) continue;
      A sum2 = zero;
      for (I c = 0; c < l2.n; ++c) {
        const I p2 = l2.first + c * l2.step;
        if (p2 < 0 || p2 >= l2.size) continue;
        sum2 += term(at(p0, p1, p2));
        ++count;
      }
      sum1 += sum2;
    }
    sum0 += sum1;
  }
  return sum0;
}

// The flat position in a (D, H, W) plane of W, H and D positions (pw, ph, pd).
template <typename I>
struct PlanePosition {
  I hsize, wsize;
  __device__ __forceinline__ I operator()(I pw, I ph, I pd) const {
    return (pd * hsize + ph) * wsize + pw;
  }
};

// Separable order, the NumPy backend's, so that float sums round alike on both backends:
// the sum over W taps of the sums over H taps of the sums over D taps of term(pos), each
// starting from `zero` (-0 for averages: adding -0 leaves every value as it is, so each sum
// starts from its first tap; +0 for Lp terms, which are never negative, so that an empty
// window sums to +0). `count` gets the number of valid taps.
template <int NH, int NW, typename A, typename I, typename F>
__device__ __forceinline__ A sum_separable(const TapLine<I>& d, const TapLine<I>& h,
                                           const TapLine<I>& w, const F& term, A zero,
                                           long long& count) {
  return sum_nested<NW, NH>(w, h, d, PlanePosition<I>{h.size, w.size}, term, zero, count);
}

// Number of taps t in [0, k) of output o whose position o*s - pb + t*d lies in [lo, hi).
template <typename I>
__device__ __forceinline__ int count_taps(I o, int s, int pb, int k, int d, I lo, I hi) {
  const I first = o * (I)s - (I)pb;
  int n = 0;
  for (int t = 0; t < k; ++t) {
    const I pos = first + (I)t * (I)d;
    n += (pos >= lo && pos < hi) ? 1 : 0;
  }
  return n;
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
