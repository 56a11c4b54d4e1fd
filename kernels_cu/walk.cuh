// Window walks: the taps of a sliding or adaptive window, per dim (TapLine), visited in
// row-major order or summed in the nested orders of the NumPy backend (the forward's
// separable sums; the backward kernels walk lines of windows the same way).
//
// The interfaces, written once here:
//
// * Tap sources, the windows of an output (WindowTaps: sliding; AdaptiveTaps; RowTaps: the
//   windows of a row tile). Each has
//     joint, flat_max, row_tile, kd/kh/kw   what the kernels compile in around it
//     (o_d, o_h, o_w, f)                    f(pos) per valid tap, row-major (walk_row_major)
//     batched<G>(o, n, f)                   the taps of n <= G outputs for the output
//                                           visitors f[j] (walk_row_major_batched)
//     sum(o_d, o_h, o_w, term, zero, count) / sums<G>(o, n, term, zero, sum, count)
//                                           separable sums of term (sum_separable_batched)
//   (RowTaps has batched and sums only: a tile is always G = GP_ROW_TILE outputs.)
// * Output visitors (accumulate.cuh MaxOfTaps): F::skips (take only the valid taps, else every
//   slot), v = load(pos, ok) (ok false: load nothing, return a value take leaves without
//   effect), take(v, pos) in row-major tap order.
// * Terms (accumulate.cuh TapTerm): v = load(pos, ok) as above, apply(v) the summed term.
// * Line visitors of the backward gathers (pool_backward.cu): F::skips,
//   v = load(o, pd, ph, pw, ok), take(o, v, pd, ph, pw), and plane(o) / plane_end(o) /
//   row(o) / row_end(o) around each valid D tap and (D, H) pair (walk_lines_batched).
#pragma once
#include "geometry.cuh"
#include "thread_map.cuh"
#include "traits.cuh"

namespace gp {

// The window walk, written once, over the valid taps of the lines (d, h, w); a tap's flat
// position in the spatial plane is pos = (pd * h.size + ph) * w.size + pw. NH, NW: the H and W
// tap counts when compiled in (0: h.n, w.n).
//
// Row-major order (D, then H, then W), calling f(pos) per tap: the order of max pooling's
// first-tap rule and of the integer sums.
template <int NH, int NW, typename I, typename F>
__device__ __forceinline__ void walk_row_major(const TapLine<I>& d, const TapLine<I>& h,
                                               const TapLine<I>& w, F& f) {
  const I nh = NH ? (I)NH : h.n;
  const I nw = NW ? (I)NW : w.n;
  for (I a = 0; a < d.n; ++a) {
    const I pd = d.first + a * d.step;
    if (pd < 0 || pd >= d.size) continue;
#pragma unroll
    for (I b = 0; b < nh; ++b) {
      const I ph = h.first + b * h.step;
      if (ph < 0 || ph >= h.size) continue;
      const I rowbase = (pd * h.size + ph) * w.size;
#pragma unroll
      for (I c = 0; c < nw; ++c) {
        const I pw = w.first + c * w.step;
        if (pw < 0 || pw >= w.size) continue;
        f(rowbase + pw);
      }
    }
  }
}

// Whether tap t of a line lies inside it (t < n) and at a valid position; its position.
template <typename I>
__device__ __forceinline__ bool tap_valid(const TapLine<I>& l, I t, I& p) {
  p = l.first + t * l.step;
  return t < l.n && p >= 0 && p < l.size;
}

// walk_lines_batched with the line counts read at run time (NC 0), for positions O0 .. O0 + S
// (O0 < n) of the G.
template <int G, int BW, int O0, int S, typename I, typename F>
__device__ __forceinline__ void walk_lines_runtime(const TapLine<I>* d, const TapLine<I>* h,
                                                   const TapLine<I>* w, int n, F& f) {
  I nd = d[O0].n, nh = h[O0].n, nw = w[O0].n;
#pragma unroll
  for (int o = O0 + 1; o < O0 + S; ++o) {
    if (o < n) {
      nd = d[o].n > nd ? d[o].n : nd;
      nh = h[o].n > nh ? h[o].n : nh;
      nw = w[o].n > nw ? w[o].n : nw;
    }
  }
  typedef typename F::value V;
  for (I a = 0; a < nd; ++a) {
    I pd[G];
    bool dok[G];
#pragma unroll
    for (int o = O0; o < O0 + S; ++o) {
      dok[o] = o < n && tap_valid(d[o], a, pd[o]);
      if (dok[o]) f.plane(o);
    }
    for (I b = 0; b < nh; ++b) {
      I ph[G];
      bool hok[G];
#pragma unroll
      for (int o = O0; o < O0 + S; ++o) {
        hok[o] = dok[o] && tap_valid(h[o], b, ph[o]);
        if (hok[o]) f.row(o);
      }
      for (I c0 = 0; c0 < nw; c0 += BW) {
        V v[G][BW];
        I pw[G][BW];
        bool ok[G][BW];
#pragma unroll
        for (int o = O0; o < O0 + S; ++o) {
#pragma unroll
          for (int k = 0; k < BW; ++k) {
            ok[o][k] = hok[o] && tap_valid(w[o], c0 + (I)k, pw[o][k]);
            // a slot that is not ok loads at window (0, 0, 0): no offset is computed from a
            // position outside the lines (or never set)
            const bool s = ok[o][k];
            v[o][k] = f.load(o, s ? pd[o] : (I)0, s ? ph[o] : (I)0, s ? pw[o][k] : (I)0, s);
          }
        }
#pragma unroll
        for (int o = O0; o < O0 + S; ++o) {
#pragma unroll
          for (int k = 0; k < BW; ++k) {
            if (!F::skips || ok[o][k]) f.take(o, v[o][k], pd[o], ph[o], pw[o][k]);
          }
        }
      }
#pragma unroll
      for (int o = O0; o < O0 + S; ++o) {
        if (hok[o]) f.row_end(o);
      }
    }
#pragma unroll
    for (int o = O0; o < O0 + S; ++o) {
      if (dok[o]) f.plane_end(o);
    }
  }
}

// Positions of G that walk_lines_batched walks together with run-time line counts: all G, but
// half of them with 64-bit offsets on sm_100 and later. Those walks (the backward gathers)
// hold their kernels at the 255-register ceiling on every architecture (four positions with
// 64-bit lines: 246 to 254 on sm_90), and ptxas for sm_100 and sm_120 went past it (spills).
template <int G, typename I>
__device__ __forceinline__ constexpr int runtime_span() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  return sizeof(I) == 8 && G % 2 == 0 ? G / 2 : G;
#else
  return G;
#endif
}

