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

// Loads a thread starts before it combines any (reduce_lanes, reduce_channels).
enum { LOAD_BATCH = 8 };

// Many small contiguous segments (NCHW planes up to about 32 * L elements, e.g. 7x7).
// grid: x = ceil(nseg / (blockDim.x / L)). block: 256 threads (a multiple of 32). thread: lane
// `threadIdx.x % L` of an aligned group of L lanes that reduces segment
// (blockIdx.x * blockDim.x + threadIdx.x) / L, reading elements lane, lane + L, ... (so one
// warp-wide load covers 32 / L segments' runs, contiguous), then a shuffle tree of width L.
// 2- and 4-byte elements go in fours, one aligned 8- or 16-byte load (a Pack of 4), from the
// segment's first element aligned on a four's size: lane takes fours lane, lane + L, ... (in
// address order); the up to 3 elements before them (head) and the up to 3 after the last
// four (tail) go to lanes 0, 1, 2: lane j loads head element j and tail element j with its
// first batch and combines them after its fours, head first.
// A lane's loads go in batches of LOAD_BATCH elements (in fours: 2 * LOAD_BATCH, LOAD_BATCH
// / 2 loads), all started before any is combined; a slot past the end is neither loaded nor
// combined, so the combines are those of a loop over the lane's elements, in its order.
// Groups past the last segment still take part in the shuffles (full-warp masks) and write
// nothing.
// Elements per lane: below 32 lanes the planner gives a lane at most 16 2- or 4-byte or 4
// wider elements (besides the head and tail), so one batch covers them.
template <int L, typename R, typename I>
__device__ __forceinline__ void reduce_lanes(const R& r, const typename R::In* __restrict__ x,
                                             typename R::Out* __restrict__ out, I nseg,
                                             I seglen) {
  typedef typename R::Acc A;
  typedef typename R::In In;
  const I seg = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) / (I)L;
  const int lane = (int)(threadIdx.x % L);
  A acc = r.identity();
  if (seg < nseg) {
    const In* __restrict__ xs = x + seg * seglen;
    if constexpr (sizeof(In) == 2 || sizeof(In) == 4) {
      static_assert(L >= 3, "the head and tail elements take lanes 0, 1, 2");
      constexpr int B = LOAD_BATCH / 2;
      typedef Pack<In, 4> Four;
      typedef typename Word<sizeof(Four)>::type Q;
      const I misalign = (I)(((unsigned long long)xs & (sizeof(Four) - 1)) / sizeof(In));
      const I head = misalign ? min(seglen, (I)4 - misalign) : (I)0;
      const I nquads = (seglen - head) / 4;
      const I tail = head + 4 * nquads;
      const Q* __restrict__ xq = reinterpret_cast<const Q*>(xs + head);
      const bool first = (I)lane < head;
      const bool last = (I)lane < seglen - tail;
      Q q[B];
      const auto load_batch = [&](I i0) {
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (i0 + (I)(b * L) < nquads) q[b] = xq[i0 + (I)(b * L)];
        }
      };
      const auto combine_batch = [&](I i0) {
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (i0 + (I)(b * L) < nquads) {
            Four e;
            memcpy(&e, &q[b], sizeof e);
            acc = r.combine(r.combine(r.combine(r.combine(acc, r.load(e.v[0])), r.load(e.v[1])),
                                      r.load(e.v[2])), r.load(e.v[3]));
          }
        }
      };
      In ends[2] = {In(), In()};
      if (first) ends[0] = xs[lane];
      if (last) ends[1] = xs[tail + lane];
      load_batch((I)lane);
      combine_batch((I)lane);
#pragma unroll 1
      for (I i0 = (I)(lane + B * L); i0 < nquads; i0 += (I)(B * L)) {
        load_batch(i0);
        combine_batch(i0);
      }
      if (first) acc = r.combine(acc, r.load(ends[0]));
      if (last) acc = r.combine(acc, r.load(ends[1]));
    } else {
      constexpr int B = LOAD_BATCH;
#pragma unroll 1
      for (I i0 = lane; i0 < seglen; i0 += (I)(B * L)) {
        In v[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (i0 + (I)(b * L) < seglen) v[b] = xs[i0 + (I)(b * L)];
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (i0 + (I)(b * L) < seglen) acc = r.combine(acc, r.load(v[b]));
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
// positions chunk*chunklen + threadIdx.y + k*TY, loaded LOAD_BATCH at a time (a position past
// the end is neither loaded nor combined); the TY partials of a channel are combined in
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
    const I step = (I)blockDim.y;
#pragma unroll 1
    for (I s0 = begin + (I)threadIdx.y; s0 < end; s0 += (I)LOAD_BATCH * step) {
      typename R::In v[LOAD_BATCH];
#pragma unroll
      for (int b = 0; b < LOAD_BATCH; ++b) {
        if (s0 + (I)b * step < end) v[b] = xs[(s0 + (I)b * step) * chans];
      }
#pragma unroll
      for (int b = 0; b < LOAD_BATCH; ++b) {
        if (s0 + (I)b * step < end) acc = r.combine(acc, r.load(v[b]));
      }
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
