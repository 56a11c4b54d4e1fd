// Global max / average pooling as segmented reductions.
//
// Template parameters: IS_MAX (max with PyTorch's NaN rule, else sum); Tin, Tout input and
// output element types (equal, except for the float partial sums of a half average split in
// two passes); I index type (int or long long, chosen on the host); L lanes per segment.
// The reduction runs in A = Num<Tin>::acc. An average sums each value times `scale` (1/count
// in the pass over the input, 1 over partial sums), so a mean of values near the largest
// float stays finite, as on the CPU; max ignores `scale`.
#include "common.cuh"

namespace gp {

template <bool IS_MAX, typename A>
__device__ __forceinline__ A identity() {
  return IS_MAX ? Num<A>::lowest() : (A)0;
}

// One input value as the reduction takes it: itself for max, times `scale` for an average.
template <bool IS_MAX, typename A>
__device__ __forceinline__ A term(A v, A scale) {
  return IS_MAX ? v : v * scale;
}

template <typename Tout, typename A>
__device__ __forceinline__ Tout finish(A v) {
  typedef typename Num<Tout>::acc B;
  return Num<Tout>::store((B)v);
}

}  // namespace gp

// Many small contiguous segments (NCHW planes up to about 32 * L elements, e.g. 7x7).
// grid: x = ceil(nseg / (blockDim.x / L)). block: 256 threads (a multiple of 32). thread: lane
// `threadIdx.x % L` of an aligned group of L lanes that reduces segment
// (blockIdx.x * blockDim.x + threadIdx.x) / L, reading elements lane, lane + L, ... (so one
// warp-wide load covers 32 / L segments' runs, contiguous), then a shuffle tree of width L.
// Groups past the last segment still take part in the shuffles (full-warp masks) and write
// nothing.
template <bool IS_MAX, typename Tin, typename Tout, typename I, int L>
__global__ void global_lanes(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                             I seglen, typename gp::Num<Tin>::acc scale) {
  typedef typename gp::Num<Tin>::acc A;
  const I seg = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) / (I)L;
  const int lane = (int)(threadIdx.x % L);
  A acc = gp::identity<IS_MAX, A>();
  if (seg < nseg) {
    const Tin* __restrict__ xs = x + seg * seglen;
#pragma unroll 4
    for (I i = lane; i < seglen; i += L) {
      acc = gp::combine<IS_MAX>(acc, gp::term<IS_MAX>(gp::Num<Tin>::load(xs[i]), scale));
    }
  }
  acc = gp::group_reduce<IS_MAX, L>(acc);
  if (seg < nseg && lane == 0) out[seg] = gp::finish<Tout>(acc);
}

// Large contiguous segments, optionally split in chunks (then out holds one partial per
// (segment, chunk) and a second launch reduces the partials).
// grid: x = nseg * nchunks (virtual segment v = seg * nchunks + chunk). block: 256 threads.
// thread: elements chunk*chunklen + threadIdx.x + k*blockDim.x of its segment (below seglen),
// then a warp shuffle tree and one warp over the per-warp results in shared memory.
template <bool IS_MAX, typename Tin, typename Tout, typename I>
__global__ void global_block(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                             I seglen, I nchunks, I chunklen,
                             typename gp::Num<Tin>::acc scale) {
  typedef typename gp::Num<Tin>::acc A;
  __shared__ A warp_acc[32];
  const I v = (I)blockIdx.x;
  if (v >= nseg * nchunks) return;  // uniform over the block
  const I seg = v / nchunks;
  const I chunk = v - seg * nchunks;
  const I begin = chunk * chunklen;
  const I end = begin + chunklen < seglen ? begin + chunklen : seglen;
  const Tin* __restrict__ xs = x + seg * seglen;
  A acc = gp::identity<IS_MAX, A>();
#pragma unroll 4
  for (I i = begin + (I)threadIdx.x; i < end; i += (I)blockDim.x) {
    acc = gp::combine<IS_MAX>(acc, gp::term<IS_MAX>(gp::Num<Tin>::load(xs[i]), scale));
  }
  acc = gp::group_reduce<IS_MAX, 32>(acc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_acc[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x / 32) ? warp_acc[lane] : gp::identity<IS_MAX, A>();
    acc = gp::group_reduce<IS_MAX, 32>(acc);
    if (lane == 0) out[v] = gp::finish<Tout>(acc);
  }
}

// Channels-last segments: x viewed as (batch, seglen, chans), one result per (batch, chans),
// optionally split along seglen in chunks (then partials (batch, nchunks, chans)).
// grid: x = channel chunks of blockDim.x, y/z = batch * nchunks (virtual v = b * nchunks +
// chunk). block: (TX along channels, TY along positions), TX * TY <= 256. thread: channel c,
// positions chunk*chunklen + threadIdx.y + k*TY; the TY partials of a channel are combined in
// shared memory by threadIdx.y == 0.
template <bool IS_MAX, typename Tin, typename Tout, typename I>
__global__ void global_channels(const Tin* __restrict__ x, Tout* __restrict__ out, I nbatch,
                                I seglen, I chans, I nchunks, I chunklen,
                                typename gp::Num<Tin>::acc scale) {
  typedef typename gp::Num<Tin>::acc A;
  __shared__ A part[256];
  const long long vv = gp::block_plane();
  if (vv >= (long long)nbatch * (long long)nchunks) return;  // uniform over the block
  const I v = (I)vv;
  const I b = v / nchunks;
  const I chunk = v - b * nchunks;
  const I c = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  const I begin = chunk * chunklen;
  const I end = begin + chunklen < seglen ? begin + chunklen : seglen;
  A acc = gp::identity<IS_MAX, A>();
  if (c < chans) {
    const Tin* __restrict__ xs = x + b * seglen * chans + c;
#pragma unroll 4
    for (I s = begin + (I)threadIdx.y; s < end; s += (I)blockDim.y) {
      const A v = gp::Num<Tin>::load(xs[s * chans]);
      acc = gp::combine<IS_MAX>(acc, gp::term<IS_MAX>(v, scale));
    }
  }
  part[threadIdx.y * blockDim.x + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < chans) {
    for (unsigned j = 1; j < blockDim.y; ++j) {
      acc = gp::combine<IS_MAX>(acc, part[j * blockDim.x + threadIdx.x]);
    }
    out[v * chans + c] = gp::finish<Tout>(acc);
  }
}
