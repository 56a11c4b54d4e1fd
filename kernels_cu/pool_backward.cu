// Backward of the float poolings: the gradient of the input from the gradient of the output,
// gathered, one thread per input element (or `rows` of them), with no atomics. Each input
// element sums the gradients of the windows that cover it in the order of the NumPy backend
// (gpupool/cpu/backward.py), so that both give the same bits:
//
// * averages and Lp: q(o) per covering window o (the gradient over the window's divisor; Lp:
//   times y(o)**(1-p)), summed nested, D outermost: acc = sum over o_d of (sum over o_h of
//   (sum over o_w of q)), windows ascending along each dim and every partial sum starting
//   from +0 (gp::NestedSums); Lp then multiplies a nonzero sum by sign(x) * |x|**(p-1).
// * maxima: acc = +0 plus, in row-major order of the covering windows (gp::MaxGrads),
//   the gradient of each window whose index names this element (np.add.at's order).
//
// Template parameters: T element type (half sums in float, as Num<T>::acc); I index type (int
// or long long, chosen on the host); NHWC the layout; C (window kernels) the compiled-in bound
// on the windows covering a position along H and W (see GatherShape). Every kernel takes the
// forward op's geometry (GP_GEO_PARAMS: id/ih/iw the forward input's dims, whose gradient
// `out` is written; od/oh/ow the forward output's, whose gradient `grad` is read; window
// fields 0 for adaptive). Grid, block and thread: the thread maps of thread_map.cuh over the
// input positions (gp::input_groups), a group of positions (GatherShape) of a thread at once,
// the loads of their covering windows started in joint batches (gp::walk_lines_batched); an
// average whose windows tile the input (avg_tiles_backward) and the global average's backward
// (avg_global_backward) store 16-byte packs from the gradients instead, with no walk, and
// the max and average gradients of 2-D windows of stride 2 (averages: also 1) take a cell of
// rows per thread, each window that may cover it loaded once (max_cells_backward,
// avg_cells_backward).
#include "accumulate.cuh"
#include "gather.cuh"
#include "traits.cuh"

namespace gp {

// Adaptive windows: the outputs whose windows cover an input position (adaptive_lines).
template <typename I>
struct AdaptiveCovers {
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I i_d, I i_h, I i_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    adaptive_lines<true>(g, i_d, i_h, i_w, d, h, w);
  }
};

// Slots a thread takes at once, their covering windows' loads all started before any of their
// sums waits (group), and blocks of GP_BLOCK_THREADS threads per SM its registers are held
// to (blocks; with float and half elements, see GP_WINDOW_BOUNDS), C the compiled-in bound on
// a slot's windows along H and along W (0: none). The sums' slot is a position: one window at
// most (C == 1), 8 positions, a batch of 8 windows; two (C == 2), 4 positions, all their 16
// windows of one D tap in a batch. The max gradients' slot is a pack of 4 positions along W
// (C == 3, the windows covering any of them; pack): 2 packs, 18 windows in a batch. Else 4
// positions, their windows in batches of BW W taps (max_gather's, sum_gather's). Each holds
// as many loads in flight per SM as ptxas keeps in one run without spilling (the groups are
// the planner's GATHER_GROUP, GP_GATHER_GROUP_C).
template <int C>
struct GatherShape {
  static constexpr int group = C == 1   ? GP_GATHER_GROUP_1
                               : C == 2 ? GP_GATHER_GROUP_2
                               : C == 3 ? GP_GATHER_GROUP_3
                                        : GP_GATHER_GROUP_0;
  static constexpr int blocks = C ? 2 : 1;
  static constexpr int pack = C == 3 ? GP_MAX_PACK : 1;
};
#define GP_GATHER_BOUNDS(T, I, C) GP_WINDOW_BOUNDS(T, I, (gp::GatherShape<C>::blocks))

// The lines of the covering windows of a group's positions e[0..G) (covers.lines).
template <int G, typename I, typename Covers>
__device__ __forceinline__ void cover_lines(const Covers& covers, const Output<I>* e,
                                            TapLine<I>* d, TapLine<I>* h, TapLine<I>* w) {
#pragma unroll
  for (int j = 0; j < G; ++j) covers.lines(e[j].o_d, e[j].o_h, e[j].o_w, d[j], h[j], w[j]);
}

// The max gradients of G slots of V positions along W (walk_lines_batched's visitor):
// acc[j][u] = +0 plus, in row-major order of the covering windows, each window's gradient
// where its index names position pos[j] + u, else +0 (the sum, from +0, is never -0, so that
// leaves it as it is). Every slot is taken: one that is not ok names -1, no position. The
// walk may visit windows that do not cover a position (a pack's windows): their indices never
// name it. An index is read as an IndexWord (its low 32 bits where I is int: the host has
// checked that each is -1 or a position of its window), half the registers in flight.
template <int G, int V, typename T, typename I>
struct MaxGrads {
  typedef typename IndexWord<long long, I>::type W;
  typedef NamedValue<W, T> value;
  static constexpr bool skips = false;
  typedef typename Num<T>::acc A;
  const T* __restrict__ grad;
  const W* __restrict__ named;  // indices, as words of W
  I base, cs, oh, ow;
  I pos[G];
  A acc[G][V];
  __device__ __forceinline__ value load(int, I pd, I ph, I pw, bool ok) const {
    const I at = base + ((pd * oh + ph) * ow + pw) * cs;
    return {tap_load(named, (I)(sizeof(long long) / sizeof(W)), at, ok, (W)-1),
            tap_load(grad, (I)1, at, ok)};
  }
  __device__ __forceinline__ void take(int j, const value& v, I, I, I) {
    const A gv = Num<T>::load(v.value);
#pragma unroll
    for (int u = 0; u < V; ++u) acc[j][u] += v.named == pos[j] + (I)u ? gv : (A)0;
  }
  __device__ __forceinline__ void plane(int) {}
  __device__ __forceinline__ void plane_end(int) {}
  __device__ __forceinline__ void row(int) {}
  __device__ __forceinline__ void row_end(int) {}
};

