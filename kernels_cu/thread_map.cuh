// Thread-to-output maps of the window and adaptive kernels: which outputs of which plane each
// thread computes, for NCHW and NHWC launches.
#pragma once
#include "geometry.cuh"
#include "traits.cuh"

// A kernel's blocks B for sm_90 (SM90) and for sm_100 and later (SM100). ptxas for sm_100 and
// sm_120 needs 10 to 20 registers more than sm_90's for the kernels that start the taps of two
// compiled-in windows together (max_pool and avg_pool with K): where sm_90's fits them in 48
// registers (5 blocks), or an average's 3 x 3 windows in 64 (4), it spills; those kernels name
// the next step down for SM100 (64 and 80 registers), as does max_pool_packs (its float 2 x 2
// windows spill in 64 registers on sm_120). The others keep sm_90's count.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define GP_BY_ARCH(SM90, SM100) (SM100)
#else
#define GP_BY_ARCH(SM90, SM100) (SM90)
#endif

namespace gp {

// One output of a thread: coordinates (o_d, o_h, o_w) and flat index oi (into out and
// indices).
template <typename I>
struct Output {
  I o_d, o_h, o_w, oi;
};

// The outputs at(k) of k = first + r * step, r in [0, count), k < limit, in groups of G:
// h(o, n) with o and n as below.
template <int G, typename I, typename At, typename H>
__device__ __forceinline__ void in_groups(I first, I step, int count, I limit, At at, H h) {
  Output<I> o[G];
  for (int r = 0; r < count && first + (I)r * step < limit; r += G) {
    int n = 0;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const I k = first + (I)(r + j) * step;
      const bool live = r + j < count && k < limit;
      n += live ? 1 : 0;
      o[j] = at(live ? k : first + (I)r * step);
    }
    h(o, n);
  }
}

// outputs_nchw<G> / outputs_nhwc<G> call
//   h(xp, cs, o, n)
// for each group of up to G outputs of this thread, in order: o[0..n) are the outputs, o[n..G)
// repeat o[0], xp points at this thread's input plane (NHWC: already offset to its channel),
// cs is the element step between spatial neighbours (1 for NCHW, the channel count for NHWC).
// G > 1 lets a kernel start the loads of several outputs before it waits for any. Planes: see
// thread_plane (block z packs planes).
//
// NCHW -- grid: x = (W chunks of blockDim.x) x (row chunks of blockDim.y * rows rows, a row
//   being one (d, h) of the output), y/z = plane groups of blockDim.z. block: (TX, TY, TZ).
//   thread, when W takes several chunks: one output column o_w, rows r*TY + threadIdx.y of its
//   chunk (consecutive lanes -> consecutive o_w), of plane thread_plane(). When W fits one
//   chunk (OW <= TX), the block's TX*TY threads take the chunk's outputs in row-major order
//   instead, thread t outputs t, t + TX*TY, ...: a row narrower than TX leaves no lane idle
//   (consecutive lanes -> consecutive outputs, a warp crossing into the next row).
template <int G, typename I, typename T, typename H>
__device__ __forceinline__ void outputs_nchw(const Geo<I>& g, const T* __restrict__ x, H h) {
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
    return Output<I>{o_d, o_h, o_w, (p * nrows + row) * g.ow + o_w};
  };
  const auto group = [&](const Output<I>* o, int n) { h(xp, (I)1, o, n); };
  if (nwb == 1) {
    // at most TY * rows * OW <= TX * TY * rows outputs: `rows` strides of TX * TY cover them
    const I first = (I)blockIdx.x * (I)blockDim.y * (I)g.rows;
    const I last = first + (I)blockDim.y * (I)g.rows < nrows ? first + (I)blockDim.y * (I)g.rows
                                                             : nrows;
    in_groups<G>((I)threadIdx.y * (I)blockDim.x + (I)threadIdx.x, (I)blockDim.x * (I)blockDim.y,
                 g.rows, (last - first) * g.ow, [&](I q) {
                   const I r = q / g.ow;
                   return output(first + r, q - r * g.ow);
                 }, group);
    return;
  }
  const I wchunk = (I)blockIdx.x % nwb;
  const I rchunk = (I)blockIdx.x / nwb;
  const I o_w = wchunk * (I)blockDim.x + (I)threadIdx.x;
  if (o_w >= g.ow) return;
  in_groups<G>(rchunk * (I)blockDim.y * (I)g.rows + (I)threadIdx.y, (I)blockDim.y, g.rows, nrows,
               [&](I row) { return output(row, o_w); }, group);
}

