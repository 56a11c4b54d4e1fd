// Backward of the float poolings: the gradient of the input from the gradient of the output,
// gathered, one thread per input element (or `rows` of them), with no atomics. Each input
// element sums the gradients of the windows that cover it in the order of the NumPy backend
// (gpupool/cpu/backward.py), so that both give the same bits:
//
// * averages and Lp: q(o) per covering window o (the gradient over the window's divisor; Lp:
//   times y(o)**(1-p)), summed nested, D outermost: acc = sum over o_d of (sum over o_h of
//   (sum over o_w of q)), windows ascending along each dim and every partial sum starting
//   from +0 (gp::sum_nested); Lp then multiplies a nonzero sum by sign(x) * |x|**(p-1).
// * maxima: acc = +0 plus, in row-major order of the covering windows (gp::walk_row_major),
//   the gradient of each window whose index names this element (np.add.at's order).
//
// Template parameters: T element type (half sums in float, as Num<T>::acc); I index type (int
// or long long, chosen on the host); NHWC the layout. Every kernel takes the forward op's
// geometry (GP_GEO_PARAMS: id/ih/iw the forward input's dims, whose gradient `out` is written;
// od/oh/ow the forward output's, whose gradient `grad` is read; window fields 0 for adaptive).
// Grid, block and thread: the thread maps of thread_map.cuh over the input positions
// (gp::input_groups), kGroup positions of a thread at a time; the global average's backward
// (avg_global_backward) stores 16-byte packs over groups of whole planes instead.
#include "gather.cuh"
#include "traits.cuh"

namespace gp {

// Adaptive windows: input i of a dim of size n pooled to m is covered by the o with
// start(o) <= i < end(o), that is [floor(i*m/n), ceil((i+1)*m/n)): adaptive_line with the
// roles of n and m swapped.
template <typename I>
struct AdaptiveCovers {
  const Geo<I>& g;
  __device__ __forceinline__ void lines(I i_d, I i_h, I i_w, TapLine<I>& d, TapLine<I>& h,
                                        TapLine<I>& w) const {
    d = adaptive_line<I>(i_d, g.od, g.id);
    h = adaptive_line<I>(i_h, g.oh, g.ih);
    w = adaptive_line<I>(i_w, g.ow, g.iw);
  }
};

// The max gradient over any covering windows (WindowCovers, AdaptiveCovers): +0 plus the
// gradient of each window whose index names this position; a gradient whose index names
// another position adds +0 (the sum, from +0, is never -0, so that leaves it as it is).
template <typename T, typename I, bool NHWC, typename Covers>
__device__ __forceinline__ void max_gather(const T* __restrict__ grad,
                                           const long long* __restrict__ indices,
                                           T* __restrict__ out, const Covers& covers,
                                           const Geo<I>& g) {
  typedef typename Num<T>::acc A;
  named_gather<T, I, NHWC>(
      grad, indices, out, covers, g, (A)0,
      [](A acc, bool named, T v) {
        const A gv = Num<T>::load(v);
        return acc + (named ? gv : (A)0);
      },
      [](A acc) { return Num<T>::store(acc); });
}

// A covering window: its coordinates and its offset `at` in grad (and y).
template <typename I>
struct Window {
  I o_d, o_h, o_w, at;
};

// The Window of coordinates (o_d, o_h, o_w) in the plane at `base` (element step cs).
template <typename I>
struct WindowAt {
  I base, cs, oh, ow;
  __device__ __forceinline__ Window<I> operator()(I o_d, I o_h, I o_w) const {
    return {o_d, o_h, o_w, base + ((o_d * oh + o_h) * ow + o_w) * cs};
  }
};

// The nested sum over the covering windows of q(window), stored as finish(sum, ii).
template <typename T, typename I, bool NHWC, typename Covers, typename Q, typename Finish>
__device__ __forceinline__ void sum_gather(const T* __restrict__ grad, T* __restrict__ out,
                                           const Covers& covers, const Geo<I>& g, const Q& q,
                                           const Finish& finish) {
  typedef typename Num<T>::acc A;
  input_groups<kGroup, NHWC>(g, grad, [&](I base, I cs, const Output<I>* e, int n) {
    store_group<kGroup, T>(out, e, n, [&](auto, const Output<I>& p) {
      TapLine<I> d, h, w;
      covers.lines(p.o_d, p.o_h, p.o_w, d, h, w);
      long long count;
      const A s = sum_nested<0, 0>(d, h, w, WindowAt<I>{base, cs, g.oh, g.ow}, q, (A)0, count);
      return Num<T>::store(finish(s, p.oi));
    });
  });
}

// The sum as it is.
struct Unchanged {
  template <typename A, typename I>
  __device__ __forceinline__ A operator()(A s, I) const {
    return s;
  }
};

}  // namespace gp