// The max gradient over any covering windows (WindowCovers, AdaptiveCovers; C: at most C
// along H and W, 0 any number), GP_GATHER_GROUP_0 positions of a thread at once, the loads of
// their covering windows in joint batches.
template <typename T, typename I, bool NHWC, typename Covers>
__device__ __forceinline__ void max_gather(const T* __restrict__ grad,
                                           const long long* __restrict__ indices,
                                           T* __restrict__ out, const Covers& covers,
                                           const Geo<I>& g) {
  // W taps per batch of the covering windows' loads, a batch of G * BW windows (ptxas
  // on sm_90: about as many registers as 1, the same blocks per SM)
  constexpr int G = GP_GATHER_GROUP_0, BW = 2;
  input_groups<G, NHWC>(g, grad, [&](I base, I cs, const Output<I>* e, int n) {
    TapLine<I> d[G], h[G], w[G];
    cover_lines<G>(covers, e, d, h, w);
    typedef MaxGrads<G, 1, T, I> F;
    F f{grad, reinterpret_cast<const typename F::W*>(indices), base, cs, g.oh, g.ow};
#pragma unroll
    for (int j = 0; j < G; ++j) {
      f.pos[j] = (e[j].o_d * g.ih + e[j].o_h) * g.iw + e[j].o_w;
      f.acc[j][0] = (typename F::A)0;
    }
    walk_lines_batched<G, BW, 0>(d, h, w, n, f);
    T v[G];
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = Num<T>::store(f.acc[j][0]);
    store_values<G>(out, e, n, v);
  });
}

// The max gradients of sliding windows in packs of GatherShape<3>::pack positions along W
// (C == 3: the host has checked that at most 3 windows cover a position along H, and 3 any of
// a pack's positions along W): a thread takes 2 packs (input_groups with V = pack), walking for
// each the windows that cover any of its positions -- per dim the covering windows of the
// position along D and H, along W windows lo..hi, those whose taps reach the pack's first to
// its last position -- all 18 of one D tap in a batch. A window loads once for the pack, not
// once per position it covers. A whole pack of an NCHW row on a pack-aligned address is
// stored as one vector.
template <typename T, typename I, bool NHWC>
__device__ __forceinline__ void max_window_packs(const T* __restrict__ grad,
                                                 const long long* __restrict__ indices,
                                                 T* __restrict__ out, const Geo<I>& g,
                                                 const WindowCovers<I>& covers) {
  constexpr int G = GatherShape<3>::group, V = GatherShape<3>::pack;
  typedef typename MaxGrads<G, V, T, I>::A A;
  input_groups<G, NHWC, V>(g, grad, [&](I base, I cs, const Output<I>* e, int n) {
    TapLine<I> d[G], h[G], w[G];
    I w0[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
      w0[j] = e[j].o_w * (I)V;
      covers.lines(e[j].o_d, e[j].o_h, w0[j], d[j], h[j], w[j]);
      const I w1 = (w0[j] + (I)V < g.iw ? w0[j] + (I)V : g.iw) - (I)1;
      const I reach = w0[j] + (I)g.pw - (I)((g.kw - 1) * g.dw);  // lo * sw >= reach
      const I lo = reach <= 0 ? (I)0 : (reach + (I)g.sw - (I)1) / (I)g.sw;
      const I top = (w1 + (I)g.pw) / (I)g.sw;
      const I hi = top < g.ow - (I)1 ? top : g.ow - (I)1;
      w[j] = {lo, hi >= lo ? hi - lo + (I)1 : (I)0, (I)1, g.ow};
    }
    typedef MaxGrads<G, V, T, I> F;
    F f{grad, reinterpret_cast<const typename F::W*>(indices), base, cs, g.oh, g.ow};
#pragma unroll
    for (int j = 0; j < G; ++j) {
      f.pos[j] = (e[j].o_d * g.ih + e[j].o_h) * g.iw + w0[j];
#pragma unroll
      for (int u = 0; u < V; ++u) f.acc[j][u] = (A)0;
    }
    walk_lines_batched<G, 1, 3>(d, h, w, n, f);
    // the plane (and channel) from base: grad's plane holds od * oh * ow positions
    const I gplane = g.od * g.oh * g.ow * cs;
    const I p = base / gplane;
    const I c = base - p * gplane;
    const I iplane = g.id * g.ih * g.iw;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (j >= n) continue;
      Pack<T, V> v;
#pragma unroll
      for (int u = 0; u < V; ++u) v.v[u] = Num<T>::store(f.acc[j][u]);
      T* __restrict__ dst = out + (p * iplane + f.pos[j]) * cs + c;
      if (!NHWC && w0[j] + (I)V <= g.iw && (unsigned long long)dst % sizeof(v) == 0) {
        *reinterpret_cast<Pack<T, V>*>(dst) = v;
      } else {
#pragma unroll
        for (int u = 0; u < V; ++u) {
          if (w0[j] + (I)u < g.iw) dst[(I)u * cs] = v.v[u];
        }
      }
    }
  });
}

// A covering window: its coordinates and its offset `at` in grad (and y).
template <typename I>
struct Window {
  I o_d, o_h, o_w, at;
};

// The nested sums of G positions (walk_lines_batched's visitor): per position, the sum over
// its covering windows' D lines of the sums over H of the sums over W of q(load(window, ok),
// window), each sum from +0 (the order of the NumPy backend). load(window, ok) loads what q
// needs of a window (nothing when !ok), of type V.
template <int G, typename V, typename A, typename I, typename Load, typename Q>
struct NestedSums {
  typedef V value;
  static constexpr bool skips = true;
  const Load& ld;
  const Q& q;
  I base, cs, oh, ow;
  A sum0[G], sum1[G], sum2[G];
  __device__ __forceinline__ Window<I> window(I pd, I ph, I pw) const {
    return {pd, ph, pw, base + ((pd * oh + ph) * ow + pw) * cs};
  }
  __device__ __forceinline__ V load(int, I pd, I ph, I pw, bool ok) const {
    return ld(window(pd, ph, pw), ok);
  }
  __device__ __forceinline__ void take(int j, const V& v, I pd, I ph, I pw) {
    sum2[j] += q(v, window(pd, ph, pw));
  }
  __device__ __forceinline__ void plane(int j) { sum1[j] = (A)0; }
  __device__ __forceinline__ void plane_end(int j) { sum0[j] += sum1[j]; }
  __device__ __forceinline__ void row(int j) { sum2[j] = (A)0; }
  __device__ __forceinline__ void row_end(int j) { sum1[j] += sum2[j]; }
};

// The nested sum over the covering windows of q(load(window, ok), window), stored as
// finish(sum, ii); positions and covering windows as max_gather.
template <typename T, typename I, bool NHWC, int C, typename Covers, typename Load, typename Q,
          typename Finish>
