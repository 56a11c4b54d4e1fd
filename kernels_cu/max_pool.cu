// Max pooling (values only, and values + int64 indices), max unpooling (a gather, or a
// scatter after a zero fill) and the check of a max's indices that the backward ops and max
// unpooling run first.
//
// Template parameters: T element type; I index type (int when every offset fits in 32 bits,
// long long otherwise: chosen on the host); K the window size along H and W when both equal K
// and the host specialised it (0: read kh/kw at run time); NHWC the layout (max_pool_packs:
// NHWC, and V the channels of a thread's pack). The row-tile
// kernels (*_rows) take KH, KW, the W stride SW and W dilation DW instead
// (row_tiles.ROW_TILE_WINDOWS), and VEC, LEAD: their packs (gp::RowTaps).
#include "accumulate.cuh"
#include "gather.cuh"
#include "geometry.cuh"
#include "walk.cuh"

// Values-only max pooling over the window (gp::WindowTaps, gp::MaxOfTaps: padding never wins,
// NaN propagates, a window with no valid tap gives the lowest value). Geometry: see
// gp::outputs_nchw / gp::outputs_nhwc (grid x = spatial chunks, NHWC 2-D and 3-D: tiles;
// y/z = plane groups; block (TX, TY, TZ planes); one thread = `rows` outputs, two at a time
// when K is compiled in: the loads of both windows' taps start together, gp::max_outputs).
template <typename T, typename I, int K, bool NHWC>
__global__ void GP_WINDOW_BOUNDS(T, I, K ? GP_BY_ARCH(5, 4) : 6)
    max_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_outputs<T, I, false, NHWC>(x, out, nullptr, gp::WindowTaps<K, I>{g}, g);
}

// Values-only max pooling of NHWC inputs as max_pool, a pack of V channels per thread
// (gp::MaxOfPacks: each channel with max_pool's rules), V the channels of 16 bytes
// (planner.channel_pack): each tap of the window is one load, its index arithmetic shared by
// the V channels. The host launches this where the input's start and the channel count's
// bytes lie on 16. Geometry: gp::outputs_nhwc with V (grid x = channel-pack chunks x position
// tiles, y/z = batch row groups; block (TX packs, TY columns, TZ batch rows); one thread =
// `rows` outputs of one pack, one at a time).
template <typename T, typename I, int K, int V>
__global__ void GP_WINDOW_BOUNDS(T, I, GP_BY_ARCH(4, 3))
    max_pool_packs(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  const gp::WindowTaps<K, I> taps{g};
  gp::output_groups<1, true, true, V>(g, x, [&](const T* __restrict__ xp, I cs,
                                                const gp::Output<I>* o, int n) {
    gp::MaxOfPacks<T, I, V, gp::WindowTaps<K, I>::flat_max> acc(xp, cs);
    taps.template batched<1>(o, n, &acc);
    T v[V];
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = gp::Num<T>::store(acc.lane[e].m);
    gp::store_row_tile<V>(out, o, V, v);
  });
}

// Max pooling with int64 indices: the flat position (d*IH + h)*IW + w of the winner inside
// the spatial plane, -1 for a window with no valid tap. Geometry as max_pool, one output at a
// time. Registers held to 4 blocks per SM (64): within 48, ptxas rebuilds each tap's address
// from the kernel parameters.
template <typename T, typename I, int K, bool NHWC>
__global__ void GP_WINDOW_BOUNDS(T, I, 4)
    max_pool_indices(const T* __restrict__ x, T* __restrict__ out,
                     long long* __restrict__ indices, GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_outputs<T, I, true, NHWC>(x, out, indices, gp::WindowTaps<K, I>{g}, g);
}