// NHWC -- grid: x = (channel chunks of blockDim.x) x (position chunks), y/z = batch row
//   groups of blockDim.z. block: (TX along channels, TY along positions, TZ batch rows).
//   thread: one channel (consecutive lanes -> consecutive channels, so loads and stores are
//   contiguous) of batch row thread_plane(), and `rows` output positions (d, h, w):
//   * TILES, for a window launch (g.kh > 0) with several output rows (d, h) (od * oh > 1):
//     a position chunk is a tile of `rows` consecutive rows (d, h) by TY consecutive columns
//     w (tiles row-major, the tile's column index fastest); thread: column threadIdx.y of the
//     tile, its `rows` rows. Neighbouring windows of a block share most of their input.
//   * otherwise a position chunk is blockDim.y * rows consecutive positions in (d, h, w)
//     order; thread: positions r*TY + threadIdx.y of its chunk.
//   V > 1: a thread takes V consecutive channels from c = V * its lane along x (the host
//   launches this only where V divides the channel count); xp and oi name the first.
template <int G, typename I, bool TILES = false, int V = 1, typename T, typename H>
__device__ __forceinline__ void outputs_nhwc(const Geo<I>& g, const T* __restrict__ x, H h) {
  const long long plane = thread_plane();
  if (plane >= (long long)g.planes) return;
  const I ncb = (g.chans / (I)V + (I)blockDim.x - 1) / (I)blockDim.x;
  const I cchunk = (I)blockIdx.x % ncb;
  const I qchunk = (I)blockIdx.x / ncb;
  const I c = (cchunk * (I)blockDim.x + (I)threadIdx.x) * (I)V;
  if (c >= g.chans) return;
  const I npos = g.od * g.oh * g.ow;
  const I p = (I)plane;
  const T* __restrict__ xp = x + p * (g.id * g.ih * g.iw * g.chans) + c;
  const auto group = [&](const Output<I>* o, int n) { h(xp, g.chans, o, n); };
  if (TILES && g.kh > 0 && g.od * g.oh > 1) {
    const I nwt = (g.ow + (I)blockDim.y - 1) / (I)blockDim.y;
    const I rtile = qchunk / nwt;
    const I o_w = (qchunk - rtile * nwt) * (I)blockDim.y + (I)threadIdx.y;
    if (o_w >= g.ow) return;
    in_groups<G>(rtile * (I)g.rows, (I)1, g.rows, g.od * g.oh, [&](I row) {
      const I o_d = row / g.oh;
      const I o_h = row - o_d * g.oh;
      return Output<I>{o_d, o_h, o_w, (p * npos + row * g.ow + o_w) * g.chans + c};
    }, group);
    return;
  }
  in_groups<G>(qchunk * (I)blockDim.y * (I)g.rows + (I)threadIdx.y, (I)blockDim.y, g.rows, npos,
               [&](I q) {
                 const I t = q / g.ow;
                 const I o_w = q - t * g.ow;
                 const I o_d = t / g.oh;
                 const I o_h = t - o_d * g.oh;
                 return Output<I>{o_d, o_h, o_w, (p * npos + q) * g.chans + c};
               },
               group);
}