__device__ __forceinline__ void sum_gather(const T* __restrict__ grad, T* __restrict__ out,
                                           const Covers& covers, const Geo<I>& g,
                                           const Load& ld, const Q& q, const Finish& finish) {
  typedef typename Num<T>::acc A;
  typedef decltype(ld(Window<I>(), false)) V;
  // W taps per batch of the covering windows' loads where their number is not compiled in
  // (2 would cost a block per SM)
  constexpr int G = GatherShape<C>::group, BW = 1;
  input_groups<G, NHWC>(g, grad, [&](I base, I cs, const Output<I>* e, int n) {
    TapLine<I> d[G], h[G], w[G];
    cover_lines<G>(covers, e, d, h, w);
    NestedSums<G, V, A, I, Load, Q> f{ld, q, base, cs, g.oh, g.ow};
#pragma unroll
    for (int j = 0; j < G; ++j) f.sum0[j] = (A)0;
    walk_lines_batched<G, BW, C>(d, h, w, n, f);
    T v[G];
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = Num<T>::store(finish(f.sum0[j], e[j].oi));
    store_values<G>(out, e, n, v);
  });
}

// A covering window's gradient and forward output.
template <typename T>
struct GradY {
  T grad, y;
};

// A gradient, loaded for q (none when !ok).
template <typename T, typename I>
struct GradAt {
  const T* __restrict__ grad;
  __device__ __forceinline__ T operator()(const Window<I>& o, bool ok) const {
    return tap_load(grad, (I)1, o.at, ok);
  }
};

// The sum as it is.
struct Unchanged {
  template <typename A, typename I>
  __device__ __forceinline__ A operator()(A s, I) const {
    return s;
  }
};

}  // namespace gp

// max_pool's backward from its int64 indices (the host widens other index dtypes). gd, gh,
// gw: gcd(stride, dilation) per dim. C (the window kernels'): the host's bound on a slot's
// windows along H and along W (see GatherShape): here 3, the packs of max_window_packs, or 0,
// the run-time walk; 1 or 2 for the averages' and Lp's positions.
template <typename T, typename I, bool NHWC, int C>
__global__ void GP_GATHER_BOUNDS(T, I, C)
    max_window_backward(const T* __restrict__ grad, const long long* __restrict__ indices,
                        T* __restrict__ out, GP_GEO_PARAMS(I), int gd, int gh, int gw) {
  GP_GEO(I);
  if constexpr (C == 3) {
    gp::max_window_packs<T, I, NHWC>(grad, indices, out, g, gp::WindowCovers<I>{g, gd, gh, gw});
  } else {
    gp::max_gather<T, I, NHWC>(grad, indices, out, gp::WindowCovers<I>{g, gd, gh, gw}, g);
  }
}