// Max pooling (as max_pool) of 1-D and 2-D NCHW planes with 32-bit offsets, KH x KW windows
// of W stride SW and W dilation DW (gp::RowTaps), and of 3-D planes whose windows take one D
// tap at their own slice, as the 2-D pooling of the slices (gp::slices_as_planes). Geometry:
// gp::outputs_rows (grid x = W chunks, y = row groups, z = plane (slice) groups; one thread =
// GP_ROW_TILE outputs side by side along W, their input rows loaded once).
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void __launch_bounds__(GP_BLOCK_THREADS)
    max_pool_rows(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(int)) {
  GP_GEO(int);
  const gp::Geo<int> s = gp::slices_as_planes(g);
  gp::max_outputs<T, int, false, false>(x, out, nullptr,
                                        gp::RowTaps<KH, KW, SW, DW, VEC, LEAD>{s}, s);
}

// max_pool_rows of 3-D NCHW planes, their windows' D taps at run time (gp::DepthRowTaps).
// Geometry: gp::outputs_rows with DEPTH (grid y = groups of the output rows (d, h)). Bound:
// 256 threads, 2 blocks (ptxas's own choice spilled a 3 x 5 float16 window to local memory).
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, 2)
    max_pool_depth_rows(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(int)) {
  GP_GEO(int);
  gp::max_outputs<T, int, false, false>(x, out, nullptr,
                                        gp::DepthRowTaps<KH, KW, SW, DW, VEC, LEAD>{{g}}, g);
}

// Max pooling with int64 indices (as max_pool_indices) over the row tiles of max_pool_rows,
// 1-D and 2-D planes (a 3-D pooling takes max_pool_indices_depth_rows: its indices count
// the D slices of the plane). Geometry as max_pool_rows; a tile's values and indices are
// stored in whole sectors where the tiles allow (gp::store_row_tile_indices). Bound: 256
// threads, 4 blocks for float and half windows of at most 9 taps (their taps' selects keep 4
// maxima and indices live: ptxas took 70 registers of its own, 3 blocks), else 1 (a window's
// indices beside its taps need more registers than the 80 ptxas gives 256-thread blocks by
// default: a 5 x 5 float window spilled).
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void GP_WINDOW_BOUNDS(T, int, KH * KW <= 9 ? 4 : 1)
    max_pool_indices_rows(const T* __restrict__ x, T* __restrict__ out,
                          long long* __restrict__ indices, GP_GEO_PARAMS(int)) {
  GP_GEO(int);
  gp::max_outputs<T, int, true, false>(x, out, indices,
                                       gp::RowTaps<KH, KW, SW, DW, VEC, LEAD>{g}, g);
}

// max_pool_indices_rows of 3-D NCHW planes (as max_pool_depth_rows, every D slice's row
// tiles at their flat positions (d*IH + h)*IW + w of the plane). Bound: 256 threads, 3 blocks
// for float and half windows of at most 9 taps (ptxas took 81 registers of its own for a
// 3 x 3 float16 window, 2 blocks; held to 3 blocks it takes 54 and spills nothing), else 1.
template <typename T, int KH, int KW, int SW, int DW, int VEC, int LEAD>
__global__ void GP_WINDOW_BOUNDS(T, int, KH * KW <= 9 ? 3 : 1)
    max_pool_indices_depth_rows(const T* __restrict__ x, T* __restrict__ out,
                                long long* __restrict__ indices, GP_GEO_PARAMS(int)) {
  GP_GEO(int);
  gp::max_outputs<T, int, true, false>(x, out, indices,
                                       gp::DepthRowTaps<KH, KW, SW, DW, VEC, LEAD>{{g}}, g);
}

// Max unpooling where windows do not overlap and every index lies in its own window (or is
// -1; the host checks both), one pass that writes each output once: an output position
// takes x of the one window that covers it (gp::WindowCovers) when that window's index names
// it, else 0 (also where no window covers it). Elements move as unsigned words V of their
// size; J is the dtype of `indices`. Geometry: the max pooling the indices come from
// (GP_GEO_PARAMS: id/ih/iw the unpooled dims, written; od/oh/ow the pooled ones, read; gd, gh,
// gw gcd(stride, dilation) per dim). Grid, block, thread: gp::input_groups over the unpooled
// positions, as the backward kernels of pool_backward.cu.
template <typename V, typename J, typename I, bool NHWC>
__global__ void max_unpool_gather(const V* __restrict__ x, const J* __restrict__ indices,
                                  V* __restrict__ out, GP_GEO_PARAMS(I), int gd, int gh,
                                  int gw) {
  GP_GEO(I);
  gp::named_gather<V, I, NHWC>(x, indices, out, gp::WindowCovers<I>{g, gd, gh, gw}, g, (V)0,
                               [](V acc, bool named, V v) { return named ? v : acc; },
                               [](V acc) { return acc; });
}

