// Segmented reductions, the bodies of the global pooling kernels (float in global_pool.cu,
// quantized in quantized_pool.cu): many short segments with a group of L lanes each, long
// segments with one block per (segment, chunk), channels-last segments with threads along the
// channels. What is reduced comes from a reduction R:
//   R::In, R::Out, R::Acc      element types read and written, accumulator type
//   Acc r.identity()           the start value
//   Acc r.load(In v)           the term of one element
//   Acc r.combine(Acc, Acc)    the operator
//   Out r.store(Acc)           the value written for a reduced segment (or chunk)
// A segment split in chunks writes one partial per (segment, chunk); a second launch reduces
// the partials with another R.
#pragma once
#include "geometry.cuh"
#include "reduce.cuh"
#include "traits.cuh"

namespace gp {

// The two 2-byte elements of a 4-byte word (little-endian: the low half first).
__device__ __forceinline__ void split_word(unsigned w, __half& lo, __half& hi) {
  lo = __ushort_as_half((unsigned short)(w & 0xffffu));
  hi = __ushort_as_half((unsigned short)(w >> 16));
}
__device__ __forceinline__ void split_word(unsigned w, __nv_bfloat16& lo, __nv_bfloat16& hi) {
  lo = __ushort_as_bfloat16((unsigned short)(w & 0xffffu));
  hi = __ushort_as_bfloat16((unsigned short)(w >> 16));
}
__device__ __forceinline__ void split_word(unsigned w, short& lo, short& hi) {
  lo = (short)(unsigned short)(w & 0xffffu);
  hi = (short)(unsigned short)(w >> 16);
}

// Many small contiguous segments (NCHW planes up to about 32 * L elements, e.g. 7x7).
// grid: x = ceil(nseg / (blockDim.x / L)). block: 256 threads (a multiple of 32). thread: lane
// `threadIdx.x % L` of an aligned group of L lanes that reduces segment
// (blockIdx.x * blockDim.x + threadIdx.x) / L, reading elements lane, lane + L, ... (so one
// warp-wide load covers 32 / L segments' runs, contiguous), then a shuffle tree of width L.
// 2-byte elements go in pairs, one 4-byte word (split_word), from the segment's first 4-byte
// aligned element: lane takes pairs lane, lane + L, ... (low, then high element), lane 0 also
// an unaligned first element and lane L - 1 an unpaired last one (both loaded before the
// pairs, combined after them).
// A lane's loads go in batches of LANE_BATCH elements (predicated past the end), all started
// before any is combined; a slot past the end combines r.identity(), which leaves the lane's
// value as it is (a sum starts from +0 and so is never -0; max never takes the lowest value),
// so the combines are those of a loop over the lane's elements, in its order.
// Groups past the last segment still take part in the shuffles (full-warp masks) and write
// nothing.
// Elements per lane per batch: below 32 lanes the planner gives a lane at most 8 2-byte or
// 4 wider elements, so one batch covers them.
template <int L, typename R, typename I>
__device__ __forceinline__ void reduce_lanes(const R& r, const typename R::In* __restrict__ x,
                                             typename R::Out* __restrict__ out, I nseg,
                                             I seglen) {
  constexpr int LANE_BATCH = 8;
  typedef typename R::Acc A;
  typedef typename R::In In;
  const I seg = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) / (I)L;
  const int lane = (int)(threadIdx.x % L);
  A acc = r.identity();
  if (seg < nseg) {
    const In* __restrict__ xs = x + seg * seglen;
    if constexpr (sizeof(In) == 2) {
      constexpr int B = LANE_BATCH / 2;
      const I head = ((unsigned long long)xs & 2) ? 1 : 0;
      const I npairs = (seglen - head) / 2;
      const unsigned* __restrict__ xw = reinterpret_cast<const unsigned*>(xs + head);
      const bool first = head && lane == 0;
      const bool last = head + 2 * npairs < seglen && lane == L - 1;
      In ends[2] = {In(), In()};
      if (first) ends[0] = xs[0];
      if (last) ends[1] = xs[seglen - 1];
#pragma unroll 1
      for (I i0 = lane; i0 < npairs; i0 += (I)(B * L)) {
        unsigned w[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {
          w[b] = 0;
          if (i0 + (I)(b * L) < npairs) w[b] = xw[i0 + (I)(b * L)];
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const bool ok = i0 + (I)(b * L) < npairs;
          In lo, hi;
          split_word(w[b], lo, hi);
          acc = r.combine(r.combine(acc, ok ? r.load(lo) : r.identity()),
                          ok ? r.load(hi) : r.identity());
        }
      }
      if (first) acc = r.combine(acc, r.load(ends[0]));
      if (last) acc = r.combine(acc, r.load(ends[1]));
    } else {
      constexpr int B = LANE_BATCH;
#pragma unroll 1
      for (I i0 = lane; i0 < seglen; i0 += (I)(B * L)) {
        In v[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {
          v[b] = In();
          if (i0 + (I)(b * L) < seglen) v[b] = xs[i0 + (I)(b * L)];
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
          acc = r.combine(acc, i0 + (I)(b * L) < seglen ? r.load(v[b]) : r.identity());
        }
      }
    }
  }
  acc = group_reduce<L>(acc, r);
  if (seg < nseg && lane == 0) out[seg] = r.store(acc);
}

// Large contiguous segments, optionally split in chunks (then out holds one partial per
// (segment, chunk)).
// grid: x = nseg * nchunks (virtual segment v = seg * nchunks + chunk). block: 256 threads.
// thread: elements chunk*chunklen + threadIdx.x + k*blockDim.x of its segment (below seglen),
// then a warp shuffle tree and one warp over the per-warp results in shared memory.
template <typename R, typename I>
__device__ __forceinline__ void reduce_block(const R& r, const typename R::In* __restrict__ x,
                                             typename R::Out* __restrict__ out, I nseg,
                                             I seglen, I nchunks, I chunklen) {
  typedef typename R::Acc A;
  __shared__ A warp_acc[32];
  const I v = (I)blockIdx.x;
  if (v >= nseg * nchunks) return;  // uniform over the block
  const I seg = v / nchunks;
  const I chunk = v - seg * nchunks;
  const I begin = chunk * chunklen;
  const I end = begin + chunklen < seglen ? begin + chunklen : seglen;
  const typename R::In* __restrict__ xs = x + seg * seglen;
  A acc = r.identity();
#pragma unroll 4
  for (I i = begin + (I)threadIdx.x; i < end; i += (I)blockDim.x) {
    acc = r.combine(acc, r.load(xs[i]));
  }
  acc = group_reduce<32>(acc, r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_acc[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x / 32) ? warp_acc[lane] : r.identity();
    acc = group_reduce<32>(acc, r);
    if (lane == 0) out[v] = r.store(acc);
  }
}

// Channels-last segments: x viewed as (batch, seglen, chans), one result per (batch, chans),
// optionally split along seglen in chunks (then partials (batch, nchunks, chans)).
// grid: x = channel chunks of blockDim.x, y/z = batch * nchunks (virtual v = b * nchunks +
// chunk). block: (TX along channels, TY along positions), TX * TY <= 256. thread: channel c,
// positions chunk*chunklen + threadIdx.y + k*TY; the TY partials of a channel are combined in
// shared memory by threadIdx.y == 0.
template <typename R, typename I>
__device__ __forceinline__ void reduce_channels(const R& r,
                                                const typename R::In* __restrict__ x,
                                                typename R::Out* __restrict__ out, I nbatch,
                                                I seglen, I chans, I nchunks, I chunklen) {
  typedef typename R::Acc A;
  __shared__ A part[GP_BLOCK_THREADS];
  const long long vv = block_plane();
  if (vv >= (long long)nbatch * (long long)nchunks) return;  // uniform over the block
  const I v = (I)vv;
  const I b = v / nchunks;
  const I chunk = v - b * nchunks;
  const I c = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  const I begin = chunk * chunklen;
  const I end = begin + chunklen < seglen ? begin + chunklen : seglen;
  A acc = r.identity();
  if (c < chans) {
    const typename R::In* __restrict__ xs = x + b * seglen * chans + c;
#pragma unroll 4
    for (I s = begin + (I)threadIdx.y; s < end; s += (I)blockDim.y) {
      acc = r.combine(acc, r.load(xs[s * chans]));
    }
  }
  part[threadIdx.y * blockDim.x + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < chans) {
    for (unsigned j = 1; j < blockDim.y; ++j) {
      acc = r.combine(acc, part[j * blockDim.x + threadIdx.x]);
    }
    out[v * chans + c] = r.store(acc);
  }
}

}  // namespace gp