namespace gp {

// The windows of one dim of stride S (1 or 2) that may cover position u of a cell, relative to
// the cell's window c (its first position S * c): with K taps and pad P (K > 0) exactly those
// covering it, windows ceil((u + P - K + 1) / S) .. floor((u + P) / S); K == 0 (any of 2 or 3
// taps and pad 0 or 1) the windows that hold those of every such K and P: (u + 1) / 2 - 1 and
// (u + 1) / 2 (S == 2), u - 2 .. u + 1 (S == 1).
struct CellCovers {
  static constexpr int floor_div(int x, int s) { return x >= 0 ? x / s : -((s - 1 - x) / s); }
  static constexpr int lo(int S, int K, int P, int u) {
    return K ? -floor_div(K - 1 - u - P, S) : S == 2 ? (u + 1) / 2 - 1 : u - 2;
  }
  static constexpr int hi(int S, int K, int P, int u) {
    return K ? floor_div(u + P, S) : S == 2 ? (u + 1) / 2 : u + 1;
  }
};

// The window slots of a cell of R rows by V columns, stride S (windows of KH x KW taps, pads
// PH, PW as CellCovers): SH x SW windows from (r + H0, c + W0) hold every one that may cover
// it.
template <int S, int R, int V, int KH, int PH, int KW, int PW>
struct CellSlots {
  static constexpr int H0 = CellCovers::lo(S, KH, PH, 0), W0 = CellCovers::lo(S, KW, PW, 0);
  static constexpr int SH = CellCovers::hi(S, KH, PH, R - 1) - H0 + 1;
  static constexpr int SW = CellCovers::hi(S, KW, PW, V - 1) - W0 + 1;
};

// The gradients of row uh of a cell of V columns from (S r, S c), position (S r + uh, S c + uw)
// given by at(uw, row), stored as a row tile (gp::store_row_tile); nothing past the input's
// last row.
template <int S, int V, typename T, typename At>
__device__ __forceinline__ void store_cell_row(T* __restrict__ out, int plane, int r, int c,
                                               int ih, int iw, int uh, const At& at) {
  const int row = S * r + uh;
  T v[V];
#pragma unroll
  for (int uw = 0; uw < V; ++uw) v[uw] = at(uw, row);
  if (row >= ih) return;
  const Output<int> o{0, row, S * c, (plane * ih + row) * iw + S * c};
  store_row_tile<V>(out, &o, iw - S * c < V ? iw - S * c : V, v);
}

// The gradients of a cell of R rows by V columns from (S r, S c), position (S r + uh, S c + uw)
// given by at(uh, uw, row, col), each row stored by store_cell_row.
template <int S, int R, int V, typename T, typename At>
__device__ __forceinline__ void store_cell(T* __restrict__ out, int plane, int r, int c, int ih,
                                           int iw, const At& at) {
#pragma unroll
  for (int uh = 0; uh < R; ++uh) {
    store_cell_row<S, V>(out, plane, r, c, ih, iw, uh,
                         [&](int uw, int row) { return at(uh, uw, row, S * c + uw); });
  }
}

// Whether index j of the window of stride 2 whose first tap is (hs, ws) (kh x kw taps, no
// dilation) is -1 or a tap of it inside the ih x iw plane: the window's rows tried in turn,
// with no division.
__device__ __forceinline__ bool window_tap(long long j, int hs, int ws, int kh, int kw, int ih,
                                           int iw) {
  const int p = (int)j;
  if ((long long)p != j) return false;  // past 32 bits: outside every plane of these kernels
  if (p < 0) return p == -1;
  bool tap = false;
#pragma unroll
  for (int t = 0; t < 3; ++t) {
    // unsigned: defined where the row is outside the plane, and then not taken
    const unsigned row = (unsigned)(hs + t), col = (unsigned)p - row * (unsigned)iw;
    tap |= t < kh && row < (unsigned)ih && col < (unsigned)iw && col - (unsigned)ws < (unsigned)kw;
  }
  return tap;
}

// The max gradients of one cell of max_cells_backward (stride 2, 2 rows by GP_CELL_COLUMNS),
// windows of KH x KW taps and pads PH, PW (0 taps: any of 2 or 3 taps and pad 0 or 1, taken
// from kh, kw, ph, pw). CHECKS: the cell also checks the indices of the windows whose first
// input position inside the plane lies in it (each window in exactly one cell) and returns
// whether each is -1 or a tap of its window (window_tap); else it returns true.
template <bool CHECKS, int KH, int PH, int KW, int PW, typename T>
__device__ __forceinline__ bool max_cell(const T* __restrict__ grad,
                                         const long long* __restrict__ indices,
                                         T* __restrict__ out, int plane, int r, int c, int ih,
                                         int iw, int oh, int ow, int kh, int kw, int ph,
                                         int pw) {
  typedef typename Num<T>::acc A;
  typedef CellCovers CC;
  constexpr int V = GP_CELL_COLUMNS;
  typedef CellSlots<2, 2, V, KH, PH, KW, PW> S;
  constexpr int H0 = S::H0, W0 = S::W0, SH = S::SH, SW = S::SW;
  const int p_h = KH ? PH : ph, p_w = KW ? PW : pw;
  // run-time taps: the first slot covers a position only with 3 taps and pad 0, the last
  // only with pad 1
  const bool first_h = KH || (kh == 3 && ph == 0), last_h = KH || ph == 1;
  const bool first_w = KW || (kw == 3 && pw == 0), last_w = KW || pw == 1;
  bool col_ok[SW], own_w[SW];
#pragma unroll
  for (int b = 0; b < SW; ++b) {
    col_ok[b] = (unsigned)(c + W0 + b) < (unsigned)ow && (b != 0 || first_w) &&
                (b != SW - 1 || last_w);
    // the cell of the window's first column inside the plane: V columns from 2 c
    const int ws = 2 * (c + W0 + b) - p_w;
    own_w[b] = (ws < 0 ? 0 : ws) / V == 2 * c / V;
  }
  int idx[SH][SW];
  long long whole[SH][SW];  // CHECKS: the indices whole, -1 for a slot not loaded
  T gv[SH][SW];
#pragma unroll
  for (int a = 0; a < SH; ++a) {
    const int wr = r + H0 + a;
    const bool row_ok = (unsigned)wr < (unsigned)oh && (a != 0 || first_h) &&
                        (a != SH - 1 || last_h);
    const int at = (plane * oh + wr) * ow + c + W0;
    const int* __restrict__ nrow = reinterpret_cast<const int*>(indices + at);  // low words
    const T* __restrict__ grow = grad + at;
#pragma unroll
    for (int b = 0; b < SW; ++b) {
      idx[a][b] = -1;  // names no position: gv[a][b] is then never read
      whole[a][b] = -1;
      if (row_ok && col_ok[b]) {
        if (CHECKS) {
          whole[a][b] = indices[at + b];
          idx[a][b] = (int)whole[a][b];
        } else {
          idx[a][b] = nrow[2 * b];
        }
        gv[a][b] = grow[b];
      }
    }
  }
  bool valid = true;
  if (CHECKS) {
#pragma unroll
    for (int a = 0; a < SH; ++a) {
      const int hs = 2 * (r + H0 + a) - p_h;
      if ((hs < 0 ? 0 : hs) / 2 != r) continue;
#pragma unroll
      for (int b = 0; b < SW; ++b) {
        if (!own_w[b]) continue;
        valid &= window_tap(whole[a][b], hs, 2 * (c + W0 + b) - p_w, KH ? KH : kh,
                            KW ? KW : kw, ih, iw);
      }
    }
  }
  store_cell<2, 2, V>(out, plane, r, c, ih, iw, [&](int uh, int uw, int row, int col) {
    const int pos = row * iw + col;
    A acc = (A)0;
#pragma unroll
    for (int a = CC::lo(2, KH, PH, uh) - H0; a <= CC::hi(2, KH, PH, uh) - H0; ++a) {
#pragma unroll
      for (int b = CC::lo(2, KW, PW, uw) - W0; b <= CC::hi(2, KW, PW, uw) - W0; ++b) {
        if (idx[a][b] == pos) acc += Num<T>::load(gv[a][b]);
      }
    }
    return Num<T>::store(acc);
  });
  return valid;
}

// The average gradients of one cell of avg_cells_backward (stride S, R rows by V columns),
// windows of KH x KW taps and pads PH, PW (0 taps: any of 2 or 3 taps and pad 0 or 1, taken
// from kh, kw, ph, pw, each window then tested for covering a position). q = grad / divisor
// once per window (as avg_window_backward's); an input's gradient is, along H in ascending
// order, the sum from +0 of the sums from +0, along W in ascending order, of the q of the
// windows that cover it (the NumPy backend's spread, W first). The sum along W of a window row
// is the same for every row of the cell it covers: each is taken once. The slot rows stream,
// loaded AHEAD rows before their divisions, and each row of the cell is stored once its last
// covering slot row is summed, so that few registers stay live.
template <int S, int R, int V, int KH, int PH, int KW, int PW, typename T>
__device__ __forceinline__ void avg_cell(const T* __restrict__ grad, T* __restrict__ out,
                                         int plane, int r, int c, int ih, int iw, int oh,
                                         int ow, int kh, int kw, int ph, int pw, int lo_h,
                                         int hi_h, int lo_w, int hi_w, int divisor_override) {
  typedef typename Num<T>::acc A;
  typedef CellCovers CC;
  typedef CellSlots<S, R, V, KH, PH, KW, PW> Slots;
  constexpr int H0 = Slots::H0, W0 = Slots::W0, SH = Slots::SH, SW = Slots::SW;
  const int k_h = KH ? KH : kh, k_w = KW ? KW : kw, p_h = KH ? PH : ph, p_w = KW ? PW : pw;
  // the divisor of slot (a, b): its row's div_h times div_w[b], exact (a count of at most 3
  // taps per dim, or divisor_override times 1); 1 for a slot past the gradient's edge, whose
  // gradient is +0, so that every quotient takes division's fast path with no branch
  bool col_ok[SW];
  A div_w[SW];
#pragma unroll
  for (int b = 0; b < SW; ++b) {
    col_ok[b] = (unsigned)(c + W0 + b) < (unsigned)ow;
    div_w[b] = col_ok[b] && divisor_override <= 0
                   ? (A)count_taps<int, KW>(c + W0 + b, S, p_w, k_w, 1, lo_w, hi_w)
                   : (A)1;
  }
  const auto load_row = [&](int a, T(&gv)[SW]) {
    const int wr = r + H0 + a;
    const bool row_ok = (unsigned)wr < (unsigned)oh;
    const T* __restrict__ grow = grad + (plane * oh + wr) * ow + c + W0;
#pragma unroll
    for (int b = 0; b < SW; ++b) gv[b] = row_ok && col_ok[b] ? grow[b] : T();
  };
  // rows loaded ahead of their divisions: every row in a cell of stride 2 (few rows), one
  // row in a cell of stride 1 (each row's loads start before the divisions of the row above)
  constexpr int AHEAD = S == 2 ? SH : 1;
  T ahead[AHEAD][SW];
#pragma unroll
  for (int a = 0; a < AHEAD; ++a) load_row(a, ahead[a]);
  // along_w[a][uw]: the sum along W for column uw of the windows of slot row a, once for every
  // row of the cell. A slot past the gradient's edge holds q = +0, which leaves a sum from +0
  // as it is (such a sum is never -0): only whether a window's taps reach a position is tested.
  A along_w[SH][V];
#pragma unroll
  for (int a = 0; a < SH; ++a) {
    T gv[SW];
#pragma unroll
    for (int b = 0; b < SW; ++b) gv[b] = ahead[a % AHEAD][b];
    if (a + AHEAD < SH) load_row(a + AHEAD, ahead[a % AHEAD]);
    // the loads ahead are started before this row's divisions: else the compiler moves each
    // load next to its division, whose slow path is a branch it does not schedule loads across
    asm volatile("" ::: "memory");
    const int wr = r + H0 + a;
    const A div_h = (unsigned)wr >= (unsigned)oh ? (A)1
                    : divisor_override > 0       ? (A)divisor_override
                                                 : (A)count_taps<int, KH>(wr, S, p_h, k_h, 1,
                                                                          lo_h, hi_h);
    A q[SW];
#pragma unroll
    for (int b = 0; b < SW; ++b) q[b] = Num<T>::load(gv[b]) / (div_h * div_w[b]);
#pragma unroll
    for (int uw = 0; uw < V; ++uw) {
      const int col = S * c + uw;
      along_w[a][uw] = (A)0;
#pragma unroll
      for (int b = CC::lo(S, KW, PW, uw) - W0; b <= CC::hi(S, KW, PW, uw) - W0; ++b) {
        if ((unsigned)(col + p_w - S * (c + W0 + b)) < (unsigned)k_w) along_w[a][uw] += q[b];
      }
    }
    // the rows of the cell whose last covering slot row is a
#pragma unroll
    for (int uh = 0; uh < R; ++uh) {
      if (CC::hi(S, KH, PH, uh) - H0 != a) continue;
      store_cell_row<S, V>(out, plane, r, c, ih, iw, uh, [&](int uw, int row) {
        A acc = (A)0;
#pragma unroll
        for (int s = CC::lo(S, KH, PH, uh) - H0; s <= a; ++s) {
          // window r + H0 + s covers the row when its taps reach it
          if ((unsigned)(row + p_h - S * (r + H0 + s)) < (unsigned)k_h) acc += along_w[s][uw];
        }
        return Num<T>::store(acc);
      });
    }
  }
}

}  // namespace gp