// Max unpooling where the windows tile the unpooled input exactly (as avg_tiles_backward's:
// stride == kernel, no dilation, no padding, each unpooled dim kernel * pooled dim, 2 wide
// along W; NCHW), from int64 indices that it checks as it goes: each output position takes x
// of its window when that window's index names it, else 0, as max_unpool_gather, and where an
// index is neither -1 nor a tap of its window, flags[0] (cleared by the host) is set to 1 and
// the host runs the scatter instead. Elements move as unsigned words V of their size; an
// index is read as an IndexWord (its low 32 bits where I is int, with its high word for the
// check). rows: the pooled rows (planes x od x oh), plane_rows: od * oh of them per plane.
// Grid, block and thread as avg_tiles_backward's: a thread per pack of P = 8 / sizeof(V)
// pooled elements of a row, all loaded first, stores the kd * kh unpooled rows of their
// windows, each a run of 2P words stored as one 16-byte vector where it lies whole inside the
// row on a 16-byte aligned address.
template <typename V, typename I>
__global__ void max_unpool_tiles(const V* __restrict__ x, const long long* __restrict__ indices,
                                 V* __restrict__ out, int* __restrict__ flags, I rows,
                                 I plane_rows, I oh, I ow, int kd, int kh) {
  typedef typename gp::IndexWord<long long, I>::type W;
  constexpr int P = 8 / (int)sizeof(V);
  constexpr I step = (I)(sizeof(long long) / sizeof(W));
  const W* __restrict__ named = reinterpret_cast<const W*>(indices);
  const I r = (I)gp::block_plane() * (I)blockDim.y + (I)threadIdx.y;
  const I w0 = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) * (I)P;
  if (r >= rows || w0 >= ow) return;
  V xv[P];
  W at[P];
  bool whole_ok[P];  // the index fits in its word: its high word (I int) is its low's sign
  bool none[P];      // the index is -1
#pragma unroll
  for (int u = 0; u < P; ++u) {
    const I e = r * ow + (w0 + (I)u < ow ? w0 + (I)u : w0);
    xv[u] = x[e];
    at[u] = named[e * step];
    whole_ok[u] = step == 1 || named[e * step + step - 1] == (at[u] < 0 ? (W)-1 : (W)0);
    none[u] = at[u] == (W)-1;
  }
  // the unpooled rows first + a * ih + b of the windows' taps (a, b) (as avg_tiles_backward's;
  // in_plane: first's row in the plane), each window's taps named from its first position
  const I pr = r % plane_rows;
  const I first = (I)kh * (kd > 1 ? r + (r / oh) * (I)(kd - 1) * oh : r);
  const I in_plane = (I)kh * (kd > 1 ? pr + (pr / oh) * (I)(kd - 1) * oh : pr);
  const I ih = (I)kh * oh, iw = (I)2 * ow;
#pragma unroll
  for (int u = 0; u < P; ++u) {
    at[u] = gp::wrapping_sub(at[u], (W)(in_plane * iw + (I)2 * (w0 + (I)u)));
  }
  V* __restrict__ row0 = out + first * iw + (I)2 * w0;
  const bool whole = w0 + (I)P <= ow;
  bool found[P];
