// Thread-to-output maps of the window and adaptive kernels: which outputs of which plane each
// thread computes, for NCHW and NHWC launches.
#pragma once
#include "geometry.cuh"

namespace gp {

// for_outputs_nchw / for_outputs_nhwc call
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

}  // namespace gp