// max_pool's backward by cells (2-D NCHW, 32-bit offsets; the host checks the geometry):
// windows of stride 2 with kh, kw of 2 or 3 taps, no dilation, pads ph, pw of 0 or 1. Along
// a dim, window o covers the padded positions 2o .. 2o + k - 1, so position i is covered by
// window (i + p) / 2 and, with 3 taps where i + p is even, by the one before (gp::CellCovers).
// A thread takes a cell of 2 input rows (2r, 2r + 1) by V = GP_CELL_COLUMNS columns from 2c
// (c a multiple of V / 2). Each window that may cover one of its positions loads once,
// its index as its low 32-bit word, with its gradient; an input's gradient is +0 plus, in
// row-major order of the windows that may cover it, the gradient of each whose index names it
// (one that does not cover it never does where each index is -1 or a position of its window:
// max_cells_backward's caller has checked that; max_cells_checked_backward checks it as it
// goes, and where one is not, stores 1 in flags[0], which the host cleared; its registers are
// held to 4 blocks per SM, 3 for 8-byte elements, so that each scheduler keeps enough warps
// to issue from). 3 x 3 taps with pads 1 and 2 x 2 with pads 0 take their covering windows
// compiled in, the others the two per dim that hold them. Each row of the cell is stored as a
// row tile (gp::store_row_tile: 16-byte words where it lies whole inside the input row on an
// aligned address).
// grid: x = chunks of blockDim.x cells along W, y = groups of blockDim.y row pairs, z = planes
// (the host keeps them within 65535). block: (TX, TY, 1).
namespace gp {

template <bool CHECKS, typename T>
__device__ __forceinline__ void max_cells(const T* __restrict__ grad,
                                          const long long* __restrict__ indices,
                                          T* __restrict__ out, int* __restrict__ flags, int ih,
                                          int iw, int oh, int ow, int kh, int kw, int ph,
                                          int pw) {
  const int plane = (int)blockIdx.z;
  const int r = (int)blockIdx.y * (int)blockDim.y + (int)threadIdx.y;
  const int c = ((int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x) * (GP_CELL_COLUMNS / 2);
  if (2 * r >= ih || 2 * c >= iw) return;
  bool valid;
  if (kh == 3 && kw == 3 && ph == 1 && pw == 1) {
    valid = max_cell<CHECKS, 3, 1, 3, 1>(grad, indices, out, plane, r, c, ih, iw, oh, ow, kh,
                                         kw, ph, pw);
  } else if (kh == 2 && kw == 2 && ph == 0 && pw == 0) {
    valid = max_cell<CHECKS, 2, 0, 2, 0>(grad, indices, out, plane, r, c, ih, iw, oh, ow, kh,
                                         kw, ph, pw);
  } else {
    valid = max_cell<CHECKS, 0, 0, 0, 0>(grad, indices, out, plane, r, c, ih, iw, oh, ow, kh,
                                         kw, ph, pw);
  }
  if (CHECKS && !valid) flags[0] = 1;
}

}  // namespace gp

template <typename T>
__global__ void __launch_bounds__(GP_BLOCK_THREADS)
    max_cells_backward(const T* __restrict__ grad, const long long* __restrict__ indices,
                       T* __restrict__ out, int ih, int iw, int oh, int ow, int kh, int kw,
                       int ph, int pw) {
  gp::max_cells<false>(grad, indices, out, (int*)nullptr, ih, iw, oh, ow, kh, kw, ph, pw);
}

template <typename T>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, sizeof(T) == 8 ? 3 : 4)
    max_cells_checked_backward(const T* __restrict__ grad,
                               const long long* __restrict__ indices, T* __restrict__ out,
                               int* __restrict__ flags, int ih, int iw, int oh, int ow, int kh,
                               int kw, int ph, int pw) {
  gp::max_cells<true>(grad, indices, out, flags, ih, iw, oh, ow, kh, kw, ph, pw);
}