#pragma unroll
  for (int u = 0; u < P; ++u) found[u] = false;
  for (int a = 0; a < kd; ++a) {
    for (int b = 0; b < kh; ++b) {
      const I tap = ((I)a * ih + (I)b) * iw;  // tap (a, b, 0) from its window's first position
      gp::Pack<V, 2 * P> pack;
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const bool left = at[u] == (W)tap, right = at[u] == (W)(tap + (I)1);
        found[u] |= left || right;
        pack.v[2 * u] = left ? xv[u] : (V)0;
        pack.v[2 * u + 1] = right ? xv[u] : (V)0;
      }
      V* __restrict__ dst = row0 + tap;
      if (whole && (unsigned long long)dst % sizeof(pack) == 0) {
        *reinterpret_cast<gp::Pack<V, 2 * P>*>(dst) = pack;
      } else {
#pragma unroll
        for (int u = 0; u < 2 * P; ++u) {
          if (w0 + (I)(u / 2) < ow) dst[u] = pack.v[u];
        }
      }
    }
  }
  bool valid = true;
#pragma unroll
  for (int u = 0; u < P; ++u) valid &= w0 + (I)u >= ow || (whole_ok[u] && (found[u] || none[u]));
  if (!valid) flags[0] = 1;
}

// Max unpooling scatter into an `out` the host has already zero-filled (windows that
// overlap, or an index outside its window). Elements move as
// same-sized unsigned words V, so one instantiation serves every dtype of that size; J is the
// dtype of `indices` (already checked by the host to lie in [0, sout) or be -1, max_pool's
// index of a window with no valid tap, which writes nothing).
// x viewed as (batch, sin, chans) with chans = 1 for NCHW; out as (batch, sout, chans).
// grid: x = enough blocks for n elements (capped; grid-stride loop). block: 256 threads.
// thread: element e of x -> out[((e / (sin*chans)) * sout + indices[e]) * chans + e % chans].
template <typename V, typename J, typename I>
__global__ void max_unpool(const V* __restrict__ x, const J* __restrict__ indices,
                           V* __restrict__ out, I n, I sin, I sout, I chans) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  const I plane_in = sin * chans;
  for (I e = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; e < n; e += step) {
    const long long j = (long long)indices[e];  // signed for every J: no unsigned compare
    if (j < 0) continue;
    const I b = e / plane_in;
    const I c = chans == 1 ? (I)0 : e % chans;
    out[(b * sout + (I)j) * chans + c] = x[e];
  }
}

