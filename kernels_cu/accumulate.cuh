// Accumulators and terms the window walks feed, one tap position at a time (max with its
// index, the summed term of an average or Lp pooling), and max pooling over any walk.
#pragma once
#include "thread_map.cuh"
#include "traits.cuh"

// The window kernels' launches have at most GP_BLOCK_THREADS threads per block;
// GP_WINDOW_BOUNDS(T, I, B) holds a kernel's registers to what
// gp::window_blocks<T, I>(B) such blocks per SM allow, so that the loads a thread starts
// together (its windows' taps) keep the occupancy.
#define GP_WINDOW_BOUNDS(T, I, B) __launch_bounds__(GP_BLOCK_THREADS, gp::window_blocks<T, I>(B))

namespace gp {

// Blocks per SM that a window kernel's registers are held to (GP_WINDOW_BOUNDS): on sm_90 and
// later, b for float and half elements with int indices, whose windows' taps a thread loads
// together; 1 (the block size bound only) for the others, which need more registers than b
// blocks leave, and before sm_90, where ptxas needs more for the same code.
template <typename A>
struct FloatAcc {
  static constexpr bool value = false;
};
template <>
struct FloatAcc<float> {
  static constexpr bool value = true;
};
template <typename T, typename I>
__host__ __device__ constexpr int window_blocks(int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 1;
#else
  return FloatAcc<typename Num<T>::acc>::value && sizeof(I) == 4 ? b : 1;
#endif
}

// A tap's element, or `none` without a load when !ok: a predicated load, so that the loads of
// a batch of taps (walk.cuh) start together.
template <typename T, typename I>
__device__ __forceinline__ T tap_load(const T* __restrict__ xp, I cs, I pos, bool ok,
                                      T none = T()) {
  T v = none;
  if (ok) v = xp[pos * cs];
  return v;
}

// Max with PyTorch's rules, fed the taps in row-major order (take): the winner's position is
// the first tap holding the max, or the last NaN; -1 (and the lowest value) when no tap is
// valid (IDX: the position is kept). A tap that is not ok loads nothing and gives the lowest
// value, which never replaces the max: values only, every slot is taken (skips false); with
// IDX only the valid taps (skips true: the first valid tap always sets the position), or
// every slot of a row tile (take_slot, then unless_taken).
// load returns the element as stored and take converts it to A: a conversion next to its load
// would make the compiler wait for each half tap before it starts the next. FLAT (values only):
// take tests max_takes without its short circuit, the form after which ptxas starts all of a
// batch's loads in the compiled-in-K and adaptive walks (with the short circuit it waited for
// each tap of their NHWC, double and adaptive variants); the run-time-K walk and the indices
// keep the short circuit, which ptxas batches there (FLAT would spill the run-time-K kernel).
template <typename T, typename I, bool IDX, bool FLAT = false>
struct MaxOfTaps {
  typedef typename Num<T>::acc A;
  typedef T value;
  static constexpr bool skips = IDX;
  const T* __restrict__ xp;
  I cs;
  A m;
  I best;
  MaxOfTaps() = default;
  __device__ __forceinline__ MaxOfTaps(const T* __restrict__ xp_, I cs_)
      : xp(xp_), cs(cs_), m(Num<T>::lowest()), best(-1) {}
  // the lowest value as stored (half -inf converts to float -inf)
  __device__ __forceinline__ T load(I pos, bool ok) const {
    return tap_load(xp, cs, pos, ok, Num<T>::store(Num<T>::lowest()));
  }
  __device__ __forceinline__ void take(T raw, I pos) {
    const A v = Num<T>::load(raw);
    if (IDX) {
      if (best < 0 || max_takes(v, m)) {
        m = v;
        best = pos;
      }
    } else if (FLAT ? (v > m) | Num<A>::is_nan(v) : max_takes(v, m)) {
      m = v;
    }
  }
  // With IDX, a slot of a row tile: take() by selects, with no branch that a warp's lanes
  // split over (a new max or not). A slot outside the plane holds the lowest value, which
  // never takes, so its validity is not tested; a window whose valid taps all hold the lowest
  // value keeps best -1 until unless_taken() gives it the first of them, or takes it here
  // (`first`: the slot is the window's first valid tap, and best is still -1).
  __device__ __forceinline__ void take_slot(T raw, I pos, bool first) {
    static_assert(IDX, "values only take every slot");
    const A v = Num<T>::load(raw);
    const bool t = first | (v > m) | Num<A>::is_nan(v);
    m = t ? v : m;
    best = t ? pos : best;
  }
  // With IDX, after take_slot() of a window's slots: where none took, the position first()
  // gives (the window's first valid tap, -1 if none; m, the lowest value, is its value).
  template <typename First>
  __device__ __forceinline__ void unless_taken(First first) {
    static_assert(IDX, "values only take every slot");
    if (best < 0) best = first();
  }
  // Values only: take() of the window's first tap, m still the lowest value (which the tap
  // replaces unless it is the lowest value too).
  __device__ __forceinline__ void first(T raw) {
    static_assert(!IDX, "an index takes its first valid tap");
    m = Num<T>::load(raw);
  }
  // With IDX: takes the max v at position pos (-1: no tap) of other taps of the same window,
  // so that m and best are those of one walk over both sets of taps in row-major order (in
  // which positions increase): the last NaN, else the first tap holding the max.
  __device__ __forceinline__ void merge(A v, I pos) {
    const bool v_nan = Num<A>::is_nan(v), m_nan = Num<A>::is_nan(m);
    const bool later = pos > best;
    if (pos >= 0 && (best < 0 || (v_nan ? !m_nan || later
                                        : !m_nan && (v > m || (v == m && !later))))) {
      m = v;
      best = pos;
    }
  }
};

// The summed term of a tap in A (float for half): x (LP false) or |x|**p (LP true; p == 1 and
// p == 2 without pow); load(pos, ok) loads the tap's element, apply(v) makes the term. A tap
// that is not ok loads nothing and gives the sums' zero: apply(load(pos, false)) is -0 for x
// (adding it leaves every sum as it is) and +0 for |x|**p (whose sums are never -0).
template <typename T, typename I, bool LP>
struct TapTerm {
  typedef typename Num<T>::acc A;
  typedef T value;
  const T* __restrict__ xp;
  I cs;
  A p;
  __device__ __forceinline__ T load(I pos, bool ok) const {
    return tap_load(xp, cs, pos, ok, LP ? T(0.0f) : T(-0.0f));
  }
  __device__ __forceinline__ A apply(T raw) const {
    A v = Num<T>::load(raw);
    if (LP) {
      v = fabs(v);
      if (p == (A)2) {
        v = v * v;
      } else if (p != (A)1) {
        v = pow(v, p);
      }
    }
    return v;
  }
};

// The V channels of an NHWC tap from xp[pos * cs] (one load of a 16-byte word; the host
// launches pack walks only where every pack is aligned: the input's start and the channel
// count's bytes on 16), or each lane's `none` without a load when !ok.
template <typename T, int V, typename I, typename Lane>
__device__ __forceinline__ Pack<T, V> tap_pack(const T* __restrict__ xp, I cs, I pos, bool ok,
                                               const Lane& lane) {
  typedef typename Word<sizeof(Pack<T, V>)>::type W;
  Pack<T, V> p;
  if (ok) {
    // the word pos * (cs / V) words past xp: one multiply-add forms its 64-bit address
    const W w = reinterpret_cast<const W*>(xp)[pos * (cs / (I)V)];
    memcpy(&p, &w, sizeof p);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) p.v[e] = lane.load(pos, false);
  }
  return p;
}