// avg_pool's backward by cells (2-D NCHW, 32-bit offsets; the host checks the geometry): windows
// of stride S along H and W, 2 or 3 taps, no dilation, pads 0 or 1 before. A thread takes a
// cell of R rows by V columns from (S r, S c): stride 2, 2 rows (r a row pair) by
// GP_CELL_COLUMNS, the grid and block of max_cells_backward; stride 1, GP_CELL1_ROWS by
// GP_CELL1_COLUMNS, the cells of the `planes` planes numbered row-major over (plane, cell row,
// cell column), blockDim.x of them a block along grid x (so that a narrow plane leaves no warp
// part empty). Each window that may cover one of its positions loads its gradient once and
// divides it by its divisor once (gp::avg_cell); divisors as avg_window_backward's (peh, pew
// the end pads). 3 x 3 taps with pads 1 (and 2 x 2 with pads 0 at stride 2) take their
// covering windows compiled in, the others those of every such window.
template <typename T, int S>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, 1)
    avg_cells_backward(const T* __restrict__ grad, T* __restrict__ out, int planes, int ih,
                       int iw, int oh, int ow, int kh, int kw, int ph, int pw, int peh, int pew,
                       int include_pad, int divisor_override) {
  static_assert(S == 1 || S == 2, "cells of stride 1 or 2");
  constexpr int R = S == 2 ? 2 : GP_CELL1_ROWS, V = S == 2 ? GP_CELL_COLUMNS : GP_CELL1_COLUMNS;
  int plane, r, c;
  if constexpr (S == 1) {
    const int across = (iw + V - 1) / V, per_plane = across * ((ih + R - 1) / R);
    const int t = (int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x;
    plane = t / per_plane;
    if (plane >= planes) return;
    const int k = t - plane * per_plane;
    const int cell_row = k / across;
    r = cell_row * R;
    c = (k - cell_row * across) * V;
  } else {
    plane = (int)blockIdx.z;
    r = (int)blockIdx.y * (int)blockDim.y + (int)threadIdx.y;
    c = ((int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x) * (V / 2);
    if (2 * r >= ih || 2 * c >= iw) return;
  }
  const int lo_h = include_pad ? -ph : 0, hi_h = include_pad ? ih + peh : ih;
  const int lo_w = include_pad ? -pw : 0, hi_w = include_pad ? iw + pew : iw;
  if (kh == 3 && kw == 3 && ph == 1 && pw == 1) {
    gp::avg_cell<S, R, V, 3, 1, 3, 1>(grad, out, plane, r, c, ih, iw, oh, ow, kh, kw, ph, pw,
                                      lo_h, hi_h, lo_w, hi_w, divisor_override);
  } else if (S == 2 && kh == 2 && kw == 2 && ph == 0 && pw == 0) {
    gp::avg_cell<S, R, V, 2, 0, 2, 0>(grad, out, plane, r, c, ih, iw, oh, ow, kh, kw, ph, pw,
                                      lo_h, hi_h, lo_w, hi_w, divisor_override);
  } else {
    gp::avg_cell<S, R, V, 0, 0, 0, 0>(grad, out, plane, r, c, ih, iw, oh, ow, kh, kw, ph, pw,
                                      lo_h, hi_h, lo_w, hi_w, divisor_override);
  }
}

// adaptive_max_pool's (and global_max_pool's) backward from its int64 indices.
template <typename T, typename I, bool NHWC>
__global__ void max_adaptive_backward(const T* __restrict__ grad,
                                      const long long* __restrict__ indices, T* __restrict__ out,
                                      GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  gp::max_gather<T, I, NHWC>(grad, indices, out, gp::AdaptiveCovers<I>{g}, g);
}

// avg_pool's backward: q = grad / divisor, the divisor as the forward's (divisor_override when
// > 0, else the product over dims of the taps inside [-pad_begin, size + pad_end) with
// include_pad, or of the valid taps; ped/peh/pew the end pads). A covering window has a valid
// tap, so its divisor is never 0.
template <typename T, typename I, bool NHWC, int C>
__global__ void GP_GATHER_BOUNDS(T, I, C)
    avg_window_backward(const T* __restrict__ grad, T* __restrict__ out, GP_GEO_PARAMS(I), int gd,
                        int gh, int gw, int ped, int peh, int pew, int include_pad,
                        int divisor_override) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const I lo_d = include_pad ? -(I)g.pd : (I)0, hi_d = include_pad ? g.id + (I)ped : g.id;
  const I lo_h = include_pad ? -(I)g.ph : (I)0, hi_h = include_pad ? g.ih + (I)peh : g.ih;
  const I lo_w = include_pad ? -(I)g.pw : (I)0, hi_w = include_pad ? g.iw + (I)pew : g.iw;
  const auto q = [&](T gv, const gp::Window<I>& o) {
    long long divisor = divisor_override;
    if (divisor_override <= 0) {
      divisor = (long long)gp::count_taps<I>(o.o_d, g.sd, g.pd, g.kd, g.dd, lo_d, hi_d) *
                gp::count_taps<I>(o.o_h, g.sh, g.ph, g.kh, g.dh, lo_h, hi_h) *
                gp::count_taps<I>(o.o_w, g.sw, g.pw, g.kw, g.dw, lo_w, hi_w);
    }
    return gp::Num<T>::load(gv) / (A)divisor;
  };
  gp::sum_gather<T, I, NHWC, C>(grad, out, gp::WindowCovers<I>{g, gd, gh, gw}, g,
                                gp::GradAt<T, I>{grad}, q, gp::Unchanged());
}

// lp_pool's backward (p > 0 finite, as A): q = grad (p == 1), grad / y (p == 2) or
// grad * y**(1-p), 0 where y is 0 (p != 1); a nonzero sum times sign(x) (p == 1), x (p == 2)
// or sign(x) * |x|**(p-1), 0 where x is 0; a zero sum gives +0. y: the forward's output.
template <typename T, typename I, bool NHWC, int C>
__global__ void GP_GATHER_BOUNDS(T, I, C)
    lp_window_backward(const T* __restrict__ grad, const T* __restrict__ y,
                       const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I), int gd,
                       int gh, int gw, typename gp::Num<T>::acc p) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  // y only where q reads it (p != 1)
  const auto ld = [&](const gp::Window<I>& o, bool ok) {
    return gp::GradY<T>{gp::tap_load(grad, (I)1, o.at, ok),
                        gp::tap_load(y, (I)1, o.at, ok && p != (A)1)};
  };
  const auto q = [&](const gp::GradY<T>& v, const gp::Window<I>&) {
    const A gv = gp::Num<T>::load(v.grad);
    if (p == (A)1) return gv;
    const A yv = gp::Num<T>::load(v.y);
    if (yv == (A)0) return (A)0;
    return p == (A)2 ? gv / yv : gv * (A)pow(yv, (A)1 - p);
  };
  const auto finish = [&](A s, I ii) {
    const A v = gp::Num<T>::load(x[ii]);
    A inner = v;  // p == 2; NaN stays NaN
    if (p == (A)1) {
      inner = v > (A)0 ? (A)1 : v < (A)0 ? (A)-1 : v == (A)0 ? (A)0 : v;
    } else if (p != (A)2) {
      inner = v == (A)0 ? (A)0 : (v < (A)0 ? -(A)pow(-v, p - (A)1) : (A)pow(v, p - (A)1));
    }
    return s == (A)0 ? (A)0 : s * inner;  // +0 for a zero sum: no 0 * inf, no -0
  };
  gp::sum_gather<T, I, NHWC, C>(grad, out, gp::WindowCovers<I>{g, gd, gh, gw}, g, ld, q, finish);
}