namespace gp {

// The divisors that take an index's position apart (see max_index_check).
template <typename I>
struct IndexDividers {
  Divider<I> chans, ow, oh, od, iw, ih, dd, dh, dw;
};

// max_index_check's walk: faults[0] |= an index out of the plane, faults[1] |= one in the
// plane but not of its window. PLAIN: at most 2 dims (id == od == 1) and no dilation, so that
// neither the D dim nor a dilation takes a division.
template <bool PLAIN, bool NHWC, bool ADAPTIVE, typename J, typename I>
__device__ __forceinline__ void check_indices(const J* __restrict__ indices, const Geo<I>& g,
                                              const IndexDividers<I>& by, bool (&faults)[2]) {
  constexpr int CHECK_LOADS = 4;
  const long long plane = (long long)g.id * (long long)g.ih * (long long)g.iw;
  const I n = g.planes * g.chans * g.od * g.oh * g.ow;  // the indices
  // whether position i (inside the input) is a tap of output o's window along one dim
  const auto tap = [&](I o, I i, I in, I out, int k, int s, int pad, const Divider<I>& dil) {
    if constexpr (ADAPTIVE) {
      return ((long long)o * in < (long long)(i + 1) * out) &
             ((long long)i * out < (long long)(o + 1) * in);
    } else if constexpr (PLAIN) {
      const I off = i - (o * (I)s - (I)pad);
      return (off >= (I)0) & (off < (I)k);
    } else {
      const I off = i - (o * (I)s - (I)pad);  // a negative one fails the last test
      const I t = dil.div(off >= (I)0 ? off : (I)0);
      return (t < (I)k) & (t * dil.d == off);
    }
  };
  const I step = (I)gridDim.x * (I)blockDim.x;
  I e0 = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  while (e0 < n) {
    long long j[CHECK_LOADS];  // signed for every J; -1 past the end
    I e[CHECK_LOADS];
#pragma unroll
    for (int u = 0; u < CHECK_LOADS; ++u) {
      const bool there = (I)u * step < n - e0;
      e[u] = there ? e0 + (I)u * step : e0;
      j[u] = there ? (long long)indices[e[u]] : -1LL;
    }
#pragma unroll
    for (int u = 0; u < CHECK_LOADS; ++u) {
      const bool in_plane = (j[u] >= 0) & (j[u] < plane);
      faults[0] |= !in_plane & (j[u] != -1);
      const I p = in_plane ? (I)j[u] : (I)0;
      I q = e[u];  // the output position
      if constexpr (NHWC) q = by.chans.div(q);
      const I row = by.ow.div(q), t = by.oh.div(row), r = by.iw.div(p);
      bool own = tap(q - row * g.ow, p - r * g.iw, g.iw, g.ow, g.kw, g.sw, g.pw, by.dw);
      if constexpr (PLAIN) {
        own &= tap(row - t * g.oh, r, g.ih, g.oh, g.kh, g.sh, g.ph, by.dh);
      } else {
        const I z = by.ih.div(r);
        own &= tap(row - t * g.oh, r - z * g.ih, g.ih, g.oh, g.kh, g.sh, g.ph, by.dh) &
               tap(t - by.od.div(t) * g.od, z, g.id, g.od, g.kd, g.sd, g.pd, by.dd);
      }
      faults[1] |= in_plane & !own;
    }
    if ((I)CHECK_LOADS * step >= n - e0) break;
    e0 += (I)CHECK_LOADS * step;
  }
}

}  // namespace gp

// The rule of a max's indices (J the dtype of `indices`, of the pooling's output shape; the
// pooling's geometry GP_GEO_PARAMS, `rows` unused): each lies in [-1, plane) of the input
// plane, else flags[0] is set; each in that range is -1 or a tap of its own window, else
// flags[1] is set: along every dim, ADAPTIVE: floor(o * in / out) <= i < ceil((o + 1) * in /
// out), else i = o * stride - pad + t * dilation for a t < kernel. The host clears both flags
// first and reads them after, one transfer; a thread that finds a fault stores 1. Grid: a
// grid-stride loop over the indices in their order (x blocks of GP_BLOCK_THREADS), a
// thread's 4 of a pass a grid apart, their loads started together. Nothing divides and
// nothing branches per index: the output position (channels, ow, oh, od), the index's (iw,
// ih) and every dilation come apart by gp::Divider, whose magic numbers (by_*) the host gives;
// with at most 2 dims and no dilation, the D dim and the dilations are left out.
template <typename J, typename I, bool NHWC, bool ADAPTIVE>
__global__ void max_index_check(const J* __restrict__ indices, int* __restrict__ flags,
                                GP_GEO_PARAMS(I), long long by_chans, long long by_ow,
                                long long by_oh, long long by_od, long long by_iw,
                                long long by_ih, long long by_dd, long long by_dh,
                                long long by_dw) {
  GP_GEO(I);
  const gp::IndexDividers<I> by = {{g.chans, by_chans}, {g.ow, by_ow},      {g.oh, by_oh},
                                   {g.od, by_od},       {g.iw, by_iw},      {g.ih, by_ih},
                                   {(I)g.dd, by_dd},    {(I)g.dh, by_dh},   {(I)g.dw, by_dw}};
  bool faults[2] = {false, false};
  if (g.id == 1 && g.od == 1 && g.dd <= 1 && g.dh <= 1 && g.dw <= 1) {
    gp::check_indices<true, NHWC, ADAPTIVE>(indices, g, by, faults);
  } else {
    gp::check_indices<false, NHWC, ADAPTIVE>(indices, g, by, faults);
  }
  if (faults[0]) flags[0] = 1;
  if (faults[1]) flags[1] = 1;
}