// walk_lines_runtime over positions O0 .. G in spans of S, a span only when it holds a
// position below n.
template <int G, int BW, int S, int O0, typename I, typename F>
__device__ __forceinline__ void walk_lines_spans(const TapLine<I>* d, const TapLine<I>* h,
                                                 const TapLine<I>* w, int n, F& f) {
  static_assert(G % S == 0, "spans of S cover the G positions");
  walk_lines_runtime<G, BW, O0, S>(d, h, w, n, f);
  if constexpr (O0 + S < G) {
    if (O0 + S < n) walk_lines_spans<G, BW, S, O0 + S>(d, h, w, n, f);
  }
}

// walk_lines_batched with NC > 0: per D tap, every (H, W) tap of every position in one batch.
template <int G, int NC, typename I, typename F>
__device__ __forceinline__ void walk_lines_fixed(const TapLine<I>* d, const TapLine<I>* h,
                                                 const TapLine<I>* w, int n, F& f) {
  I nd = d[0].n;
#pragma unroll
  for (int o = 1; o < G; ++o) {
    if (o < n) nd = d[o].n > nd ? d[o].n : nd;
  }
  typedef typename F::value V;
  for (I a = 0; a < nd; ++a) {
    I pd[G], ph[G][NC], pw[G][NC];
    bool dok[G], hok[G][NC], ok[G][NC][NC];
    V v[G][NC][NC];
#pragma unroll
    for (int o = 0; o < G; ++o) {
      dok[o] = o < n && tap_valid(d[o], a, pd[o]);
#pragma unroll
      for (int b = 0; b < NC; ++b) hok[o][b] = dok[o] && tap_valid(h[o], (I)b, ph[o][b]);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const bool wok = tap_valid(w[o], (I)c, pw[o][c]);
#pragma unroll
        for (int b = 0; b < NC; ++b) {
          const bool s = ok[o][b][c] = hok[o][b] && wok;
          v[o][b][c] = f.load(o, s ? pd[o] : (I)0, s ? ph[o][b] : (I)0, s ? pw[o][c] : (I)0, s);
        }
      }
    }
#pragma unroll
    for (int o = 0; o < G; ++o) {
      if (dok[o]) f.plane(o);
#pragma unroll
      for (int b = 0; b < NC; ++b) {
        if (!hok[o][b]) continue;
        f.row(o);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (!F::skips || ok[o][b][c]) f.take(o, v[o][b][c], pd[o], ph[o][b], pw[o][c]);
        }
        f.row_end(o);
      }
      if (dok[o]) f.plane_end(o);
    }
  }
}

// Row-major order over the lines of G positions at once (d[o], h[o], w[o] of position o < n,
// each with counts of its own), the loads of a batch of taps started before any is used. Per
// batch -- one (D, H) pair and BW W taps of every position (of each span, runtime_span);
// with NC > 0 (every H and W line
// has at most NC taps), one D tap and all the (H, W) taps of every position -- v =
// f.load(o, pd, ph, pw, ok) for every slot (ok false: a position o >= n, a tap past its line's
// end or outside [0, size), which loads nothing), then, per position, f.take(o, v, pd, ph, pw)
// for its valid taps in order (F::skips), or for every slot of its valid (D, H) pairs (a slot
// that is not ok then loads a value take leaves without effect; with NC 0 those of the other
// pairs too). Around them, per position, in the nesting of a walk over its own lines: f.plane(o)
// before the taps of each valid D tap and f.plane_end(o) after them, f.row(o) / f.row_end(o)
// the same around each valid (D, H) pair; so each position sees exactly the calls, in the
// order, of a walk over its lines alone (walk_row_major).
template <int G, int BW, int NC, typename I, typename F>
__device__ __forceinline__ void walk_lines_batched(const TapLine<I>* d, const TapLine<I>* h,
                                                   const TapLine<I>* w, int n, F& f) {
  if constexpr (NC > 0) {
    walk_lines_fixed<G, NC>(d, h, w, n, f);
  } else {
    walk_lines_spans<G, BW, runtime_span<G, I>(), 0>(d, h, w, n, f);
  }
}

// W taps per batch of the batched walks where the W taps are counted at run time (NW 0); an
// enumerator, which a translation unit that never uses it does not warn about
enum : int { kRunTimeWTaps = 4 };

// Row-major order (D, then H, then W) as walk_row_major, for the windows of G outputs at
// once (lines d[j], h[j], w[j] and visitor f[j] of output j < n; every output's lines have
// the counts of output 0's), with the loads of a batch of taps started before any is used:
// per batch, v = f[j].load(pos, ok) for every tap slot of every output (ok false: an output
// j >= n, a slot past the line's end or in the padding, which loads nothing), then
// f[j].take(v, pos) per output in row-major order, for the valid slots (F::skips) or for
// every slot (a slot that is not ok then loads a value take leaves without effect). A batch: BD D
// positions x BH H taps x BW W taps, BH and BW the compiled-in counts NH and NW (0: 1 H tap,
// W taps kRunTimeWTaps at a time), BD 2 when both are compiled in and a batch holds at most 4
// (H, W) taps (a batch then covers whole D slices, so row-major order holds), else 1.
template <int G, int NH, int NW, typename I, typename F>
__device__ __forceinline__ void walk_row_major_batched(const TapLine<I>* d, const TapLine<I>* h,
                                                       const TapLine<I>* w, F* f, int n) {
  constexpr int BH = NH ? NH : 1;
  constexpr int BW = NW ? NW : kRunTimeWTaps;
  constexpr int BD = NH && NW && NH * NW <= 4 ? 2 : 1;
  typedef typename F::value V;
  for (I a0 = 0; a0 < d[0].n; a0 += BD) {
    for (I b0 = 0; b0 < h[0].n; b0 += BH) {
      for (I c0 = 0; c0 < w[0].n; c0 += BW) {
        V v[G][BD][BH][BW];
        I pos[G][BD][BH][BW];
        bool ok[G][BD][BH][BW];
#pragma unroll
        for (int o = 0; o < G; ++o) {
#pragma unroll
          for (int i = 0; i < BD; ++i) {
            I pd;
            const bool dok = o < n && tap_valid(d[o], a0 + (I)i, pd);
#pragma unroll
            for (int j = 0; j < BH; ++j) {
              I ph;
              const bool hok = dok && tap_valid(h[o], b0 + (I)j, ph);
#pragma unroll
              for (int k = 0; k < BW; ++k) {
                I pw;
                ok[o][i][j][k] = hok && tap_valid(w[o], c0 + (I)k, pw);
                pos[o][i][j][k] = ok[o][i][j][k] ? (pd * h[o].size + ph) * w[o].size + pw : (I)0;
                v[o][i][j][k] = f[o].load(pos[o][i][j][k], ok[o][i][j][k]);
              }
            }
          }
        }
#pragma unroll
        for (int o = 0; o < G; ++o) {
#pragma unroll
          for (int i = 0; i < BD; ++i) {
#pragma unroll
            for (int j = 0; j < BH; ++j) {
#pragma unroll
              for (int k = 0; k < BW; ++k) {
                if (!F::skips || ok[o][i][j][k]) f[o].take(v[o][i][j][k], pos[o][i][j][k]);
              }
            }
          }
        }
      }
    }
  }
}