// Row tiles (1-D and 2-D NCHW, 32-bit offsets; see RowTaps in walk.cuh) -- grid: x = W
//   chunks of blockDim.x * G outputs, y = groups of blockDim.y output rows, z = groups of
//   blockDim.z planes (the host keeps each within 65535). DEPTH (3-D, the output rows being
//   the (d, h) pairs): x = (W chunks) x (row groups), y = plane groups, as outputs_nchw.
//   block: (TX, TY, TZ planes, several when a plane's tiles leave a block under two warps).
//   thread: the G consecutive outputs along W from (W chunk * TX + threadIdx.x) * G of row
//   (row group * TY + threadIdx.y) of plane (plane group * TZ + threadIdx.z), in one call
//   h(xp, 1, o, n) (o[n..G) continue past the row's end: never stored).
template <int G, bool DEPTH = false, typename T, typename H>
__device__ __forceinline__ void outputs_rows(const Geo<int>& g, const T* __restrict__ x, H h) {
  int wchunk = (int)blockIdx.x, rchunk = (int)blockIdx.y, pgroup = (int)blockIdx.z;
  if constexpr (DEPTH) {
    const int nwb = (g.ow + (int)blockDim.x * G - 1) / ((int)blockDim.x * G);
    rchunk = wchunk / nwb;
    wchunk -= rchunk * nwb;
    pgroup = (int)blockIdx.y;
  }
  const int row = rchunk * (int)blockDim.y + (int)threadIdx.y;
  const int o_w = (wchunk * (int)blockDim.x + (int)threadIdx.x) * G;
  const int p = pgroup * (int)blockDim.z + (int)threadIdx.z;
  const int nrows = DEPTH ? g.od * g.oh : g.oh;
  if (row >= nrows || o_w >= g.ow || p >= g.planes) return;
  const int o_d = DEPTH ? row / g.oh : 0;
  const int oi = (p * nrows + row) * g.ow + o_w;
  Output<int> o[G];
#pragma unroll
  for (int j = 0; j < G; ++j) o[j] = Output<int>{o_d, row - o_d * g.oh, o_w + j, oi + j};
  const int left = g.ow - o_w;
  h(x + p * ((DEPTH ? g.id : 1) * g.ih * g.iw), 1, o, left < G ? left : G);
}

// Whether the lanes of a warp hold row tiles (outputs_rows) side by side in one output row:
// blockDim.x a multiple of 32. Their first outputs then lie alike off the word.
__device__ __forceinline__ bool warp_in_one_row() { return (blockDim.x & 31) == 0; }

