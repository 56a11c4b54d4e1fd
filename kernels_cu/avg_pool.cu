// Average and Lp pooling (float dtypes; half accumulates in float).
//
// Template parameters: T element type; I index type (int or long long, chosen on the host);
// K the window size along H and W when both equal K and the host specialised it (0: run time);
// NHWC the layout.
#include "common.cuh"

namespace gp {

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

// Sum over the valid taps of the window of (o_d, o_h, o_w) of f(x) where f is the identity
// (LP false) or |x|**p (LP true; p == 1 and p == 2 without pow).
template <typename T, typename I, int K, bool LP>
__device__ __forceinline__ typename Num<T>::acc sum_window(
    const T* __restrict__ xp, I cs, const Geo<I>& g, I o_d, I o_h, I o_w,
    typename Num<T>::acc p) {
  typedef typename Num<T>::acc A;
  const int kh = K ? K : g.kh;
  const int kw = K ? K : g.kw;
  const I d0 = o_d * (I)g.sd - (I)g.pd;
  const I h0 = o_h * (I)g.sh - (I)g.ph;
  const I w0 = o_w * (I)g.sw - (I)g.pw;
  A s = 0;
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
        A v = Num<T>::load(xp[(rowbase + w) * cs]);
        if (LP) {
          v = fabs(v);
          if (p == (A)2) {
            v = v * v;
          } else if (p != (A)1) {
            v = pow(v, p);
          }
        }
        s += v;
      }
    }
  }
  return s;
}

}  // namespace gp

// Average pooling. The divisor is divisor_override when > 0, else the product over dims of the
// taps inside [-pad_begin, size + pad_end) (include_pad) or inside [0, size); an empty window
// (divisor 0) gives 0. ped/peh/pew are the end pads.
// Geometry: see gp::for_outputs_nchw / gp::for_outputs_nhwc (grid x = spatial chunks,
// y/z = planes; block (TX, TY); one thread = `rows` outputs).
template <typename T, typename I, int K, bool NHWC>
__global__ void avg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                         int ped, int peh, int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    const A s = gp::sum_window<T, I, K, false>(xp, cs, g, o_d, o_h, o_w, (A)1);
    long long divisor = divisor_override;
    if (divisor <= 0) {
      const I lod = include_pad ? -(I)g.pd : (I)0, hid = include_pad ? g.id + (I)ped : g.id;
      const I loh = include_pad ? -(I)g.ph : (I)0, hih = include_pad ? g.ih + (I)peh : g.ih;
      const I low = include_pad ? -(I)g.pw : (I)0, hiw = include_pad ? g.iw + (I)pew : g.iw;
      divisor = (long long)gp::count_taps<I>(o_d, g.sd, g.pd, g.kd, g.dd, lod, hid) *
                gp::count_taps<I>(o_h, g.sh, g.ph, g.kh, g.dh, loh, hih) *
                gp::count_taps<I>(o_w, g.sw, g.pw, g.kw, g.dw, low, hiw);
    }
    out[oi] = gp::Num<T>::store(divisor > 0 ? s / (A)divisor : (A)0);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Lp pooling: (sum over the valid taps of |x|**p) ** (1/p), p > 0 finite (A is float for
// half and float, double for double). Geometry as avg_pool.
template <typename T, typename I, int K, bool NHWC>
__global__ void lp_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                        typename gp::Num<T>::acc p) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    const A s = gp::sum_window<T, I, K, true>(xp, cs, g, o_d, o_h, o_w, p);
    A r;
    if (p == (A)1) {
      r = s;
    } else if (p == (A)2) {
      r = sqrt(s);
    } else {
      r = pow(s, (A)1 / p);
    }
    out[oi] = gp::Num<T>::store(r);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}