// Separable order, the NumPy backend's, so that float sums round alike on both backends:
// the sum over W taps of the sums over H taps of the sums over D taps of term(pos), each
// starting from `zero` (-0 for averages: adding -0 leaves every value as it is, so each sum
// starts from its first tap; +0 for Lp terms, which are never negative, so that an empty
// window sums to +0), for the windows of G outputs at once (lines d[j], h[j], w[j] of output
// j < n, every output's lines with the counts of output 0's): sum[j], and count[j] the number
// of its valid taps. term.load(pos, ok) loads a tap (nothing when !ok), term.apply(v) makes
// its term.
//
// Loads start in batches before any is summed: with one D tap (d.n == 1), every tap slot of
// BH H taps x BW W taps of every output (BH, BW: NH and NW when compiled in, else 1 and
// kRunTimeWTaps);
// with several and run-time W taps (NW 0), per D tap the BW W taps of one H tap of one
// output, each W tap summed over the D taps in a sum of its own (a batch's loads feed separate
// sums, so all start before the first add); with compiled-in W taps, the D taps of one (W, H)
// pair of one output, 4 at a time. Each output's additions are those of the nested sums (W
// outermost, each partial sum from `zero`, skipping the taps outside the input), in their
// order, with the zero added where they skip a tap (no change to any sum: x + zero is x for
// every sum of these terms).
template <int G, int NH, int NW, typename A, typename I, typename F>
__device__ __forceinline__ void sum_separable_batched(const TapLine<I>* d, const TapLine<I>* h,
                                                      const TapLine<I>* w, const F& term,
                                                      A zero, int n, A* sum,
                                                      long long* count) {
  constexpr int BH = NH ? NH : 1;
  constexpr int BW = NW ? NW : kRunTimeWTaps;
  typedef typename F::value V;
  I pd0[G];
  bool d0ok[G];
  I taps[G];  // valid taps: at most the plane's elements, which I indexes
#pragma unroll
  for (int o = 0; o < G; ++o) {
    sum[o] = zero;
    taps[o] = 0;
    d0ok[o] = o < n && tap_valid(d[o], (I)0, pd0[o]);
  }
  const bool one_d = d[0].n == (I)1;
  for (I c0 = 0; c0 < w[0].n; c0 += BW) {
    A sum1[G][BW];
#pragma unroll
    for (int o = 0; o < G; ++o) {
#pragma unroll
      for (int k = 0; k < BW; ++k) sum1[o][k] = zero;
    }
    for (I b0 = 0; b0 < h[0].n; b0 += BH) {
      if (one_d) {
        // every slot's term is added: a slot that is not a valid tap adds the zero of its
        // sums (term.load), which leaves them as the nested sums skipping it would
        V v[G][BH][BW];
#pragma unroll
        for (int o = 0; o < G; ++o) {
#pragma unroll
          for (int j = 0; j < BH; ++j) {
            I ph;
            const bool hok = d0ok[o] && tap_valid(h[o], b0 + (I)j, ph);
#pragma unroll
            for (int k = 0; k < BW; ++k) {
              I pw;
              const bool ok = hok && tap_valid(w[o], c0 + (I)k, pw);
              v[o][j][k] = term.load(ok ? (pd0[o] * h[o].size + ph) * w[o].size + pw : (I)0, ok);
              taps[o] += ok ? 1 : 0;
            }
          }
        }
#pragma unroll
        for (int o = 0; o < G; ++o) {
#pragma unroll
          for (int j = 0; j < BH; ++j) {
#pragma unroll
            for (int k = 0; k < BW; ++k) {
              A sum2 = zero;
              sum2 += term.apply(v[o][j][k]);
              sum1[o][k] += sum2;
            }
          }
        }
      } else {
#pragma unroll
        for (int o = 0; o < G; ++o) {
          if (o >= n) break;
#pragma unroll
          for (int j = 0; j < BH; ++j) {
            I ph;
            if (!tap_valid(h[o], b0 + (I)j, ph)) continue;
            if constexpr (NW == 0) {
              A sum2[BW];
#pragma unroll
              for (int k = 0; k < BW; ++k) sum2[k] = zero;
#pragma unroll 1
              for (I a = 0; a < d[o].n; ++a) {
                I pd;
                const bool dok = tap_valid(d[o], a, pd);
                V v[BW];
#pragma unroll
                for (int k = 0; k < BW; ++k) {
                  I pw;
                  const bool ok = dok && tap_valid(w[o], c0 + (I)k, pw);
                  v[k] = term.load(ok ? (pd * h[o].size + ph) * w[o].size + pw : (I)0, ok);
                  taps[o] += ok ? 1 : 0;
                }
#pragma unroll
                for (int k = 0; k < BW; ++k) sum2[k] += term.apply(v[k]);
              }
#pragma unroll
              for (int k = 0; k < BW; ++k) sum1[o][k] += sum2[k];
            } else {
              // compiled-in W taps: one W tap at a time, its D taps 4 at a time (the W taps
              // side by side would hold the kernel over its register bound)
#pragma unroll
              for (int k = 0; k < BW; ++k) {
                I pw;
                if (!tap_valid(w[o], c0 + (I)k, pw)) continue;
                const I at = ph * w[o].size + pw;
                const I dstep = h[o].size * w[o].size;
                A sum2 = zero;
                for (I a0 = 0; a0 < d[o].n; a0 += 4) {
                  V v[4];
                  bool ok[4];
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    I pd;
                    ok[i] = tap_valid(d[o], a0 + (I)i, pd);
                    v[i] = term.load(ok[i] ? pd * dstep + at : (I)0, ok[i]);
                  }
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    if (ok[i]) {
                      sum2 += term.apply(v[i]);
                      ++taps[o];
                    }
                  }
                }
                sum1[o][k] += sum2;
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int o = 0; o < G; ++o) {
#pragma unroll
      for (int k = 0; k < BW; ++k) sum[o] += sum1[o][k];
    }
  }
#pragma unroll
  for (int o = 0; o < G; ++o) count[o] = taps[o];
}

// The separable sum of one window (sum_separable_batched with G = 1).
template <int NH, int NW, typename A, typename I, typename F>
__device__ __forceinline__ A sum_separable(const TapLine<I>& d, const TapLine<I>& h,
                                           const TapLine<I>& w, const F& term, A zero,
                                           long long& count) {
  A sum;
  sum_separable_batched<1, NH, NW>(&d, &h, &w, term, zero, 1, &sum, &count);
  return sum;
}

// Number of taps t in [0, k) of output o whose position o*s - pb + t*d lies in [lo, hi); K:
// k when compiled in (0: run time). OVERLAP, dilation 1 and k at run time or over 3: the
// overlap of [first, first + k) with [lo, hi), no tap tested (up to 3 taps compiled in,
// testing each is as cheap).
template <typename I, int K = 0, bool OVERLAP = false>
__device__ __forceinline__ int count_taps(I o, int s, int pb, int k, int d, I lo, I hi) {
  const I first = o * (I)s - (I)pb;
  if (OVERLAP && (K == 0 || K > 3) && d == 1) {
    const I span = (I)(K > 0 ? K : k);
    const I begin = max(lo - first, (I)0), end = min(hi - first, span);
    return end > begin ? (int)(end - begin) : 0;
  }
  const auto inside = [&](int t) {
    const I pos = first + (I)t * (I)d;
    return (pos >= lo && pos < hi) ? 1 : 0;
  };
  int n = 0;
  if constexpr (K > 0) {
#pragma unroll
    for (int t = 0; t < K; ++t) n += inside(t);
  } else {
    for (int t = 0; t < k; ++t) n += inside(t);
  }
  return n;
}

// Sliding windows: output o of a dim spans the taps o*s - pb + t*dil, t in [0, k). K: the H
// and W window size when compiled in (0: g.kh, g.kw).
template <int K, typename I>
struct WindowTaps {
  // outputs whose loads batched() can start together
  static constexpr int joint = K ? 2 : 1;
  // the max's take without a short circuit (MaxOfTaps FLAT)
  static constexpr bool flat_max = K != 0;
  static constexpr bool row_tile = false;
  // the D, H and W tap counts the averages' divisors compile in (0: counted in a loop at run
  // time: unrolled counts would hold the compiled-in-K kernels over their register bound)
  static constexpr int kd = 0, kh = 0, kw = 0;
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I o_d, I o_h, I o_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    d = {o_d * (I)g.sd - (I)g.pd, (I)g.kd, (I)g.dd, g.id};
    h = {o_h * (I)g.sh - (I)g.ph, (I)(K ? K : g.kh), (I)g.dh, g.ih};
    w = {o_w * (I)g.sw - (I)g.pw, (I)(K ? K : g.kw), (I)g.dw, g.iw};
  }
  // f(pos) for every valid tap, row-major (see walk_row_major).
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    walk_row_major<K, K>(d, h, w, f);
  }
  // f[j].load / f[j].take for every valid tap of outputs o[j], j < n, row-major, the loads
  // of the G windows in joint batches (see walk_row_major_batched).
  template <int G, typename F>
  __device__ __forceinline__ void batched(const Output<I>* o, int n, F* f) const {
    TapLine<I> d[G], h[G], w[G];
#pragma unroll
    for (int j = 0; j < G; ++j) lines(o[j].o_d, o[j].o_h, o[j].o_w, d[j], h[j], w[j]);
    walk_row_major_batched<G, K, K>(d, h, w, f, n);
  }
  // The separable sum of term(pos) over the valid taps (see sum_separable).
  template <typename A, typename F>
  __device__ __forceinline__ A sum(I o_d, I o_h, I o_w, const F& term, A zero,
                                   long long& count) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    return sum_separable<K, K>(d, h, w, term, zero, count);
  }
  // sum[j], count[j]: the separable sums of outputs o[j], j < n, the loads of the G windows
  // in joint batches (see sum_separable_batched).
  template <int G, typename A, typename F>
  __device__ __forceinline__ void sums(const Output<I>* o, int n, const F& term, A zero, A* sum,
                                       long long* count) const {
    TapLine<I> d[G], h[G], w[G];
#pragma unroll
    for (int j = 0; j < G; ++j) lines(o[j].o_d, o[j].o_h, o[j].o_w, d[j], h[j], w[j]);
    sum_separable_batched<G, K, K>(d, h, w, term, zero, n, sum, count);
  }
};