// Values-only max of V channels at once (an output visitor of the walks, a pack per tap):
// lane e is the MaxOfTaps of channel e, so each channel keeps its rules.
template <typename T, typename I, int V, bool FLAT>
struct MaxOfPacks {
  typedef MaxOfTaps<T, I, false, FLAT> Lane;
  typedef Pack<T, V> value;
  static constexpr bool skips = false;
  Lane lane[V];
  MaxOfPacks() = default;
  __device__ __forceinline__ MaxOfPacks(const T* __restrict__ xp, I cs) {
#pragma unroll
    for (int e = 0; e < V; ++e) lane[e] = Lane(xp, cs);
  }
  __device__ __forceinline__ value load(I pos, bool ok) const {
    return tap_pack<T, V>(lane[0].xp, lane[0].cs, pos, ok, lane[0]);
  }
  __device__ __forceinline__ void take(const value& p, I pos) {
#pragma unroll
    for (int e = 0; e < V; ++e) lane[e].take(p.v[e], pos);
  }
};

// V sums side by side, added lane by lane: the sums of the channels of a pack.
template <typename A, int V>
struct Lanes {
  A v[V];
  __device__ __forceinline__ Lanes& operator+=(const Lanes& o) {
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] += o.v[e];
    return *this;
  }
  static __device__ __forceinline__ Lanes all(A a) {
    Lanes r;
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = a;
    return r;
  }
};

