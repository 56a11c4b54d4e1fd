// Adaptive max (values only, and with int64 indices) and adaptive average pooling.
// Output o along a dim of input size n pooled to m spans [floor(o*n/m), ceil((o+1)*n/m)),
// computed in integer arithmetic of the index type I (the host picks long long when
// (m + 1) * n does not fit in int). Windows are never empty.
//
// The launch reuses gp::Geo (kernel/stride/pad/dilation fields unused, passed as 0) and the
// thread maps of common.cuh.
#include "common.cuh"

namespace gp {

template <typename I>
__device__ __forceinline__ void adaptive_bounds(I o, I n, I m, I& start, I& end) {
  start = (o * n) / m;
  end = ((o + 1) * n + m - 1) / m;
}

// Max (and with IDX the flat spatial position of the winner) over the adaptive window of
// (o_d, o_h, o_w), same NaN / tie rules as max pooling.
template <typename T, typename I, bool IDX>
__device__ __forceinline__ void adaptive_max_window(const T* __restrict__ xp, I cs,
                                                    const Geo<I>& g, I o_d, I o_h, I o_w,
                                                    typename Num<T>::acc& m_out, I& best_out) {
  typedef typename Num<T>::acc A;
  I d0, d1, h0, h1, w0, w1;
  adaptive_bounds<I>(o_d, g.id, g.od, d0, d1);
  adaptive_bounds<I>(o_h, g.ih, g.oh, h0, h1);
  adaptive_bounds<I>(o_w, g.iw, g.ow, w0, w1);
  A m = Num<T>::lowest();
  I best = -1;
  for (I d = d0; d < d1; ++d) {
    for (I h = h0; h < h1; ++h) {
      const I rowbase = (d * g.ih + h) * g.iw;
      for (I w = w0; w < w1; ++w) {
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

// Adaptive max, values only. Geometry: see gp::for_outputs_nchw / gp::for_outputs_nhwc
// (grid x = spatial chunks, y/z = planes; block (TX, TY); one thread = `rows` outputs).
template <typename T, typename I, bool NHWC>
__global__ void adaptive_max(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    typename gp::Num<T>::acc m;
    I best;
    gp::adaptive_max_window<T, I, false>(xp, cs, g, o_d, o_h, o_w, m, best);
    out[oi] = gp::Num<T>::store(m);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Adaptive max with int64 indices. Geometry as adaptive_max.
template <typename T, typename I, bool NHWC>
__global__ void adaptive_max_indices(const T* __restrict__ x, T* __restrict__ out,
                                     long long* __restrict__ indices, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    typename gp::Num<T>::acc m;
    I best;
    gp::adaptive_max_window<T, I, true>(xp, cs, g, o_d, o_h, o_w, m, best);
    out[oi] = gp::Num<T>::store(m);
    indices[oi] = (long long)best;
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Adaptive average: the mean of the window. Geometry as adaptive_max.
template <typename T, typename I, bool NHWC>
__global__ void adaptive_avg(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    I d0, d1, h0, h1, w0, w1;
    gp::adaptive_bounds<I>(o_d, g.id, g.od, d0, d1);
    gp::adaptive_bounds<I>(o_h, g.ih, g.oh, h0, h1);
    gp::adaptive_bounds<I>(o_w, g.iw, g.ow, w0, w1);
    A s = 0;
    for (I d = d0; d < d1; ++d) {
      for (I h = h0; h < h1; ++h) {
        const I rowbase = (d * g.ih + h) * g.iw;
        for (I w = w0; w < w1; ++w) {
          s += gp::Num<T>::load(xp[(rowbase + w) * cs]);
        }
      }
    }
    const A count = (A)((d1 - d0) * (h1 - h0)) * (A)(w1 - w0);
    out[oi] = gp::Num<T>::store(s / count);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}