// Row tiles: the windows of GP_ROW_TILE outputs side by side along W of one output row of a
// 1-D or 2-D NCHW plane (32-bit offsets), KH x KW taps, W stride SW and W dilation DW compiled
// in (the host picks this walk only for those; H stride, pads and H dilation at run time).
// Neighbouring windows overlap along W, so each input row's span of columns is loaded once
// into registers and every window takes its taps from there: per output KH * span / R loads
// and no index arithmetic past the row bases.
//
// VEC > 1: each row's span is loaded as aligned packs of VEC elements (gp::Pack), from the
// column LEAD before the tile's first; the host launches this only where every pack is
// aligned: the input's start on VEC elements, VEC dividing the row length (so a pack lies
// wholly inside a row or wholly outside it) and GP_ROW_TILE * SW (so every tile's first
// column lies LEAD past a pack's start, LEAD = -(W pad) mod VEC). VEC 1: one load per column.
// LEAD -1 (shifted packs): rows that start anywhere in a pack. Each row's span is loaded as
// the aligned packs that cover it, from the pack holding the tile's first column, and moved
// into place by that column's place in its pack, at run time; the host launches this only
// where the input's start and end lie on a pack, so that a pack holding any element of the
// input lies inside it.
template <int KH, int KW, int SW, int DW, int VEC, int LEAD>
struct RowTaps {
  static constexpr bool shifted = LEAD < 0;
  static_assert((shifted || (GP_ROW_TILE * SW) % VEC == 0) && LEAD < VEC,
                "packs aligned in every tile");
  static constexpr int joint = GP_ROW_TILE;
  static constexpr bool flat_max = true;
  static constexpr bool row_tile = true;
  static constexpr int kd = 1, kh = KH, kw = KW;
  // rows of 2-D planes (DepthRowTaps: of 3-D ones)
  static constexpr bool depth = false;
  // input columns the windows of a tile cover
  static constexpr int span = (GP_ROW_TILE - 1) * SW + (KW - 1) * DW + 1;
  // packs per row that cover them
  static constexpr int packs = ((shifted ? VEC - 1 : LEAD) + span + VEC - 1) / VEC;
  const Geo<int>& g;