// adaptive_avg_pool's (and global_avg_pool's) backward: q = grad / the window's tap count.
template <typename T, typename I, bool NHWC>
__global__ void avg_adaptive_backward(const T* __restrict__ grad, T* __restrict__ out,
                                      GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const auto q = [&](T gv, const gp::Window<I>& o) {
    const long long count = (long long)gp::adaptive_line<I>(o.o_d, g.id, g.od).n *
                            gp::adaptive_line<I>(o.o_h, g.ih, g.oh).n *
                            gp::adaptive_line<I>(o.o_w, g.iw, g.ow).n;
    return gp::Num<T>::load(gv) / (A)count;
  };
  gp::sum_gather<T, I, NHWC, 0>(grad, out, gp::AdaptiveCovers<I>{g}, g, gp::GradAt<T, I>{grad},
                                q, gp::Unchanged());
}

// avg_pool's backward where the windows tile the input exactly (stride == kernel, no dilation,
// no padding, each input dim kernel * output dim, 2 wide along W; NCHW): each input element
// is covered by one window, its gradient (A)0 + grad / divisor (the nested sum of one q, as
// avg_window_backward's), divisor > 0 the forward's (every window holds kd * kh * 2 taps).
// grid: x = chunks of TX packs along a grad row, y/z = groups of TY grad rows (rows: slices x
// oh, a slice a plane's D position). block: (TX, TY, 1). thread: a pack of P = 8 / sizeof(T)
// consecutive grad elements of a row (the row's last pack may hold fewer), all loaded before
// any is divided, and the kd * kh input rows of its windows, each a run of 2P elements stored
// as one 16-byte vector where it lies whole inside the row on a 16-byte aligned address.
template <typename T, typename I>
__global__ void avg_tiles_backward(const T* __restrict__ grad, T* __restrict__ out, I rows,
                                   I oh, I ow, int kd, int kh, int divisor) {
  typedef typename gp::Num<T>::acc A;
  constexpr int P = 8 / (int)sizeof(T);
  const I r = (I)gp::block_plane() * (I)blockDim.y + (I)threadIdx.y;
  const I w0 = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) * (I)P;
  if (r >= rows || w0 >= ow) return;
  const T* __restrict__ src = grad + r * ow;
  T gv[P];
#pragma unroll
  for (int u = 0; u < P; ++u) gv[u] = src[w0 + (I)u < ow ? w0 + (I)u : w0];
  const A div = (A)(long long)divisor;
  gp::Pack<T, 2 * P> pack;
#pragma unroll
  for (int u = 0; u < P; ++u) {
    const T q = gp::Num<T>::store((A)0 + gp::Num<T>::load(gv[u]) / div);
    pack.v[2 * u] = q;
    pack.v[2 * u + 1] = q;
  }
  // input rows kh * (r + slice * (kd - 1) * oh) + a * oh * kh + b of the windows' taps (a, b)
  const I first = (I)kh * (kd > 1 ? r + (r / oh) * (I)(kd - 1) * oh : r);
  const I iw = (I)2 * ow;
  const bool whole = w0 + (I)P <= ow;
  for (int a = 0; a < kd; ++a) {
    for (int b = 0; b < kh; ++b) {
      T* __restrict__ dst = out + (first + (I)a * oh * (I)kh + (I)b) * iw + (I)2 * w0;
      if (whole && (unsigned long long)dst % sizeof(pack) == 0) {
        *reinterpret_cast<gp::Pack<T, 2 * P>*>(dst) = pack;
      } else {
#pragma unroll
        for (int u = 0; u < 2 * P; ++u) {
          if (w0 + (I)(u / 2) < ow) dst[u] = pack.v[u];
        }
      }
    }
  }
}

// avg_pool's backward where the windows tile the input exactly (stride == kernel, no dilation,
// no padding, each input dim kernel * output dim; NHWC): each input element is covered by one
// window, its gradient (A)0 + grad / divisor (as avg_tiles_backward's), channel by channel.
// grid: x = chunks of TX packs of a grad row's positions' channels, y/z = groups of TY grad
// rows (rows: batch x od x oh). block: (TX, TY, 1). thread: a pack of V = 16 / sizeof(T)
// channels of one grad position (a position's last pack may hold fewer), loaded and divided
// once and stored at the kd * kh * kw input positions of its window, each as one 16-byte
// vector where it lies whole inside the channels on a 16-byte aligned address.
template <typename T, typename I>
__global__ void avg_channel_tiles_backward(const T* __restrict__ grad, T* __restrict__ out,
                                           I rows, I oh, I ow, I chans, int kd, int kh, int kw,
                                           int divisor) {
  typedef typename gp::Num<T>::acc A;
  constexpr int V = 16 / (int)sizeof(T);
  const I r = (I)gp::block_plane() * (I)blockDim.y + (I)threadIdx.y;
  const I packs = (chans + (I)(V - 1)) / (I)V;
  const I t = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;  // pack of the row
  if (r >= rows || t >= ow * packs) return;
  const I w = t / packs;
  const I c0 = (t - w * packs) * (I)V;
  const bool whole = c0 + (I)V <= chans;
  const T* __restrict__ src = grad + (r * ow + w) * chans + c0;
  gp::Pack<T, V> pack;
  if (whole && (unsigned long long)src % sizeof(pack) == 0) {
    pack = *reinterpret_cast<const gp::Pack<T, V>*>(src);
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) pack.v[u] = src[c0 + (I)u < chans ? (I)u : (I)0];
  }
  const A div = (A)(long long)divisor;