// The summed terms (TapTerm, x) of V channels at once, a pack per tap: apply gives the lanes'
// terms, which the walks' separable sums add lane by lane (sums of Lanes from Lanes::all(zero)).
template <typename T, typename I, int V>
struct TermOfPacks {
  typedef TapTerm<T, I, false> Lane;
  typedef Pack<T, V> value;
  Lane lane;
  __device__ __forceinline__ value load(I pos, bool ok) const {
    return tap_pack<T, V>(lane.xp, lane.cs, pos, ok, lane);
  }
  __device__ __forceinline__ Lanes<typename Lane::A, V> apply(const value& p) const {
    Lanes<typename Lane::A, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = lane.apply(p.v[e]);
    return r;
  }
};

// Max pooling over any walk (WindowTaps, AdaptiveTaps, RowTaps, DepthRowTaps): values, and with IDX int64
// indices. Values only: Taps::joint outputs per group, the loads of their windows' taps in
// joint batches (walk_row_major_batched); with IDX one output at a time, but for a row tile
// (its GP_ROW_TILE outputs share their loads and store their values and indices together).
template <typename T, typename I, bool IDX, bool NHWC, typename Taps>
__device__ __forceinline__ void max_outputs(const T* __restrict__ x, T* __restrict__ out,
                                            long long* __restrict__ indices, const Taps& taps,
                                            const Geo<I>& g) {
  constexpr int G = IDX && !Taps::row_tile ? 1 : Taps::joint;
  const auto group = [&](const T* __restrict__ xp, I cs, const Output<I>* o, int n) {
    typedef MaxOfTaps<T, I, IDX, Taps::flat_max> Acc;
    Acc acc[G];
#pragma unroll
    for (int j = 0; j < G; ++j) acc[j] = Acc(xp, cs);
    taps.template batched<G>(o, n, acc);
    if constexpr (Taps::row_tile) {
      T v[G];
#pragma unroll
      for (int j = 0; j < G; ++j) v[j] = Num<T>::store(acc[j].m);
      store_row_tile<G>(out, o, n, v, warp_in_one_row());
      if constexpr (IDX) {
        int best[G];
#pragma unroll
        for (int j = 0; j < G; ++j) best[j] = acc[j].best;
        store_row_tile_indices<G>(indices, o, n, g.ow, best);
      }
    } else {
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (j < n) {
          out[o[j].oi] = Num<T>::store(acc[j].m);
          if (IDX) indices[o[j].oi] = (long long)acc[j].best;
        }
      }
    }
  };
  if constexpr (Taps::row_tile) {
    outputs_rows<G, Taps::depth>(g, x, group);
  } else {
    output_groups<G, NHWC, true>(g, x, group);
  }
}

}  // namespace gp
