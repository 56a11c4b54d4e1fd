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

}  // namespace gp

// Average pooling. The divisor is divisor_override when > 0, else the product over dims of the
// taps inside [-pad_begin, size + pad_end) (include_pad) or inside [0, size); an empty window
// (divisor 0) gives 0. ped/peh/pew are the end pads.
// Geometry: see gp::for_outputs_nchw / gp::for_outputs_nhwc (grid x = spatial chunks,
// y/z = plane groups; block (TX, TY, TZ planes); one thread = `rows` outputs).
template <typename T, typename I, int K, bool NHWC>
__global__ void avg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                         int ped, int peh, int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::WindowTaps<K, I> taps{g};
  gp::for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    gp::SumOfTaps<T, I, false> acc(xp, cs, (A)1);
    taps(o_d, o_h, o_w, acc);
    long long divisor = divisor_override;
    if (divisor <= 0) {
      const I lod = include_pad ? -(I)g.pd : (I)0, hid = include_pad ? g.id + (I)ped : g.id;
      const I loh = include_pad ? -(I)g.ph : (I)0, hih = include_pad ? g.ih + (I)peh : g.ih;
      const I low = include_pad ? -(I)g.pw : (I)0, hiw = include_pad ? g.iw + (I)pew : g.iw;
      divisor = (long long)gp::count_taps<I>(o_d, g.sd, g.pd, g.kd, g.dd, lod, hid) *
                gp::count_taps<I>(o_h, g.sh, g.ph, g.kh, g.dh, loh, hih) *
                gp::count_taps<I>(o_w, g.sw, g.pw, g.kw, g.dw, low, hiw);
    }
    out[oi] = gp::Num<T>::store(divisor > 0 ? acc.s / (A)divisor : (A)0);
  });
}

// Lp pooling: (sum over the valid taps of |x|**p) ** (1/p), p > 0 finite (A is float for
// half and float, double for double). Geometry as avg_pool.
template <typename T, typename I, int K, bool NHWC>
__global__ void lp_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                        typename gp::Num<T>::acc p) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::WindowTaps<K, I> taps{g};
  gp::for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    gp::SumOfTaps<T, I, true> acc(xp, cs, p);
    taps(o_d, o_h, o_w, acc);
    A r;
    if (p == (A)1) {
      r = acc.s;
    } else if (p == (A)2) {
      r = sqrt(acc.s);
    } else {
      r = pow(acc.s, (A)1 / p);
    }
    out[oi] = gp::Num<T>::store(r);
  });
}
