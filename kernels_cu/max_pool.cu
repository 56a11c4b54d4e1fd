// Max pooling (values only, and values + int64 indices) and max unpooling.
//
// Template parameters: T element type; I index type (int when every offset fits in 32 bits,
// long long otherwise: chosen on the host); K the window size along H and W when both equal K
// and the host specialised it (0: read kh/kw at run time); NHWC the layout.
#include "common.cuh"

namespace gp {

// Max over the window of output (o_d, o_h, o_w), taps scanned row-major (D, then H, then W);
// taps outside the input are skipped, so padding never wins. With IDX also the flat position
// (d*IH + h)*IW + w of the winner inside the spatial plane: the first tap holding the max, or
// the last NaN; -1 (and the lowest value) for a window with no valid tap.
template <typename T, typename I, int K, bool IDX>
__device__ __forceinline__ void max_window(const T* __restrict__ xp, I cs, const Geo<I>& g,
                                           I o_d, I o_h, I o_w,
                                           typename Num<T>::acc& m_out, I& best_out) {
  typedef typename Num<T>::acc A;
  const int kh = K ? K : g.kh;
  const int kw = K ? K : g.kw;
  const I d0 = o_d * (I)g.sd - (I)g.pd;
  const I h0 = o_h * (I)g.sh - (I)g.ph;
  const I w0 = o_w * (I)g.sw - (I)g.pw;
  A m = Num<T>::lowest();
  I best = -1;
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
        const A v = Num<T>::load(xp[(rowbase + w) * cs]);
        if (IDX) {
          if (best < 0 || max_takes(v, m)) {
            m = v;
            best = rowbase + w;
          }
        } else if (max_takes(v, m)) {
          m = v;
        }
      }
    }
  }
  m_out = m;
  best_out = best;
}

}  // namespace gp

// Values-only max pooling. Geometry: see gp::for_outputs_nchw / gp::for_outputs_nhwc
// (grid x = spatial chunks, y/z = planes; block (TX, TY); one thread = `rows` outputs).
template <typename T, typename I, int K, bool NHWC>
__global__ void max_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    typename gp::Num<T>::acc m;
    I best;
    gp::max_window<T, I, K, false>(xp, cs, g, o_d, o_h, o_w, m, best);
    out[oi] = gp::Num<T>::store(m);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Max pooling with int64 indices (per-plane flat spatial positions). Geometry as max_pool.
template <typename T, typename I, int K, bool NHWC>
__global__ void max_pool_indices(const T* __restrict__ x, T* __restrict__ out,
                                 long long* __restrict__ indices, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    typename gp::Num<T>::acc m;
    I best;
    gp::max_window<T, I, K, true>(xp, cs, g, o_d, o_h, o_w, m, best);
    out[oi] = gp::Num<T>::store(m);
    indices[oi] = (long long)best;
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Max unpooling scatter into an `out` the host has already zero-filled. Elements move as
// same-sized unsigned words V, so one instantiation serves every dtype of that size; J is the
// dtype of `indices` (already checked to lie in [0, sout) by the host).
// x viewed as (batch, sin, chans) with chans = 1 for NCHW; out as (batch, sout, chans).
// grid: x = enough blocks for n elements (capped; grid-stride loop). block: 256 threads.
// thread: element e of x -> out[((e / (sin*chans)) * sout + indices[e]) * chans + e % chans].
template <typename V, typename J, typename I>
__global__ void max_unpool(const V* __restrict__ x, const J* __restrict__ indices,
                           V* __restrict__ out, I n, I sin, I sout, I chans) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  const I plane_in = sin * chans;
  for (I e = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; e < n; e += step) {
    const I b = e / plane_in;
    const I c = chans == 1 ? (I)0 : e % chans;
    out[(b * sout + (I)indices[e]) * chans + c] = x[e];
  }
}
