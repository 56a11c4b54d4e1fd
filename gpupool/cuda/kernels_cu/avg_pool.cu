// Average and Lp pooling (float dtypes; half and bfloat16 accumulate in float).
//
// Template parameters: T element type; I index type (int or long long, chosen on the host);
// K the window size along H and W when both equal K and the host specialised it (0: run time);
// NHWC the layout.
#include "accumulate.cuh"
#include "geometry.cuh"
#include "thread_map.cuh"
#include "traits.cuh"
#include "walk.cuh"

// Average pooling: the separable sum of the valid taps (gp::WindowTaps::sum) divided by
// divisor_override when > 0, else by the product over dims of the taps inside
// [-pad_begin, size + pad_end) (include_pad) or the number of valid taps; a window with no
// valid tap gives +0. ped/peh/pew are the end pads.
// Geometry: see gp::outputs_nchw / gp::outputs_nhwc (grid x = spatial chunks, NHWC 2-D and
// 3-D: tiles; y/z = plane groups; block (TX, TY, TZ planes); one thread = `rows` outputs, two
// at a time: the loads of both windows' taps start before either sum waits,
// gp::WindowTaps::sums).
template <typename T, typename I, int K, bool NHWC>
__global__ void GP_WINDOW_BOUNDS(T, I, K && !(K == 3 && NHWC) ? 5 : 4)
    avg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I), int ped, int peh,
             int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const gp::WindowTaps<K, I> taps{g};
  const auto mean = [&](const gp::Output<I>& o, A s, long long count) {
    long long divisor = count;
    if (divisor_override > 0) {
      divisor = divisor_override;
    } else if (include_pad) {
      divisor =
          (long long)gp::count_taps<I>(o.o_d, g.sd, g.pd, g.kd, g.dd, -(I)g.pd, g.id + (I)ped) *
          gp::count_taps<I>(o.o_h, g.sh, g.ph, g.kh, g.dh, -(I)g.ph, g.ih + (I)peh) *
          gp::count_taps<I>(o.o_w, g.sw, g.pw, g.kw, g.dw, -(I)g.pw, g.iw + (I)pew);
    }
    return gp::Num<T>::store(count > 0 ? s / (A)divisor : (A)0);
  };
  gp::output_groups<2, NHWC, true>(g, x, [&](const T* __restrict__ xp, I cs,
                                             const gp::Output<I>* o, int n) {
    A s[2];
    long long count[2];
    taps.template sums<2>(o, n, gp::TapTerm<T, I, false>{xp, cs, (A)1}, (A)-0.0, s, count);
    out[o[0].oi] = mean(o[0], s[0], count[0]);
    if (n > 1) out[o[1].oi] = mean(o[1], s[1], count[1]);
  });
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