  // The pack of VEC elements from x[pos] (pos a multiple of VEC), loaded as one unsigned
  // word of its size (one load instruction on the GPU and in the CPU executor alike) where
  // ok, else VEC copies of `none`: the word's registers hold them before the load, whole, so
  // that 2-byte elements stay paired in their registers.
  template <typename T>
  static __device__ __forceinline__ Pack<T, VEC> pack(const T* __restrict__ x, int pos, bool ok,
                                                      T none) {
    typedef typename Word<sizeof(Pack<T, VEC>)>::type W;
    Pack<T, VEC> p;
#pragma unroll
    for (int e = 0; e < VEC; ++e) p.v[e] = none;
    W w;
    memcpy(&w, &p, sizeof p);
    if (ok) w = *reinterpret_cast<const W*>(x + pos);
    memcpy(&p, &w, sizeof p);
    return p;
  }

  // the 32-bit words of a row's `packs` shifted packs of 16 bytes
  static constexpr int shifted_words = packs * 4;

  // w[i] = word i of the packs' elements from element s on (s < VEC, at run time): shifted
  // down by 2 words, then 1, each a select per word, and for 2-byte elements by 1 element, a
  // byte permute of each pair of words.
  template <typename T>
  static __device__ __forceinline__ void shift(unsigned (&w)[shifted_words], int s) {
    constexpr int per = 4 / sizeof(T);
    static_assert(VEC / per == 4, "shifted packs of 16 bytes");
    const int ws = s / per;
#pragma unroll
    for (int i = 0; i + 2 < shifted_words; ++i) w[i] = ws & 2 ? w[i + 2] : w[i];
#pragma unroll
    for (int i = 0; i + 1 < shifted_words; ++i) w[i] = ws & 1 ? w[i + 1] : w[i];
    if constexpr (per == 2) {
      const unsigned odd = s & 1 ? 0x5432u : 0x3210u;
#pragma unroll
      for (int i = 0; i + 1 < shifted_words; ++i) w[i] = __byte_perm(w[i], w[i + 1], odd);
    }
  }