#pragma unroll
  for (int u = 0; u < V; ++u) {
    pack.v[u] = gp::Num<T>::store((A)0 + gp::Num<T>::load(pack.v[u]) / div);
  }
  // input rows kh * (r + slice * (kd - 1) * oh) + a * oh * kh + b of the windows' taps (a, b)
  const I first = (I)kh * (kd > 1 ? r + (r / oh) * (I)(kd - 1) * oh : r);
  const I ih = (I)kh * oh, iw = (I)kw * ow;
  for (int a = 0; a < kd; ++a) {
    for (int b = 0; b < kh; ++b) {
      T* __restrict__ row = out + ((first + (I)a * ih + (I)b) * iw + w * (I)kw) * chans + c0;
      for (int c = 0; c < kw; ++c) {
        T* __restrict__ dst = row + (I)c * chans;
        if (whole && (unsigned long long)dst % sizeof(pack) == 0) {
          *reinterpret_cast<gp::Pack<T, V>*>(dst) = pack;
        } else {
#pragma unroll
          for (int u = 0; u < V; ++u) {
            if (c0 + (I)u < chans) dst[u] = pack.v[u];
          }
        }
      }
    }
  }
}

namespace gp {

// A global average backward's pack of V elements from element e0 of `out`: one vector where it
// lies inside the group [first, end) on 16 bytes, else its elements inside the group one by one.
template <typename T, typename I, int V>
__device__ __forceinline__ void store_broadcast_pack(T* __restrict__ out, I e0, I first, I end,
                                                     const Pack<T, V>& pack) {
  T* __restrict__ dst = out + e0;
  if (e0 >= first && e0 + (I)V <= end && ((unsigned long long)dst % sizeof(pack)) == 0) {
    *reinterpret_cast<Pack<T, V>*>(dst) = pack;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (e0 + (I)j >= first && e0 + (I)j < end) dst[j] = pack.v[j];
    }
  }
}

}  // namespace gp

// The backward of a global average (an adaptive average to size 1 in every dim), a broadcast:
// element e of `out` (planes x plane_len elements, plane_len = size * chans; chans 1 for NCHW)
// is (A)0 + grad[k] / size (the nested sum of its one window), k = e / size for NCHW, else
// (e / plane_len) * chans + e % chans.
// grid: x = chunks of a group of `group` consecutive planes (contiguous in `out`; a group of
// several planes holds fewer than 2**20 elements), y/z = groups (the last may hold fewer
// planes). block: (TX, 1, 1), TX a multiple of 32. thread: M = GP_BROADCAST_PACKS packs of
// V = 16 / sizeof(T) consecutive elements of its group, packs counted from the V-aligned
// element at or below the group's first; warp w of the grid takes packs 32 M w + 32 m + lane,
// m < M, so that each store of a warp is contiguous. A pack inside the group whose address is
// 16-byte aligned is stored as one vector. Where an NCHW plane holds at least V elements, a
// pack's elements from the group's first on lie in two planes, k and k + 1: the block divides
// the gradient of each plane its elements lie in once, into shared memory (at most TX * M + 2
// planes), and a pack finds k in the group from a float quotient one off at most, with no
// integer division; else k is divided out for the pack's first element inside the group and
// stepped from there (an element before the group's first takes that one's gradient, one past
// its end the last one's).
template <typename T, typename I, bool NHWC>
__global__ void avg_global_backward(const T* __restrict__ grad, T* __restrict__ out, I planes,
                                    I chans, I size, int group) {
  typedef typename gp::Num<T>::acc A;
  constexpr int V = 16 / (int)sizeof(T), M = GP_BROADCAST_PACKS;
  const long long gi = gp::block_plane();
  if (gi * (long long)group >= (long long)planes) return;
  const I plane_len = size * chans;
  const I p0 = (I)gi * (I)group;
  const I first = p0 * plane_len;
  const I end = (p0 + (I)group < planes ? p0 + (I)group : planes) * plane_len;
  const I lane = (I)(threadIdx.x % 32);
  const I block_base = first - first % (I)V + (I)blockIdx.x * (I)blockDim.x * (I)(M * V);
  const I pk = ((I)threadIdx.x - lane) * (I)M + lane;
  const I base = block_base + pk * (I)V;
  const A divisor = (A)(long long)size;
  if (!NHWC && size >= (I)V) {
    __shared__ T quotient[GP_BLOCK_THREADS * M + 2];
    // the plane in the group of element first + o (0 <= o < 2**20), from a float quotient
    const float inverse = 1.0f / (float)size;
    const auto plane_of = [&](I o) {
      I q = (I)((float)o * inverse);
      q -= q * size > o ? (I)1 : (I)0;
      q += (q + (I)1) * size <= o ? (I)1 : (I)0;
      return p0 + q;
    };
    const I lo = block_base < first ? first : block_base;
    const I span = (I)blockDim.x * (I)(M * V) - (I)1;  // the block's last element, at most
    const I hi = end - (I)1 - block_base < span ? end - (I)1 : block_base + span;
    const I pa = group > 1 ? plane_of(lo - first) : p0;
    const I pz = group > 1 ? plane_of(hi - first) : p0;
    for (I t = (I)threadIdx.x; t <= pz - pa; t += (I)blockDim.x) {
      quotient[t] = gp::Num<T>::store((A)0 + gp::Num<T>::load(grad[pa + t]) / divisor);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const I e0 = base + (I)(32 * V * m);
      if (e0 >= end) break;
      const I s0 = e0 < first ? first : e0;
      const I b = group > 1 ? plane_of(s0 - first) : p0;
      const I cut = (b + (I)1) * size;
      const T qa = quotient[b - pa], qb = quotient[(b < pz ? b + (I)1 : b) - pa];
      gp::Pack<T, V> pack;
#pragma unroll
      for (int j = 0; j < V; ++j) pack.v[j] = e0 + (I)j < cut ? qa : qb;
      gp::store_broadcast_pack(out, e0, first, end, pack);
    }
    return;
  }
  T gv[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const I e0 = base + (I)(32 * V * m);
    const I s0 = e0 < first ? first : (e0 < end ? e0 : end - (I)1);
    I b = s0 / plane_len;
    I r = s0 - b * plane_len;
    I c = NHWC ? r % chans : (I)0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      gv[m][j] = grad[b * chans + c];
      const I e = e0 + (I)j;
      if (e >= first && e + (I)1 < end) {
        if (NHWC) c = c + (I)1 == chans ? (I)0 : c + (I)1;
        r += (I)1;
        if (r == plane_len) {
          r = (I)0;
          b += (I)1;
        }
      }
    }
  }
  // Without this fence the compiler moves each load next to its division, whose slow path is
  // a branch it does not schedule loads across: the loads would then wait one by one.
  asm volatile("" ::: "memory");
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const I e0 = base + (I)(32 * V * m);
    if (e0 >= end) break;
    gp::Pack<T, V> pack;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      pack.v[j] = gp::Num<T>::store((A)0 + gp::Num<T>::load(gv[m][j]) / divisor);
    }
    gp::store_broadcast_pack(out, e0, first, end, pack);
  }
}
