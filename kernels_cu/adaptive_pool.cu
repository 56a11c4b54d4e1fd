// Adaptive max (values only, and with int64 indices) and adaptive average pooling, over the
// windows of gp::AdaptiveTaps (never empty). The launch reuses gp::Geo (kernel, stride, pad
// and dilation fields unused, passed as 0) and the thread maps of thread_map.cuh.
#include "accumulate.cuh"
#include "geometry.cuh"
#include "thread_map.cuh"
#include "traits.cuh"
#include "walk.cuh"

// Adaptive max, values only, over gp::AdaptiveTaps (same NaN / tie rules as max pooling).
// Geometry: see gp::for_outputs_nchw / gp::for_outputs_nhwc (grid x = spatial chunks, y/z =
// plane groups; block (TX, TY, TZ planes); one thread = `rows` outputs).
template <typename T, typename I, bool NHWC>
__global__ void adaptive_max(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_outputs<T, I, false, NHWC>(x, out, nullptr, gp::AdaptiveTaps<I>{g}, g);
}

// Adaptive max with int64 indices. Geometry as adaptive_max.
template <typename T, typename I, bool NHWC>
__global__ void adaptive_max_indices(const T* __restrict__ x, T* __restrict__ out,
                                     long long* __restrict__ indices, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_outputs<T, I, true, NHWC>(x, out, indices, gp::AdaptiveTaps<I>{g}, g);
}

// Adaptive average: the separable sum of the window (gp::AdaptiveTaps::sum) over its tap
// count. Geometry as adaptive_max.
template <typename T, typename I, bool NHWC>
__global__ void adaptive_avg(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::AdaptiveTaps<I> taps{g};
  gp::for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    long long count;
    const A s = taps.sum(o_d, o_h, o_w, gp::TapTerm<T, I, false>{xp, cs, (A)1}, (A)-0.0, count);
    out[oi] = gp::Num<T>::store(s / (A)count);
  });
}
