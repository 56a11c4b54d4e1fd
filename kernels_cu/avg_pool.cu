// Average and Lp pooling (float dtypes; half and bfloat16 accumulate in float).
//
// Template parameters: T element type; I index type (int or long long, chosen on the host);
// K the window size along H and W when both equal K and the host specialised it (0: run time);
// NHWC the layout (avg_pool_packs: NHWC, and V the channels of a thread's pack). The row-tile
// kernels (avg_pool_rows, avg_pool_depth_rows) take KH, KW, the W stride SW and W dilation DW
// instead (row_tiles.ROW_TILE_WINDOWS), and VEC, LEAD: their packs (gp::RowTaps).
#include "accumulate.cuh"
#include "geometry.cuh"
#include "thread_map.cuh"
#include "traits.cuh"
#include "walk.cuh"

// Average pooling over a sliding-window walk (WindowTaps, RowTaps): the separable sum of the
// valid taps (Taps::sums) divided by divisor_override when > 0, else by the product over dims
// of the taps inside [-pad_begin, size + pad_end) (include_pad) or the number of valid taps; a
// window with no valid tap gives +0. ped/peh/pew are the end pads. V > 1 (NHWC): a thread's
// outputs are packs of V channels (gp::TermOfPacks), one at a time, each channel's sum added
// in the same separable order as with V = 1.
template <typename T, typename I, bool NHWC, int V = 1, typename Taps>
__device__ __forceinline__ void avg_outputs(const T* __restrict__ x, T* __restrict__ out,
                                            const Taps& taps, const gp::Geo<I>& g, int ped,
                                            int peh, int pew, int include_pad,
                                            int divisor_override) {
  typedef typename gp::Num<T>::acc A;
  const auto divisor = [&](const gp::Output<I>& o, long long count) {
    long long d = count;
    if (divisor_override > 0) {
      d = divisor_override;
    } else if (include_pad) {
      // the row tiles count D and W taps by overlaps (H by tests: a 5x5 window's overlaps
      // spill; the other walks hold their registers bound)
      constexpr bool overlap = Taps::row_tile;
      d = (long long)gp::count_taps<I, Taps::kd, overlap>(o.o_d, g.sd, g.pd, g.kd, g.dd,
                                                          -(I)g.pd, g.id + (I)ped) *
          gp::count_taps<I, Taps::kh>(o.o_h, g.sh, g.ph, g.kh, g.dh, -(I)g.ph, g.ih + (I)peh) *
          gp::count_taps<I, Taps::kw, overlap>(o.o_w, g.sw, g.pw, g.kw, g.dw, -(I)g.pw,
                                               g.iw + (I)pew);
    }
    return d;
  };
  const auto average = [&](A s, long long count, long long d) {
    return count > 0 ? s / (A)d : (A)0;
  };
  const auto mean = [&](A s, long long count, long long d) {
    return gp::Num<T>::store(average(s, count, d));
  };
  constexpr int G = V > 1 ? 1 : Taps::joint > 1 ? Taps::joint : 2;
  const auto group = [&](const T* __restrict__ xp, I cs, const gp::Output<I>* o, int n) {
    // a row tile's counts (at most KH * KW) in 32 bits
    typename gp::Select<Taps::row_tile, int, long long>::type count[G];
    if constexpr (V > 1) {
      typedef gp::Lanes<A, V> L;
      L s[G];
      taps.template sums<G>(o, n, gp::TermOfPacks<T, I, V>{{xp, cs, (A)1}}, L::all((A)-0.0), s,
                            count);
      const long long d = divisor(o[0], count[0]);  // n == G == 1
      T v[V];
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = mean(s[0].v[e], count[0], d);
      gp::store_row_tile<V>(out, o, V, v);
    } else {
      A s[G];
      taps.template sums<G>(o, n, gp::TapTerm<T, I, false>{xp, cs, (A)1}, (A)-0.0, s, count);
      if constexpr (Taps::row_tile) {
        // every average before any is rounded: the roundings outside the branches
        A r[G];
        T v[G];
#pragma unroll
        for (int j = 0; j < G; ++j) r[j] = average(s[j], count[j], divisor(o[j], count[j]));
#pragma unroll
        for (int j = 0; j < G; ++j) v[j] = gp::Num<T>::store(r[j]);
        gp::store_row_tile<G>(out, o, n, v, gp::warp_in_one_row());
      } else {
        out[o[0].oi] = mean(s[0], count[0], divisor(o[0], count[0]));  // n >= 1
#pragma unroll
        for (int j = 1; j < G; ++j) {
          if (j < n) out[o[j].oi] = mean(s[j], count[j], divisor(o[j], count[j]));
        }
      }
    }
  };
  if constexpr (Taps::row_tile) {
    gp::outputs_rows<G, Taps::depth>(g, x, group);
  } else {
    gp::output_groups<G, NHWC, true, V>(g, x, group);
  }
}