  // v[r][c] for the columns c of pack k of row r < R (c = k * VEC - LEAD + e, e < VEC, within
  // the span) from x[base[r] + c], or f's value of a slot that is not ok where !ok(r, k). A pack
  // the span holds whole is one load, the columns of the others (the first and last, in part
  // outside the span) one load each.
  template <int R, typename F, typename Ok>
  __device__ __forceinline__ void load_packs(const F& f, const int (&base)[R],
                                             typename F::value (&v)[R][span], Ok ok) const {
    typedef typename F::value T;
#pragma unroll
    for (int b = 0; b < R; ++b) {
      F row = f;  // its positions from the row's base: one address per row
      row.xp += base[b];
#pragma unroll
      for (int k = 0; k < packs; ++k) {
        const int c0 = k * VEC - LEAD;
        if (c0 >= 0 && c0 + VEC <= span) {
          const Pack<T, VEC> p = pack(row.xp, c0, ok(b, k), f.load(0, false));
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[b][c0 + e] = p.v[e];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const int c = c0 + e;
            if (c >= 0 && c < span) v[b][c] = row.load(c, ok(b, k));
          }
        }
      }
    }
  }

  // Whether every tile of the plane lies inside it: no window row, column or pack of any tile
  // in the padding or past the plane's end. The same for every thread of a launch, so that
  // the lanes of a warp never split between loading with and without tests: a split warp
  // runs both ways (measured on an H200, the float16 ResNet stem max, whose warps each hold a
  // row's first tile, ran 1.4x faster testing every tile's slots than split).
  __device__ __forceinline__ bool tiles_inside() const {
    const int last_w0 = (g.ow - 1) / joint * (joint * SW) - g.pw;
    // shifted packs: every stored window inside its row; the packs past a row's end that a
    // last tile loads lie inside the input
    const bool columns = shifted   ? (g.ow - 1) * SW + (KW - 1) * DW < g.iw
                         : VEC > 1 ? last_w0 - LEAD + (packs - 1) * VEC < g.iw
                                   : last_w0 + span <= g.iw;
    return g.ph == 0 && g.pw == 0 && LEAD <= 0 && columns &&
           (g.oh - 1) * g.sh + (KH - 1) * g.dh < g.ih;
  }

  // The tile of outputs o[0..G) (consecutive along W, one row) in S D slices slice[u] of the
  // plane: v[u * KH + b][c] = f.load(pos, ok) for column c < span of window row b < KH of
  // slice u (with VEC > 1 the same values from packs), base[u * KH + b] the position of the
  // row's column 0, with rok[b], cok[c] whether row and column lie inside the plane (the
  // slices must); every load starts before any tap is used, and then() uses them: after each
  // way of loading them with EACH (so that 2-byte values stay where their loads put them: at a
  // join the compiler pairs them anew, a PRMT per pair; the max's takes), else after both (the
  // sums, whose loads ptxas then starts together). `inside`: tiles_inside(), where the tile
  // loads without a test per slot.
  template <int S, bool EACH, typename F, typename Then>
  __device__ __forceinline__ void load_slices(const Output<int>& o0, const F& f,
                                              typename F::value (&v)[S * KH][span],
                                              bool (&rok)[KH], bool (&cok)[span],
                                              int (&base)[S * KH], const int (&slice)[S],
                                              bool inside, Then then) const {
    const int h0 = o0.o_h * g.sh - g.ph;
    const int w0 = o0.o_w * SW - g.pw;
#pragma unroll
    for (int c = 0; c < span; ++c) cok[c] = (unsigned)(w0 + c) < (unsigned)g.iw;
#pragma unroll
    for (int b = 0; b < KH; ++b) {
      const int ph = h0 + b * g.dh;
      rok[b] = (unsigned)ph < (unsigned)g.ih;
#pragma unroll
      for (int u = 0; u < S; ++u) base[u * KH + b] = (slice[u] * g.ih + ph) * g.iw + w0;
    }
    const auto loaded = [&] {
      if constexpr (EACH) then();
    };
    if constexpr (shifted) {
      typedef typename F::value T;
      constexpr int per = 4 / sizeof(T);
      // the words of `none` and, outside the row's columns, the bits of each word kept
      unsigned fill, keep[shifted_words];
      {
        T n[per];
#pragma unroll
        for (int e = 0; e < per; ++e) n[e] = f.load(0, false);
        memcpy(&fill, n, sizeof fill);
      }
      if (!inside) {
#pragma unroll
        for (int i = 0; i * per < span; ++i) {
          keep[i] = 0;
#pragma unroll
          for (int e = 0; e < per; ++e) {
            if (i * per + e < span && cok[i * per + e])
              keep[i] |= 0xffffffffu >> (32 - 8 * sizeof(T)) << (8 * sizeof(T) * e);
          }
        }
      }
      // the place of the plane's first element in its pack
      const int plane_at = (int)(reinterpret_cast<size_t>(f.xp) / sizeof(T)) & (VEC - 1);
      typedef Word<16>::type Q;
#pragma unroll
      for (int r = 0; r < S * KH; ++r) {
        const int s = (plane_at + base[r]) & (VEC - 1);
        const Q* at = reinterpret_cast<const Q*>(f.xp + (base[r] - s));
        unsigned w[shifted_words];
#pragma unroll
        for (int k = 0; k < packs; ++k) {
          // a pack that holds a column of the row
          const int c = w0 - s + k * VEC;
          const unsigned fills[4] = {fill, fill, fill, fill};
          Q q;
          memcpy(&q, fills, sizeof q);
          if (rok[r % KH] && (unsigned)(c + VEC - 1) < (unsigned)(g.iw + VEC - 1)) q = at[k];
          memcpy(&w[4 * k], &q, sizeof q);
        }
        shift<T>(w, s);
        if (!inside) {
#pragma unroll
          for (int i = 0; i * per < span; ++i) w[i] = (w[i] & keep[i]) | (fill & ~keep[i]);
        }
#pragma unroll
        for (int c = 0; c < span; c += per) {
          T two[per];
          memcpy(two, &w[c / per], sizeof two);
#pragma unroll
          for (int e = 0; e < per; ++e) {
            if (c + e < span) v[r][c + e] = two[e];
          }
        }
      }
      loaded();
    } else if constexpr (VEC > 1) {
      // pack k starts at column w0 - LEAD + k * VEC; a column outside the row lies in a pack
      // outside it (pok false)
      bool pok[packs];
#pragma unroll
      for (int k = 0; k < packs; ++k) pok[k] = (unsigned)(w0 - LEAD + k * VEC) < (unsigned)g.iw;
      if (inside) {
        load_packs(f, base, v, [](int, int) { return true; });
        loaded();
      } else {
        load_packs(f, base, v, [&](int r, int k) { return rok[r % KH] && pok[k]; });
        loaded();
      }
    } else if (inside) {
#pragma unroll
      for (int r = 0; r < S * KH; ++r) {
#pragma unroll
        for (int c = 0; c < span; ++c) v[r][c] = f.load(base[r] + c, true);
      }
      loaded();
    } else {
#pragma unroll
      for (int r = 0; r < S * KH; ++r) {
#pragma unroll
        for (int c = 0; c < span; ++c) v[r][c] = f.load(base[r] + c, rok[r % KH] && cok[c]);
      }
      loaded();
    }
    if constexpr (!EACH) then();
  }

  // load_slices of the one slice `slice`, then then().
  template <bool EACH, typename F, typename Then>
  __device__ __forceinline__ void load(const Output<int>& o0, const F& f,
                                       typename F::value (&v)[KH][span], bool (&rok)[KH],
                                       bool (&cok)[span], int (&base)[KH], int slice,
                                       bool inside, Then then) const {
    const int one[1] = {slice};
    load_slices<1, EACH>(o0, f, v, rok, cok, base, one, inside, then);
  }

  // f[j].take(v, pos) for the taps of window j < G in row-major order, those of D slice
  // `slice`: every slot (a slot outside the plane loads the lowest value, which never wins;
  // F::skips: by take_slot, then, in a tile not inside the plane, unless_taken with the
  // window's first valid slot). Windows
  // j >= n are taken too and never stored. WHOLE: these are the windows' every tap (a 1-D or
  // 2-D tile, not one D slice of DepthRowTaps): a values-only max takes the first slot by
  // f[j].first, and takes 2-byte values after each way of loading them (load_slices' EACH; in
  // DepthRowTaps' loop over the slices that spilled); where its type has a StoredMax, it
  // reduces the taps as stored, separably, and gives f[j].first their max. `inside`:
  // tiles_inside().
  template <int G, bool WHOLE, typename F>
  __device__ __forceinline__ void batched(const Output<int>* o, F* f, int slice,
                                          bool inside) const {
    static_assert(G == joint, "a row tile takes GP_ROW_TILE outputs at once");
    typename F::value v[KH][span];
    bool rok[KH], cok[span];
    int base[KH];
    constexpr bool each = WHOLE && sizeof(typename F::value) == 2;
    typedef StoredMax<typename F::value> Stored;
    load<each>(o[0], f[0], v, rok, cok, base, slice, inside, [&] {
      if constexpr (WHOLE && !F::skips && Stored::exists) {
        // separable, as stored: each column's max over the rows once, shared by the windows
        // that overlap, then each window's over its columns
        typename F::value column[span];
#pragma unroll
        for (int c = 0; c < span; ++c) {
          column[c] = v[0][c];
#pragma unroll
          for (int b = 1; b < KH; ++b) column[c] = Stored::of(column[c], v[b][c]);
        }
#pragma unroll
        for (int j = 0; j < G; ++j) {
          typename F::value m = column[j * SW];
#pragma unroll
          for (int k = 1; k < KW; ++k) m = Stored::of(m, column[j * SW + k * DW]);
          f[j].first(m);
        }
      } else {
#pragma unroll
        for (int b = 0; b < KH; ++b) {
#pragma unroll
          for (int j = 0; j < G; ++j) {
#pragma unroll
            for (int k = 0; k < KW; ++k) {
              const int c = j * SW + k * DW;
              if constexpr (F::skips) {
                // a tile inside the plane: every slot valid, the first the window's first
                const bool first = b == 0 && k == 0 && inside && f[j].best < 0;
                f[j].take_slot(v[b][c], base[b] + c, first);
              } else if (WHOLE && b == 0 && k == 0) {
                f[j].first(v[b][c]);
              } else {
                f[j].take(v[b][c], base[b] + c);
              }
            }
          }
        }
        if constexpr (F::skips) {
          if (!inside) {
#pragma unroll
            for (int j = 0; j < G; ++j) {
              f[j].unless_taken([&] {
                int first = -1;
#pragma unroll
                for (int b = KH - 1; b >= 0; --b) {
#pragma unroll
                  for (int k = KW - 1; k >= 0; --k) {
                    const int c = j * SW + k * DW;
                    if (rok[b] && cok[c]) first = base[b] + c;
                  }
                }
                return first;
              });
            }
          }
        }
      }
    });
  }

  // batched of a 1-D or 2-D tile: its windows' every tap
  template <int G, typename F>
  __device__ __forceinline__ void batched(const Output<int>* o, int, F* f) const {
    batched<G, true>(o, f, 0, tiles_inside());
  }

  // sum[j], count[j]: the separable sums of windows j < G (those of sum_separable: per W tap
  // the sum over the H taps, then those column sums over the W taps, each from `zero`), the
  // column sums shared between the windows that overlap; a slot outside the plane adds the
  // zero of term.load, which leaves every sum as it is. C: int or long long (the counts are
  // at most KH * KW).
  template <int G, typename A, typename F, typename C>
  __device__ __forceinline__ void sums(const Output<int>* o, int, const F& term, A zero,
                                       A* sum, C* count) const {
    static_assert(G == joint, "a row tile takes GP_ROW_TILE outputs at once");
    typename F::value v[KH][span];
    bool rok[KH], cok[span];
    int base[KH];
    A col[span];
    int rows = 0;
    load<false>(o[0], term, v, rok, cok, base, 0, tiles_inside(), [&] {
#pragma unroll
      for (int c = 0; c < span; ++c) col[c] = zero;
#pragma unroll
      for (int b = 0; b < KH; ++b) {
        rows += rok[b] ? 1 : 0;
#pragma unroll
        for (int c = 0; c < span; ++c) col[c] += term.apply(v[b][c]);
      }
    });
    // the tile's columns inside the row: [first, end)
    const int first = g.pw - o[0].o_w * SW, end = first + g.iw;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      sum[j] = zero;
      int cols = 0;
#pragma unroll
      for (int k = 0; k < KW; ++k) {
        sum[j] += col[j * SW + k * DW];
        if constexpr (DW > 1) cols += cok[j * SW + k * DW] ? 1 : 0;
      }
      if constexpr (DW == 1) cols = min(j * SW + KW, end) - max(j * SW, first);
      count[j] = (C)(cols > 0 ? rows * cols : 0);
    }
  }
};

