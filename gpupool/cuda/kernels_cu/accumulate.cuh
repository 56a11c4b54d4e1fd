// Accumulators and terms the window walks feed, one tap position at a time (max with its
// index, the summed term of an average or Lp pooling), and max pooling over any walk.
#pragma once
#include "thread_map.cuh"
#include "traits.cuh"

namespace gp {

// Max with PyTorch's rules; with IDX also the winner's position: the first tap holding the
// max, or the last NaN; -1 (and the lowest value) when no tap is valid.
template <typename T, typename I, bool IDX>
struct MaxOfTaps {
  typedef typename Num<T>::acc A;
  const T* __restrict__ xp;
  I cs;
  A m;
  I best;
  __device__ __forceinline__ MaxOfTaps(const T* __restrict__ xp_, I cs_)
      : xp(xp_), cs(cs_), m(Num<T>::lowest()), best(-1) {}
  __device__ __forceinline__ void operator()(I pos) {
    const A v = Num<T>::load(xp[pos * cs]);
    if (IDX) {
      if (best < 0 || max_takes(v, m)) {
        m = v;
        best = pos;
      }
    } else if (max_takes(v, m)) {
      m = v;
    }
  }
};

// The summed term of a tap in A (float for half): x (LP false) or |x|**p (LP true; p == 1 and
// p == 2 without pow).
template <typename T, typename I, bool LP>
struct TapTerm {
  typedef typename Num<T>::acc A;
  const T* __restrict__ xp;
  I cs;
  A p;
  __device__ __forceinline__ A operator()(I pos) const {
    A v = Num<T>::load(xp[pos * cs]);
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

// Max pooling over any walk (WindowTaps, AdaptiveTaps): values, and with IDX int64 indices.
template <typename T, typename I, bool IDX, bool NHWC, typename Taps>
__device__ __forceinline__ void max_outputs(const T* __restrict__ x, T* __restrict__ out,
                                            long long* __restrict__ indices, const Taps& taps,
                                            const Geo<I>& g) {
  for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    MaxOfTaps<T, I, IDX> acc(xp, cs);
    taps(o_d, o_h, o_w, acc);
    out[oi] = Num<T>::store(acc.m);
    if (IDX) indices[oi] = (long long)acc.best;
  });
}

}  // namespace gp
