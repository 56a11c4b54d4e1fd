// Gathers: one thread per position of a sliding or adaptive pooling's input, reading the
// windows that cover it (no atomics): the backward kernels (pool_backward.cu) and max
// unpooling where windows do not overlap (max_pool.cu).
#pragma once
#include "geometry.cuh"
#include "thread_map.cuh"
#include "walk.cuh"

namespace gp {

// The windows of a dim that cover input position i, ascending: the o in [0, out) with
// o*s - pb + t*dil = i for a tap t in [0, k). As t descends in steps of s / gcd(s, dil), o
// ascends in steps of dil / gcd (`gcd` given): a line of windows starting at the largest
// such t.
template <typename I>
__device__ __forceinline__ TapLine<I> window_cover(I i, int k, int s, int pb, int dil, int gcd,
                                                   I out) {
  const I r = i + (I)pb;
  I t = r / (I)dil;  // o >= 0
  if (t > (I)(k - 1)) t = (I)(k - 1);
  const I excess = r - (out - 1) * (I)s;  // o <= out - 1: t * dil >= excess
  const I tmin = excess <= 0 ? (I)0 : (excess + (I)dil - 1) / (I)dil;
  while (t >= tmin && (r - t * (I)dil) % (I)s != 0) --t;
  if (t < tmin) return {(I)0, (I)0, (I)1, out};
  return {(r - t * (I)dil) / (I)s, (t - tmin) / (I)(s / gcd) + 1, (I)(dil / gcd), out};
}

// Sliding windows: the covering windows per dim (gd, gh, gw: gcd(stride, dilation) per dim).
template <typename I>
struct WindowCovers {
  const Geo<I>& g;
  int gd, gh, gw;
  __device__ __forceinline__ void lines(I i_d, I i_h, I i_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    d = window_cover<I>(i_d, g.kd, g.sd, g.pd, g.dd, gd, g.od);
    h = window_cover<I>(i_h, g.kh, g.sh, g.ph, g.dh, gh, g.oh);
    w = window_cover<I>(i_w, g.kw, g.sw, g.pw, g.dw, gw, g.ow);
  }
};

// Input positions per thread taken together: their covering windows' loads all start before
// any of their sums waits.
constexpr int kGroup = 4;

// h(base, cs, e, n) for each group of up to G input positions of this thread: e[0..n) the
// positions (e[j].o_d, .o_h, .o_w its coordinates, e[j].oi its flat index into `out`, and x),
// e[n..G) repeating e[0]; base the offset of their plane (NHWC: and channel) in `grad` (and
// indices, y), cs the element step between spatial neighbours there. The maps of
// thread_map.cuh (output_groups) with the forward's input and output dims swapped. With
// V > 1, an e[j] is a pack of V positions along W instead: o_w the pack, its positions
// o_w * V + u, u < V, inside the row; e[j].oi then counts packs.
template <int G, bool NHWC, int V = 1, typename I, typename T, typename H>
__device__ __forceinline__ void input_groups(const Geo<I>& g, const T* __restrict__ grad, H h) {
  Geo<I> t = g;
  t.id = g.od;
  t.ih = g.oh;
  t.iw = g.ow;
  t.od = g.id;
  t.oh = g.ih;
  t.ow = (g.iw + (I)(V - 1)) / (I)V;
  output_groups<G, NHWC>(t, grad, [&](const T* __restrict__ plane, I cs, const Output<I>* e,
                                      int n) { h((I)(plane - grad), cs, e, n); });
}

// v[J] = f(Slot<J>(), e[J]) for each slot J < n of a group, in slot order; Slot<J> gives each
// slot its own instance of f, so that the loads of every slot are instructions of their own.
template <int J, int G>
struct EachSlot {
  template <typename V, typename E, typename F>
  static __device__ __forceinline__ void run(V* v, const E* e, int n, const F& f) {
    if (J < n) v[J] = f(Slot<J>(), e[J]);
    EachSlot<J + 1, G>::run(v, e, n, f);
  }
};

template <int G>
struct EachSlot<G, G> {
  template <typename V, typename E, typename F>
  static __device__ __forceinline__ void run(V*, const E*, int, const F&) {}
};

// The value f(Slot<J>(), e[J]) of every position of a group, all computed before the first is
// stored to out[e[J].oi].
template <int G, typename T, typename I, typename F>
__device__ __forceinline__ void store_group(T* __restrict__ out, const Output<I>* e, int n,
                                            const F& f) {
  T v[G];
  EachSlot<0, G>::run(v, e, n, f);
#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j < n) out[e[j].oi] = v[j];
  }
}

// For each input position of this thread (input_groups): acc = take(acc, named, v) from
// `zero` per covering window (Covers) in row-major order, named whether the window's index
// names this position and v its value in src; out at the position = done(acc). Each covering
// window's index and value load unconditionally. J: the index dtype.
template <typename T, typename I, bool NHWC, typename J, typename Covers, typename A,
          typename Take, typename Done>
__device__ __forceinline__ void named_gather(const T* __restrict__ src,
                                             const J* __restrict__ indices, T* __restrict__ out,
                                             const Covers& covers, const Geo<I>& g, A zero,
                                             const Take& take, const Done& done) {
  input_groups<kGroup, NHWC>(g, src, [&](I base, I cs, const Output<I>* e, int n) {
    store_group<kGroup, T>(out, e, n, [&](auto, const Output<I>& p) {
      const long long pos = (long long)((p.o_d * g.ih + p.o_h) * g.iw + p.o_w);
      TapLine<I> d, h, w;
      covers.lines(p.o_d, p.o_h, p.o_w, d, h, w);
      A acc = zero;
      auto add = [&](I o) {
        const I at = base + o * cs;
        const long long named = (long long)indices[at];  // signed for every J
        acc = take(acc, named == pos, src[at]);
      };
      walk_row_major<0, 0>(d, h, w, add);
      return done(acc);
    });
  });
}

}  // namespace gp