// Row tiles of 3-D planes: the (H, W) taps of RowTaps per D tap of the window (g.kd, at run
// time) inside the plane, in D order (so row-major order holds); the output rows are the
// (d, h) pairs (outputs_rows with DEPTH); a tap's position counts the slices before its
// own.
template <int KH, int KW, int SW, int DW, int VEC, int LEAD>
struct DepthRowTaps : RowTaps<KH, KW, SW, DW, VEC, LEAD> {
  typedef RowTaps<KH, KW, SW, DW, VEC, LEAD> Rows;
  static constexpr bool depth = true;
  static constexpr int kd = 0;  // D taps at run time
  template <int G, typename F>
  __device__ __forceinline__ void batched(const Output<int>* o, int, F* f) const {
    const Geo<int>& g = this->g;
    const int d0 = o[0].o_d * g.sd - g.pd;
    const bool inside = this->tiles_inside();
#pragma unroll 1
    for (int a = 0; a < g.kd; ++a) {
      const int slice = d0 + a * g.dd;
      if ((unsigned)slice < (unsigned)g.id) Rows::template batched<G, false>(o, f, slice, inside);
    }
  }

  // sum[j], count[j]: the separable sums of windows j < G (those of sum_separable: per (H, W)
  // tap the sum over the D taps inside the plane, then RowTaps::sums' order over H and W,
  // each from `zero`); the D sums of a column are shared between the windows that overlap.
  // C: int or long long (the counts are at most g.kd * KH * KW).
  template <int G, typename A, typename F, typename C>
  __device__ __forceinline__ void sums(const Output<int>* o, int, const F& term, A zero,
                                       A* sum, C* count) const {
    static_assert(G == Rows::joint, "a row tile takes GP_ROW_TILE outputs at once");
    constexpr int span = Rows::span;
    const Geo<int>& g = this->g;
    A dsum[KH][span];
#pragma unroll
    for (int b = 0; b < KH; ++b) {
#pragma unroll
      for (int c = 0; c < span; ++c) dsum[b][c] = zero;
    }
    // D taps per batch, their loads all started before any of their sums; a tap outside the
    // plane loads its nearest slice inside (kept out of the sums)
    constexpr int B = KH * span <= 32 ? 2 : 1;
    typename F::value v[B * KH][span];
    bool rok[KH], cok[span];
    int base[B * KH];
    int slices = 0;
    const int d0 = o[0].o_d * g.sd - g.pd;
    const bool inside = this->tiles_inside();
#pragma unroll 1
    for (int a = 0; a < g.kd; a += B) {
      bool in[B];
      int at[B];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int slice = d0 + (a + u) * g.dd;
        in[u] = a + u < g.kd && (unsigned)slice < (unsigned)g.id;
        at[u] = slice < 0 ? 0 : slice < g.id ? slice : g.id - 1;
      }
      this->template load_slices<B, false>(o[0], term, v, rok, cok, base, at, inside, [&] {
#pragma unroll
        for (int u = 0; u < B; ++u) {
          if (!in[u]) continue;
          ++slices;
#pragma unroll
          for (int b = 0; b < KH; ++b) {
#pragma unroll
            for (int c = 0; c < span; ++c) dsum[b][c] += term.apply(v[u * KH + b][c]);
          }
        }
      });
    }
    int rows = 0;
#pragma unroll
    for (int b = 0; b < KH; ++b) rows += rok[b] ? 1 : 0;
    A col[span];
#pragma unroll
    for (int c = 0; c < span; ++c) {
      col[c] = zero;
#pragma unroll
      for (int b = 0; b < KH; ++b) col[c] += dsum[b][c];
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
      int cols = 0;
      sum[j] = zero;
#pragma unroll
      for (int k = 0; k < KW; ++k) {
        sum[j] += col[j * SW + k * DW];
        cols += cok[j * SW + k * DW] ? 1 : 0;
      }
      count[j] = (C)(slices * rows * cols);
    }
  }
};