// Average pooling (avg_outputs). Geometry: see gp::outputs_nchw / gp::outputs_nhwc (grid x =
// spatial chunks, NHWC 2-D and 3-D: tiles; y/z = plane groups; block (TX, TY, TZ planes); one
// thread = `rows` outputs, two at a time: the loads of both windows' taps start before either
// sum waits, gp::WindowTaps::sums).
template <typename T, typename I, int K, bool NHWC>
__global__ void GP_WINDOW_BOUNDS(T, I, GP_BY_ARCH(K && !(K == 3 && NHWC) ? 5 : 4, K == 3 ? 3 : 4))
    avg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I), int ped, int peh,
             int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  avg_outputs<T, I, NHWC>(x, out, gp::WindowTaps<K, I>{g}, g, ped, peh, pew, include_pad,
                          divisor_override);
}

// Average pooling of NHWC inputs as avg_pool, a pack of V channels per thread (avg_outputs
// with V), V the channels of 16 bytes (planner.channel_pack): each tap of the window is one
// load, its index arithmetic shared by the V channels. The host launches this where the
// input's start and the channel count's bytes lie on 16. Geometry: gp::outputs_nhwc with V
// (grid x = channel-pack chunks x position tiles, y/z = batch row groups; block (TX packs, TY
// columns, TZ batch rows); one thread = `rows` outputs of one pack, one at a time).
template <typename T, typename I, int K, int V>
__global__ void GP_WINDOW_BOUNDS(T, I, K || sizeof(T) > 2 ? 3 : 2)
    avg_pool_packs(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I), int ped,
                   int peh, int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  avg_outputs<T, I, true, V>(x, out, gp::WindowTaps<K, I>{g}, g, ped, peh, pew, include_pad,
                             divisor_override);
}

// Average pooling (avg_outputs) of 1-D and 2-D NCHW planes with 32-bit offsets, KH x KW
// windows of W stride SW and W dilation DW (gp::RowTaps: the column sums shared between the
// windows that overlap), and of 3-D planes whose windows take one D tap at their own slice,
// as the 2-D pooling of the slices (gp::slices_as_planes). Geometry: gp::outputs_rows (grid
// x = W chunks, y = row groups, z = plane (slice) groups; one thread = GP_ROW_TILE outputs
// side by side along W).
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void __launch_bounds__(GP_BLOCK_THREADS)
    avg_pool_rows(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(int), int ped,
                  int peh, int pew, int include_pad, int divisor_override) {
  GP_GEO(int);
  const gp::Geo<int> fixed = gp::row_tile_geo<KH, KW, SW, DW>(gp::slices_as_planes(g));
  avg_outputs<T, int, false>(x, out, gp::RowTaps<KH, KW, SW, DW, VEC, LEAD>{fixed}, fixed, ped,
                             peh, pew, include_pad, divisor_override);
}

// avg_pool_rows of 3-D NCHW planes, their windows' D taps at run time (gp::DepthRowTaps: per
// column the sum over the D taps first, as the separable order has it). Geometry:
// gp::outputs_rows with DEPTH (grid y = groups of the output rows (d, h)). Bound: 256
// threads, 1 block (at ptxas's default for sm_90, a bfloat16 2 x 2 window spilled).
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, 1)
    avg_pool_depth_rows(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(int),
                        int ped, int peh, int pew, int include_pad, int divisor_override) {
  GP_GEO(int);
  avg_outputs<T, int, false>(x, out, gp::DepthRowTaps<KH, KW, SW, DW, VEC, LEAD>{{g}}, g, ped,
                             peh, pew, include_pad, divisor_override);
}

// Lp pooling: (separable sum over the valid taps of |x|**p) ** (1/p), p > 0 finite (A is
// float for half, bfloat16 and float, double for double); +0 for a window with no valid tap.
// Geometry as avg_pool.
template <typename T, typename I, int K, bool NHWC>
__global__ void GP_WINDOW_BOUNDS(T, I, 5)
    lp_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
            typename gp::Num<T>::acc p) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::WindowTaps<K, I> taps{g};
  gp::for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    long long count;
    const A s = taps.sum(o_d, o_h, o_w, gp::TapTerm<T, I, true>{xp, cs, p}, (A)0, count);
    A r;
    if (p == (A)1) {
      r = s;
    } else if (p == (A)2) {
      r = sqrt(s);
    } else {
      r = pow(s, (A)1 / p);
    }
    out[oi] = gp::Num<T>::store(r);
  });
}
