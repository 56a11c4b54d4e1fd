// Gathers: one thread per position of a sliding or adaptive pooling's input, reading the
// windows that cover it (no atomics): the backward kernels (pool_backward.cu) and max
// unpooling where windows do not overlap (max_pool.cu).
#pragma once
#include "accumulate.cuh"
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

// A group's results v[0..n), stored to out[e[j].oi] once all are computed.
template <int G, typename T, typename I>
__device__ __forceinline__ void store_values(T* __restrict__ out, const Output<I>* e, int n,
                                            const T* v) {
#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j < n) out[e[j].oi] = v[j];
  }
}

// The type an index of dtype J is read as where I holds every index: I when J is wider (its
// low bytes, little-endian as every CUDA GPU, hold the value), else J.
template <typename J, typename I, bool WIDER = (sizeof(J) > sizeof(I))>
struct IndexWord {
  typedef J type;
};
template <typename J, typename I>
struct IndexWord<J, I, true> {
  typedef I type;
};

// A covering window's index and value.
template <typename J, typename T>
struct NamedValue {
  J named;
  T value;
};

// walk_lines_batched's visitor for G positions: acc[j] = take(acc[j], named, v) per covering
// window slot in row-major order, named whether the window's index names pos[j] and v its
// value in src; a slot that is not a valid window loads neither and names no position (take
// with named false must leave acc as it is: every slot is taken, so that no take waits behind
// a branch).
template <int G, typename T, typename J, typename I, typename A, typename Take>
struct NamedTakes {
  typedef typename IndexWord<J, I>::type W;
  typedef NamedValue<W, T> value;
  static constexpr bool skips = false;
  const T* __restrict__ src;
  const W* __restrict__ indices;  // as words of W
  I base, cs, oh, ow;
  const Take& combine;
  I pos[G];
  A acc[G];
  __device__ __forceinline__ value load(int, I pd, I ph, I pw, bool ok) const {
    const I at = base + ((pd * oh + ph) * ow + pw) * cs;
    return {tap_load(indices, (I)(sizeof(J) / sizeof(W)), at, ok, (W)-1),
            tap_load(src, (I)1, at, ok)};
  }
  __device__ __forceinline__ void take(int j, const value& v, I, I, I) {
    acc[j] = combine(acc[j], (long long)v.named == (long long)pos[j], v.value);  // signed J
  }
  __device__ __forceinline__ void plane(int) {}
  __device__ __forceinline__ void plane_end(int) {}
  __device__ __forceinline__ void row(int) {}
  __device__ __forceinline__ void row_end(int) {}
};

// Positions per thread of named_gather, whose windows do not overlap (one covers a position
// per dim at most), all their windows' loads in one batch: 8 with 32-bit offsets, 4 with 64-bit
// ones (twice the registers an offset takes; the planner's rows then make 2 groups).
template <typename I>
constexpr int named_group() {
  return sizeof(I) == 4 ? GP_NAMED_GROUP : GP_NAMED_GROUP / 2;
}

// For each input position of this thread (input_groups, named_group<I>() at once), where at most
// one window covers a position along each dim (Covers; the host checks): acc = take(acc,
// named, v) from `zero` per covering window in row-major order, named whether the window's
// index names this position and v its value in src; out at the position = done(acc). J: the
// index dtype.
template <typename T, typename I, bool NHWC, typename J, typename Covers, typename A,
          typename Take, typename Done>
__device__ __forceinline__ void named_gather(const T* __restrict__ src,
                                             const J* __restrict__ indices, T* __restrict__ out,
                                             const Covers& covers, const Geo<I>& g, A zero,
                                             const Take& take, const Done& done) {
  constexpr int G = named_group<I>();
  input_groups<G, NHWC>(g, src, [&](I base, I cs, const Output<I>* e, int n) {
    TapLine<I> d[G], h[G], w[G];
    typedef NamedTakes<G, T, J, I, A, Take> F;
    F f{src, reinterpret_cast<const typename F::W*>(indices), base, cs, g.oh, g.ow, take};
#pragma unroll
    for (int j = 0; j < G; ++j) {
      covers.lines(e[j].o_d, e[j].o_h, e[j].o_w, d[j], h[j], w[j]);
      f.pos[j] = (e[j].o_d * g.ih + e[j].o_h) * g.iw + e[j].o_w;
      f.acc[j] = zero;
    }
    walk_lines_batched<G, 1, 1>(d, h, w, n, f);
    T v[G];
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = done(f.acc[j]);
    store_values<G>(out, e, n, v);
  });
}

}  // namespace gp