// A 3-D geometry whose windows take one D tap each at their own slice (D window 1, D stride
// 1, no D padding: od == id) as the 2-D geometry of its slices, planes * id planes of
// ih x iw; 1-D and 2-D geometries (id == 1) as they are.
__device__ __forceinline__ Geo<int> slices_as_planes(Geo<int> g) {
  g.planes *= g.id;
  g.id = g.od = 1;
  return g;
}

// The geometry of a row tile's launch with what RowTaps compiles in (1 D tap, KH x KW taps,
// W stride SW, W dilation DW) as constants, so that the code using it (the averages' divisors)
// folds them.
template <int KH, int KW, int SW, int DW>
__device__ __forceinline__ Geo<int> row_tile_geo(Geo<int> g) {
  g.id = g.od = 1;
  g.kd = g.sd = g.dd = 1;
  g.pd = 0;
  g.kh = KH;
  g.kw = KW;
  g.sw = SW;
  g.dw = DW;
  return g;
}

// Adaptive windows: output o of a dim of input size n pooled to m spans
// [floor(o*n/m), ceil((o+1)*n/m)), never empty, in integer arithmetic of I (the host picks
// long long when (m + 1) * n does not fit in int); a dim pooled to 1 spans it whole, without
// the divisions. Every tap is valid.
template <typename I>
__device__ __forceinline__ TapLine<I> adaptive_line(I o, I n, I m) {
  if (m == (I)1) return {(I)0, n, (I)1, n};
  const I start = (o * n) / m;
  const I end = ((o + 1) * n + m - 1) / m;
  return {start, end - start, (I)1, n};
}

// adaptive_line with m given as its gp::Divider (no division instruction with 32-bit I).
template <typename I>
__device__ __forceinline__ TapLine<I> adaptive_line(I o, I n, const Divider<I>& m) {
  if (m.d == (I)1) return {(I)0, n, (I)1, n};
  const I start = m.div(o * n);
  return {start, m.div((o + 1) * n + m.d - 1) - start, (I)1, n};
}

// The lines of output (a_d, a_h, a_w)'s adaptive window (COVERS false), or of the outputs
// whose windows cover input position (a_d, a_h, a_w) (COVERS true: input i of a dim of size n
// pooled to m is covered by the o with start(o) <= i < end(o), that is [floor(i*m/n),
// ceil((i+1)*m/n)): adaptive_line with the roles of n and m swapped).
template <bool COVERS, typename I>
__device__ __forceinline__ void adaptive_lines(const Geo<I>& g, I a_d, I a_h, I a_w,
                                               TapLine<I>& d, TapLine<I>& h, TapLine<I>& w) {
  d = COVERS ? adaptive_line<I>(a_d, g.od, g.id) : adaptive_line<I>(a_d, g.id, g.od);
  h = COVERS ? adaptive_line<I>(a_h, g.oh, g.ih) : adaptive_line<I>(a_h, g.ih, g.oh);
  w = COVERS ? adaptive_line<I>(a_w, g.ow, g.iw) : adaptive_line<I>(a_w, g.iw, g.ow);
}

template <typename I>
struct AdaptiveTaps {
  static constexpr int joint = 1;
  static constexpr bool flat_max = true;
  static constexpr bool row_tile = false;
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I o_d, I o_h, I o_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    adaptive_lines<false>(g, o_d, o_h, o_w, d, h, w);
  }
  template <typename F>
  __device__ __forceinline__ void operator()(I o_d, I o_h, I o_w, F& f) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    walk_row_major<0, 0>(d, h, w, f);
  }
  // as WindowTaps::batched, one output at a time (windows differ in size)
  template <int G, typename F>
  __device__ __forceinline__ void batched(const Output<I>* o, int n, F* f) const {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (j >= n) break;
      TapLine<I> d, h, w;
      lines(o[j].o_d, o[j].o_h, o[j].o_w, d, h, w);
      walk_row_major_batched<1, 0, 0>(&d, &h, &w, f + j, 1);
    }
  }
  template <typename A, typename F>
  __device__ __forceinline__ A sum(I o_d, I o_h, I o_w, const F& term, A zero,
                                   long long& count) const {
    TapLine<I> d, h, w;
    lines(o_d, o_h, o_w, d, h, w);
    return sum_separable<0, 0>(d, h, w, term, zero, count);
  }
  // Columns w.first + c and w.first + c + 1 of a window of one D tap (lines h, w), for the
  // lane that walks them: R rows of both at a time, every load of a batch started before any
  // is used, then f(k, v, pos, ok) per slot, row by row, column k = 0 then 1 (pos: the tap's
  // plane position). A slot past the window's last row or column is not ok: it loads nothing
  // and gives `none`. Each column's taps come in row-major order.
  template <int R, typename T, typename F>
  __device__ __forceinline__ void column_pair(const T* __restrict__ xp, const TapLine<I>& h,
                                              const TapLine<I>& w, I c, T none, F f) const {
    const bool on[2] = {c < w.n, c + 1 < w.n};
    const I top = h.first * g.iw + w.first + c;
    const T* __restrict__ p = xp + top;
    for (I b0 = 0; b0 < h.n; b0 += R) {
      T v[R][2];
      bool ok[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool row = b0 + (I)r < h.n;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          ok[r][k] = row && on[k];
          v[r][k] = ok[r][k] ? p[(I)r * g.iw + k] : none;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < 2; ++k) f(k, v[r][k], top + (b0 + (I)r) * g.iw + k, ok[r][k]);
      }
      p += (I)R * g.iw;
    }
  }
};

}  // namespace gp
