// Adaptive max (values only, and with int64 indices) and adaptive average pooling, over the
// windows of gp::AdaptiveTaps (never empty). The launch reuses gp::Geo (kernel, stride, pad
// and dilation fields unused, passed as 0): one thread per output through the thread maps of
// thread_map.cuh, or (the *_lanes kernels, NCHW) a group of lanes per output.
#include "accumulate.cuh"
#include "geometry.cuh"
#include "reduce.cuh"
#include "thread_map.cuh"
#include "traits.cuh"
#include "walk.cuh"

namespace gp {

// The lane-group launches (NCHW): grid x = ceil(outputs / (GP_BLOCK_THREADS / L)), block (L,
// GP_BLOCK_THREADS / L), L a power of two from 4 to 32: threadIdx.x is the lane, threadIdx.y
// the group's output within the block. Calls f(xp, d, h, w, oi, live) once per thread: xp the
// output's plane, d, h, w its window's lines, live false for a group past the last output,
// which walks output 0 and stores nothing (every lane of a warp takes part in its shuffles).
template <typename I, typename T, typename F>
__device__ __forceinline__ void for_lane_groups(const Geo<I>& g, const T* __restrict__ x, F f) {
  const I plane_outputs = g.od * g.oh * g.ow;
  const I oi = (I)blockIdx.x * (I)blockDim.y + (I)threadIdx.y;
  const bool live = oi < g.planes * plane_outputs;
  const I o = live ? oi : (I)0;
  const I plane = o / plane_outputs;
  const I o_dhw = o - plane * plane_outputs;
  const I o_dh = o_dhw / g.ow;
  const I o_d = o_dh / g.oh;
  TapLine<I> d, h, w;
  AdaptiveTaps<I>{g}.lines(o_d, o_dh - o_d * g.oh, o_dhw - o_dh * g.ow, d, h, w);
  f(x + plane * (g.id * g.ih * g.iw), d, h, w, oi, live);
}

// The passes of a lane group over its window's columns: lane l takes column c0 + l of the
// pass from column c0 (none past the window's last), every lane of the warp in every pass
// (as many as the widest window of its groups needs). pass(c, on) per pass, c the lane's
// column, on whether the window has it.
template <typename I, typename P>
__device__ __forceinline__ void column_passes(const TapLine<I>& w, P pass) {
  for (I c0 = 0; __any_sync(0xffffffffu, c0 < w.n); c0 += (I)blockDim.x) {
    const I c = c0 + (I)threadIdx.x;
    pass(c, c < w.n);
  }
}

// Adaptive max over a lane group: each lane the max of its columns (each walked in row-major
// order, 8 rows' loads at a time, then merged by position), then a shuffle tree over the group's lanes merging by
// position, so that every lane holds the max of one row-major walk over the window (the last
// NaN, else the first tap holding the max) and its plane position.
template <typename T, typename I, bool IDX>
__device__ __forceinline__ void max_lanes(const T* __restrict__ x, T* __restrict__ out,
                                          long long* __restrict__ indices, const Geo<I>& g) {
  typedef MaxOfTaps<T, I, true> Acc;
  const AdaptiveTaps<I> taps{g};
  for_lane_groups<I>(g, x, [&](const T* __restrict__ xp, const TapLine<I>& d,
                               const TapLine<I>& h, const TapLine<I>& w, I oi, bool live) {
    Acc best(xp, (I)1);
    column_passes<I>(w, [&](I c, bool on) {
      if (!on) return;
      const I col = w.first + c;
      TapLine<I> lines[3];
      taps.column(d, h, lines);
      Acc acc(xp + col, g.iw);
      walk_row_major_batched<1, 0, 0, 8>(&lines[0], &lines[1], &lines[2], &acc, 1);
      best.merge(acc.m, acc.best * g.iw + col);
    });
#pragma unroll 1
    for (int off = (int)blockDim.x / 2; off > 0; off /= 2) {
      const typename Acc::A m = shfl_xor(best.m, off, (int)blockDim.x);
      const I at = shfl_xor(best.best, off, (int)blockDim.x);
      best.merge(m, at);
    }
    if (live && threadIdx.x == 0) {
      out[oi] = Num<T>::store(best.m);
      if (IDX) indices[oi] = (long long)best.best;
    }
  });
}

}  // namespace gp

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

// Adaptive max over lane groups, values only (geometry: gp::for_lane_groups).
template <typename T, typename I>
__global__ void adaptive_max_lanes(const T* __restrict__ x, T* __restrict__ out,
                                   GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_lanes<T, I, false>(x, out, nullptr, g);
}

// Adaptive max over lane groups, with int64 indices (geometry: gp::for_lane_groups).
template <typename T, typename I>
__global__ void adaptive_max_indices_lanes(const T* __restrict__ x, T* __restrict__ out,
                                           long long* __restrict__ indices, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_lanes<T, I, true>(x, out, indices, g);
}

// Adaptive average of the window (gp::AdaptiveTaps::sum) over its tap
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

// Adaptive average over lane groups (geometry: gp::for_lane_groups): each lane sums its
// column (gp::AdaptiveTaps::column, 8 rows' loads at a time), then the group adds the column sums in column order, as
// gp::sum_separable adds them (a lane without a column adds -0, which changes no sum).
template <typename T, typename I>
__global__ void adaptive_avg_lanes(const T* __restrict__ x, T* __restrict__ out,
                                   GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::AdaptiveTaps<I> taps{g};
  gp::for_lane_groups<I>(g, x, [&](const T* __restrict__ xp, const gp::TapLine<I>& d,
                                   const gp::TapLine<I>& h, const gp::TapLine<I>& w, I oi,
                                   bool live) {
    A sum = (A)-0.0;
    gp::column_passes<I>(w, [&](I c, bool on) {
      A col = (A)-0.0;
      if (on) {
        gp::TapLine<I> lines[3];
        taps.column(d, h, lines);
        long long taken;
        col = gp::sum_separable<0, 0, 8>(lines[0], lines[1], lines[2],
                                      gp::TapTerm<T, I, false>{xp + w.first + c, g.iw, (A)1},
                                      (A)-0.0, taken);
      }
#pragma unroll 1
      for (int j = 0; j < (int)blockDim.x; ++j) {
        sum += __shfl_sync(0xffffffffu, col, j, (int)blockDim.x);
      }
    });
    if (live && threadIdx.x == 0) out[oi] = gp::Num<T>::store(sum / (A)(d.n * h.n * w.n));
  });
}