// A row tile's results v[0..n) to out[o[0].oi + j] (outputs_rows: consecutive along W; or
// the channels of an NHWC pack, outputs_nhwc with V = G): when the tile is whole and its first
// output aligned to the word, one store per word of up to 16 bytes (a 32-byte tile of int64
// indices: two); with `pairs` (warp_in_one_row: the lanes of a warp take the same branch), a
// whole tile of 4 outputs of 2 bytes or more off its word in pairs where its first output is
// aligned to one (two stores), else its middle pair as one and the outputs beside it alone
// (three); else one store per output.
template <int G, typename T, typename I>
__device__ __forceinline__ void store_row_tile(T* __restrict__ out, const Output<I>* o, int n,
                                               const T (&v)[G], bool pairs = false) {
  constexpr int bytes = sizeof(Pack<T, G>) < 16 ? (int)sizeof(Pack<T, G>) : 16;
  constexpr int per_word = bytes / (int)sizeof(T);
  static_assert(G % per_word == 0, "a tile is whole words");
  typedef typename Word<bytes>::type W;
  T* __restrict__ dst = out + o[0].oi;
  if (n == G && (unsigned long long)dst % bytes == 0) {
#pragma unroll
    for (int k = 0; k < G; k += per_word) {
      Pack<T, per_word> p;
#pragma unroll
      for (int e = 0; e < per_word; ++e) p.v[e] = v[k + e];
      W w;
      memcpy(&w, &p, sizeof w);
      reinterpret_cast<W*>(dst)[k / per_word] = w;
    }
    return;
  }
  if constexpr (G == 4 && sizeof(T) >= 2) {
    typedef typename Word<2 * sizeof(T)>::type P;
    if (pairs && n == G) {
      const auto pair = [&](int j) {
        Pack<T, 2> p;
        p.v[0] = v[j];
        p.v[1] = v[j + 1];
        P w;
        memcpy(&w, &p, sizeof w);
        *reinterpret_cast<P*>(dst + j) = w;
      };
      if ((unsigned long long)dst % sizeof(P) == 0) {
        pair(0);
        pair(2);
      } else {
        dst[0] = v[0];
        pair(1);
        dst[3] = v[3];
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j < n) dst[j] = v[j];
  }
}

// A row tile's indices best[0..n) to indices[o[0].oi + j] as int64 (G 4: 32 bytes, a sector;
// o[0].o_w < ow, the output row's length), in stores whose lanes together write whole
// sectors: where the thread's warp holds 32 whole tiles side by side in one row (blockDim.x a
// multiple of 32, the warp's last tile whole), the warp's indices exchanged between its lanes
// so that each of G stores writes 32 consecutive ones; else where the tile and its neighbour
// of the lane pair (2m, 2m + 1) are whole and the pair's start 16-byte aligned, each lane
// takes half of the other's so that each of two 16-byte stores of the pair fills a sector;
// else store_row_tile.
template <int G>
__device__ __forceinline__ void store_row_tile_indices(long long* __restrict__ indices,
                                                       const Output<int>* o, int n, int ow,
                                                       const int (&best)[G]) {
  static_assert(G == 4, "a tile's indices fill one sector");
  const int lane = (int)((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) & 31;
  const int odd = lane & 1;
  long long* __restrict__ pair = indices + (o[0].oi - odd * G);
  if (warp_in_one_row() && o[0].o_w + (32 - lane) * G <= ow) {
    long long* __restrict__ dst = indices + (o[0].oi - lane * G);
#pragma unroll
    for (int r = 0; r < G; ++r) {
      // the warp's output 32 r + lane: element lane % G of the tile of lane (32 r + lane) / G
      const int src = (32 * r + lane) / G;
      int v = 0;
#pragma unroll
      for (int e = 0; e < G; ++e) {
        const int b = __shfl_sync(0xffffffffu, best[e], src);
        if (lane % G == e) v = b;
      }
      dst[32 * r + lane] = (long long)v;
    }
  } else if ((blockDim.x & 1) == 0 && o[0].o_w + (2 - odd) * G <= ow &&
             (unsigned long long)pair % 16 == 0) {
    // the even lane sends its second half, the odd lane its first; then the pair's first
    // sector (the even tile's) and its second (the odd tile's), 16 bytes from each lane
    const unsigned mask = 3u << (lane - odd);
    Pack<long long, 2> half[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int got = __shfl_xor_sync(mask, odd ? best[e] : best[2 + e], 1);
      half[0].v[e] = odd ? got : best[e];
      half[1].v[e] = odd ? best[2 + e] : got;
    }
    typedef Word<16>::type W;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      W w;
      memcpy(&w, &half[k], sizeof w);
      reinterpret_cast<W*>(pair)[2 * k + odd] = w;
    }
  } else {
    long long w[G];
#pragma unroll
    for (int j = 0; j < G; ++j) w[j] = (long long)best[j];
    store_row_tile<G>(indices, o, n, w);
  }
}

// TILES, V (NHWC only): see outputs_nhwc.
template <int G, bool NHWC, bool TILES = false, int V = 1, typename I, typename T, typename H>
__device__ __forceinline__ void output_groups(const Geo<I>& g, const T* __restrict__ x, H h) {
  if constexpr (NHWC) {
    outputs_nhwc<G, I, TILES, V>(g, x, h);
  } else {
    outputs_nchw<G, I>(g, x, h);
  }
}

// for_outputs_nchw / for_outputs_nhwc / for_outputs call
//   f(xp, cs, o_d, o_h, o_w, oi)
// for each output of this thread, one at a time (the maps above with G = 1; NHWC window
// launches in tiles, see outputs_nhwc).
template <typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs_nchw(const Geo<I>& g, const T* __restrict__ x, F f) {
  outputs_nchw<1, I>(g, x, [&](const T* __restrict__ xp, I cs, const Output<I>* o, int) {
    f(xp, cs, o[0].o_d, o[0].o_h, o[0].o_w, o[0].oi);
  });
}

template <typename I, typename T, typename F>
__device__ __forceinline__ void for_outputs_nhwc(const Geo<I>& g, const T* __restrict__ x, F f) {
  outputs_nhwc<1, I, true>(g, x, [&](const T* __restrict__ xp, I cs, const Output<I>* o, int) {
    f(xp, cs, o[0].o_d, o[0].o_h, o[0].o_w, o[0].oi);
  });
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