// max_pool's backward from its int64 indices (the host widens other index dtypes). gd, gh,
// gw: gcd(stride, dilation) per dim.
template <typename T, typename I, bool NHWC>
__global__ void max_window_backward(const T* __restrict__ grad,
                                    const long long* __restrict__ indices, T* __restrict__ out,
                                    GP_GEO_PARAMS(I), int gd, int gh, int gw) {
  GP_GEO(I);
  gp::max_gather<T, I, NHWC>(grad, indices, out, gp::WindowCovers<I>{g, gd, gh, gw}, g);
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
template <typename T, typename I, bool NHWC>
__global__ void avg_window_backward(const T* __restrict__ grad, T* __restrict__ out,
                                    GP_GEO_PARAMS(I), int gd, int gh, int gw, int ped, int peh,
                                    int pew, int include_pad, int divisor_override) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const I lo_d = include_pad ? -(I)g.pd : (I)0, hi_d = include_pad ? g.id + (I)ped : g.id;
  const I lo_h = include_pad ? -(I)g.ph : (I)0, hi_h = include_pad ? g.ih + (I)peh : g.ih;
  const I lo_w = include_pad ? -(I)g.pw : (I)0, hi_w = include_pad ? g.iw + (I)pew : g.iw;
  const auto q = [&](const gp::Window<I>& o) {
    long long divisor = divisor_override;
    if (divisor_override <= 0) {
      divisor = (long long)gp::count_taps<I>(o.o_d, g.sd, g.pd, g.kd, g.dd, lo_d, hi_d) *
                gp::count_taps<I>(o.o_h, g.sh, g.ph, g.kh, g.dh, lo_h, hi_h) *
                gp::count_taps<I>(o.o_w, g.sw, g.pw, g.kw, g.dw, lo_w, hi_w);
    }
    return gp::Num<T>::load(grad[o.at]) / (A)divisor;
  };
  gp::sum_gather<T, I, NHWC>(grad, out, gp::WindowCovers<I>{g, gd, gh, gw}, g, q,
                             gp::Unchanged());
}

// lp_pool's backward (p > 0 finite, as A): q = grad (p == 1), grad / y (p == 2) or
// grad * y**(1-p), 0 where y is 0 (p != 1); a nonzero sum times sign(x) (p == 1), x (p == 2)
// or sign(x) * |x|**(p-1), 0 where x is 0; a zero sum gives +0. y: the forward's output.
template <typename T, typename I, bool NHWC>
__global__ void lp_window_backward(const T* __restrict__ grad, const T* __restrict__ y,
                                   const T* __restrict__ x, T* __restrict__ out,
                                   GP_GEO_PARAMS(I), int gd, int gh, int gw,
                                   typename gp::Num<T>::acc p) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const auto q = [&](const gp::Window<I>& o) {
    const A gv = gp::Num<T>::load(grad[o.at]);
    if (p == (A)1) return gv;
    const A yv = gp::Num<T>::load(y[o.at]);
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
  gp::sum_gather<T, I, NHWC>(grad, out, gp::WindowCovers<I>{g, gd, gh, gw}, g, q, finish);
}

// adaptive_avg_pool's (and global_avg_pool's) backward: q = grad / the window's tap count.
template <typename T, typename I, bool NHWC>
__global__ void avg_adaptive_backward(const T* __restrict__ grad, T* __restrict__ out,
                                      GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  typedef typename gp::Num<T>::acc A;
  const auto q = [&](const gp::Window<I>& o) {
    const long long count = (long long)gp::adaptive_line<I>(o.o_d, g.id, g.od).n *
                            gp::adaptive_line<I>(o.o_h, g.ih, g.oh).n *
                            gp::adaptive_line<I>(o.o_w, g.iw, g.ow).n;
    return gp::Num<T>::load(grad[o.at]) / (A)count;
  };
  gp::sum_gather<T, I, NHWC>(grad, out, gp::AdaptiveCovers<I>{g}, g, q, gp::Unchanged());
}

namespace gp {

// V elements of T stored as one aligned vector (16 bytes).
template <typename T, int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

}  // namespace gp

// The backward of a global average (an adaptive average to size 1 in every dim), a broadcast:
// element e of `out` (planes x plane_len elements, plane_len = size * chans; chans 1 for NCHW)
// is (A)0 + grad[k] / size (the nested sum of its one window), k = e / size for NCHW, else
// (e / plane_len) * chans + e % chans.
// grid: x = chunks of a group of `group` consecutive planes (contiguous in `out`), y/z = groups
// (the last may hold fewer planes). block: (TX, 1, 1). thread: a pack of V = 16 / sizeof(T)
// consecutive elements of its group, packs counted from the V-aligned element at or below the
// group's first, pack blockIdx.x * TX + threadIdx.x; every element of the pack is loaded before
// any is divided or stored, and a pack inside the group whose address is 16-byte aligned is stored as one
// vector.
template <typename T, typename I, bool NHWC>
__global__ void avg_global_backward(const T* __restrict__ grad, T* __restrict__ out, I planes,
                                    I chans, I size, int group) {
  typedef typename gp::Num<T>::acc A;
  constexpr int V = 16 / (int)sizeof(T);
  const long long gi = gp::block_plane();
  if (gi * (long long)group >= (long long)planes) return;
  const I plane_len = size * chans;
  const I first = (I)gi * (I)group * plane_len;
  const I last_plane = (I)gi * (I)group + (I)group < planes ? (I)gi * (I)group + (I)group : planes;
  const I end = last_plane * plane_len;
  const I e0 = first - first % (I)V + ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) * (I)V;
  if (e0 >= end) return;
  const A divisor = (A)(long long)size;
  T gv[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const I e = e0 + (I)j;
    const I inside = e < first ? first : (e < end ? e : end - 1);
    const I k = NHWC ? (inside / plane_len) * chans + inside % chans : inside / size;
    gv[j] = grad[k];
  }
  // Without this fence the compiler moves each load next to its division, whose slow path is
  // a branch it does not schedule loads across: the loads would then wait one by one.
  asm volatile("" ::: "memory");
  gp::Pack<T, V> pack;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    pack.v[j] = gp::Num<T>::store((A)0 + gp::Num<T>::load(gv[j]) / divisor);
  }
  T* __restrict__ dst = out + e0;
  if (e0 >= first && e0 + (I)V <= end && ((unsigned long long)dst % sizeof(pack)) == 0) {
    *reinterpret_cast<gp::Pack<T, V>*>(dst) = pack;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (e0 + (I)j >= first && e0 + (I)j < end) dst[j] = pack.v[j];
    }
  }
}
