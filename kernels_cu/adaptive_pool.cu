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

// The lane-group launches (NCHW, one D tap): grid x = ceil(outputs / (GP_BLOCK_THREADS /
// L)), block (L, GP_BLOCK_THREADS / L), L a power of two from 2 to 32: threadIdx.x is the
// lane, threadIdx.y the group's output within the block. The plane's output count, od, oh
// and ow divide by gp::Divider (by_*: their magic numbers from the host). Calls f(xp, h, w,
// oi, live) once per thread: xp the output's plane, h, w its window's lines, live false for a
// group past the last output, which walks output 0 and stores nothing (every lane of a warp
// takes part in its shuffles).
template <typename I>
struct LaneDividers {
  Divider<I> outputs, oh, ow;
};

template <typename I, typename T, typename F>
__device__ __forceinline__ void for_lane_groups(const Geo<I>& g, const LaneDividers<I>& by,
                                                const T* __restrict__ x, F f) {
  const I oi = (I)blockIdx.x * (I)blockDim.y + (I)threadIdx.y;
  const bool live = oi < g.planes * by.outputs.d;
  const I o = live ? oi : (I)0;
  const I plane = by.outputs.div(o);
  const I o_hw = o - plane * by.outputs.d;
  const I o_h = by.ow.div(o_hw);
  f(x + plane * (g.ih * g.iw), adaptive_line<I>(o_h, g.ih, by.oh),
    adaptive_line<I>(o_hw - o_h * g.ow, g.iw, by.ow), oi, live);
}

// The passes of a lane group over its window's columns, two per lane: lane l takes columns
// c0 + 2l and c0 + 2l + 1 of the pass from column c0, every lane of the warp in every pass (as
// many as the widest window of its groups needs). pass(c) per pass, c the lane's first column.
template <typename I, typename P>
__device__ __forceinline__ void column_passes(const TapLine<I>& w, P pass) {
  for (I c0 = 0; __any_sync(0xffffffffu, c0 < w.n); c0 += 2 * (I)blockDim.x) {
    pass(c0 + 2 * (I)threadIdx.x);
  }
}

// Adaptive max over a lane group: each lane the max of each of its columns (R rows at a time,
// gp::AdaptiveTaps::column_pair), merged by position, then a shuffle tree over the group's
// lanes merging by position, so that every lane holds the max of one row-major walk over the
// window (the last NaN, else the first tap holding the max) and its plane position.
template <typename T, typename I, bool IDX, int R>
__device__ __forceinline__ void max_lanes(const T* __restrict__ x, T* __restrict__ out,
                                          long long* __restrict__ indices, const Geo<I>& g,
                                          const LaneDividers<I>& by) {
  typedef MaxOfTaps<T, I, true> Acc;
  const AdaptiveTaps<I> taps{g};
  const T lowest = Num<T>::store(Num<T>::lowest());
  for_lane_groups<I>(g, by, x, [&](const T* __restrict__ xp, const TapLine<I>& h,
                                   const TapLine<I>& w, I oi, bool live) {
    Acc best(xp, (I)1);
    const I row1 = (h.first + 1) * g.iw;  // a column's first tap lies before it
    column_passes<I>(w, [&](I c) {
      Acc acc[2] = {Acc(xp, (I)1), Acc(xp, (I)1)};
      taps.template column_pair<R>(xp, h, w, c, lowest, [&](int k, T v, I pos, bool ok) {
        acc[k].take_slot(v, pos, ok && pos < row1);
      });
      best.merge(acc[0].m, acc[0].best);
      best.merge(acc[1].m, acc[1].best);
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

// The lane-group kernels' parameters after the geometry: gp::Divider magic numbers of the
// plane's output count, oh and ow (gp::for_lane_groups).
#define GP_LANE_PARAMS long long by_outputs, long long by_oh, long long by_ow
#define GP_LANE_DIVIDERS(I)                                                                    \
  const gp::LaneDividers<I> by = {{od * oh * ow, by_outputs}, {oh, by_oh}, {ow, by_ow}}

// Adaptive max over lane groups, values only (geometry: gp::for_lane_groups; R rows of a
// column loaded at a time).
template <typename T, typename I, int R>
__global__ void adaptive_max_lanes(const T* __restrict__ x, T* __restrict__ out,
                                   GP_GEO_PARAMS(I), GP_LANE_PARAMS) {
  GP_GEO(I);
  GP_LANE_DIVIDERS(I);
  gp::max_lanes<T, I, false, R>(x, out, nullptr, g, by);
}

// Adaptive max over lane groups, with int64 indices (as adaptive_max_lanes).
template <typename T, typename I, int R>
__global__ void adaptive_max_indices_lanes(const T* __restrict__ x, T* __restrict__ out,
                                           long long* __restrict__ indices, GP_GEO_PARAMS(I),
                                           GP_LANE_PARAMS) {
  GP_GEO(I);
  GP_LANE_DIVIDERS(I);
  gp::max_lanes<T, I, true, R>(x, out, indices, g, by);
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

// Adaptive average over lane groups (as adaptive_max_lanes): each lane sums each of its
// columns over the rows (gp::AdaptiveTaps::column_pair), then the group adds the column sums
// in column order, as gp::sum_separable adds them (a column past the window's last adds -0,
// which changes no sum).
template <typename T, typename I, int R>
__global__ void adaptive_avg_lanes(const T* __restrict__ x, T* __restrict__ out,
                                   GP_GEO_PARAMS(I), GP_LANE_PARAMS) {
  GP_GEO(I);
  GP_LANE_DIVIDERS(I);
  typedef typename gp::Num<T>::acc A;
  const gp::AdaptiveTaps<I> taps{g};
  gp::for_lane_groups<I>(g, by, x, [&](const T* __restrict__ xp, const gp::TapLine<I>& h,
                                       const gp::TapLine<I>& w, I oi, bool live) {
    A sum = (A)-0.0;
    gp::column_passes<I>(w, [&](I c) {
      A col[2] = {(A)-0.0, (A)-0.0};
      taps.template column_pair<R>(xp, h, w, c, T(-0.0f), [&](int k, T v, I, bool) {
        col[k] += gp::Num<T>::load(v);
      });
#pragma unroll 2
      for (int j = 0; j < (int)blockDim.x; ++j) {
        sum += __shfl_sync(0xffffffffu, col[0], j, (int)blockDim.x);
        sum += __shfl_sync(0xffffffffu, col[1], j, (int)blockDim.x);
      }
    });
    if (live && threadIdx.x == 0) out[oi] = gp::Num<T>::store(sum / (A)(h.n * w.n));
  });
}
