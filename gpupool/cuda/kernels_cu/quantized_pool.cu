// Quantized (int8 / uint8) pooling: max over codes, and averages requantized exactly.
//
// Template parameters: T the code type (signed char or unsigned char); I the index type (int
// or long long, chosen on the host); A the accumulator (int, or long long where a window of
// 255-magnitude terms could overflow int32); K the window size along H and W when the host
// specialised it (0: run time); NHWC the layout.
//
// Averages: acc = sum over the valid taps of (q - zp_in), then gpq::requantize maps it through
// one row of the host table of gpupool.quantized_spec.requant_table (row = row_of[output
// position]):
//   row[0] = M, row[1] = sh, row[2] = xcap, row[3 + v] = T[v], v = 0..LEVELS+1.
// The NumPy backend (gpupool/cpu/quantized.py: requantize) runs the same integer steps, so
// both agree to the bit; why the steps are exact is in gpupool/quantized.py.
//
// GPQ_LEVELS and GPQ_HEAD are quantized_spec.LEVELS and HEAD, defined by the host before this
// text (gpupool.cuda.backend.DEFINES).
#include "geometry.cuh"
#include "segmented.cuh"
#include "thread_map.cuh"
#include "walk.cuh"

#if !defined(GPQ_LEVELS) || !defined(GPQ_HEAD)
#error "GPQ_LEVELS and GPQ_HEAD are defined by the host (gpupool.cuda.backend.DEFINES)"
#endif
#define GPQ_ROW (GPQ_HEAD + GPQ_LEVELS + 2)

namespace gpq {

// saturate(zp_out + sign(acc) * f(|acc|)) with f read off the table row.
template <typename A>
__device__ __forceinline__ int requantize(A acc, const long long* __restrict__ row, int zp_out,
                                          int qmin, int qmax) {
  long long x = acc < 0 ? -(long long)acc : (long long)acc;
  x = min(x, row[2]);
  const int sh = (int)row[1];
  long long v = (x * row[0] + ((1LL << sh) >> 1)) >> sh;  // x * M < 2**62 (host invariant)
  v = min(max(v, 0LL), (long long)GPQ_LEVELS);
  const long long* __restrict__ t = row + GPQ_HEAD;
  v += (x >= t[v + 1] ? 1 : 0) - (x < t[v] ? 1 : 0);
  const int q = zp_out + (acc < 0 ? -(int)v : (int)v);
  return min(max(q, qmin), qmax);
}

// Sum of (q - zp) over the taps it is given (gp::WindowTaps, gp::AdaptiveTaps).
template <typename T, typename A, typename I>
struct CodeSum {
  const T* __restrict__ xp;
  I cs;
  int zp;
  A s;
  __device__ __forceinline__ CodeSum(const T* __restrict__ xp_, I cs_, int zp_)
      : xp(xp_), cs(cs_), zp(zp_), s(0) {}
  __device__ __forceinline__ void operator()(I pos) { s += (A)((int)xp[pos * cs] - zp); }
};

// The value a global average writes: the code requantized from the sum (Tout = T), or the
// sum itself (Tout = A, a partial sum of a split plane).
template <typename Tout, typename A>
struct SumOut {
  static __device__ __forceinline__ Tout store(A s, const long long* __restrict__ row,
                                               int zp_out, int qmin, int qmax) {
    return (Tout)requantize<A>(s, row, zp_out, qmin, qmax);
  }
};
template <typename A>
struct SumOut<A, A> {
  static __device__ __forceinline__ A store(A s, const long long* __restrict__, int, int, int) {
    return s;
  }
};

// The reduction of the global averages (gp::reduce_* in segmented.cuh): the sum of
// (v - zp_in) in A over codes or partial sums (zp_in 0), written through SumOut with `row`.
template <typename Tin, typename A, typename Tout>
struct GlobalSum {
  typedef Tin In;
  typedef Tout Out;
  typedef A Acc;
  const long long* __restrict__ row;
  int zp_in, zp_out, qmin, qmax;
  __device__ __forceinline__ A identity() const { return 0; }
  __device__ __forceinline__ A load(Tin v) const { return (A)v - (A)zp_in; }
  __device__ __forceinline__ A combine(A a, A b) const { return a + b; }
  __device__ __forceinline__ Tout store(A s) const {
    return SumOut<Tout, A>::store(s, row, zp_out, qmin, qmax);
  }
};

// Byte-wise max of words of 4 codes (signed or unsigned); the dtype minimum in every byte
// when no tap is valid.
template <bool SIGNED, typename I>
struct WordMax {
  const unsigned* __restrict__ xp;
  I cs;
  unsigned m;
  __device__ __forceinline__ WordMax(const unsigned* __restrict__ xp_, I cs_)
      : xp(xp_), cs(cs_), m(SIGNED ? 0x80808080u : 0u) {}
  __device__ __forceinline__ void operator()(I pos) {
    m = SIGNED ? __vmaxs4(m, xp[pos * cs]) : __vmaxu4(m, xp[pos * cs]);
  }
};

// Requantized averages over any walk: out = requantize(sum of (q - zp_in)) with table row
// row_of[output position].
template <typename T, typename A, typename I, bool NHWC, typename Taps>
__device__ __forceinline__ void average_outputs(const T* __restrict__ x, T* __restrict__ out,
                                                const Taps& taps, const gp::Geo<I>& g,
                                                const int* __restrict__ row_of,
                                                const long long* __restrict__ table, int zp_in,
                                                int zp_out, int qmin, int qmax) {
  gp::for_outputs<NHWC>(g, x, [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    CodeSum<T, A, I> acc(xp, cs, zp_in);
    taps(o_d, o_h, o_w, acc);
    const I pos = (o_d * g.oh + o_h) * g.ow + o_w;
    const long long* __restrict__ row = table + (long long)row_of[pos] * GPQ_ROW;
    out[oi] = (T)requantize<A>(acc.s, row, zp_out, qmin, qmax);
  });
}

}  // namespace gpq

// Average pooling of codes, requantized. Geometry: see gp::for_outputs_nchw /
// gp::for_outputs_nhwc (grid x = spatial chunks, y/z = plane groups; block (TX, TY, TZ
// planes); one thread = `rows` outputs). row_of: table row of each output position
// (od*oh*ow, int32).
template <typename T, typename A, typename I, int K, bool NHWC>
__global__ void qavg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                          const int* __restrict__ row_of, const long long* __restrict__ table,
                          int zp_in, int zp_out, int qmin, int qmax) {
  GP_GEO(I);
  gpq::average_outputs<T, A, I, NHWC>(x, out, gp::WindowTaps<K, I>{g}, g, row_of, table, zp_in,
                                      zp_out, qmin, qmax);
}

// Max over codes, channels-last with C % 4 == 0: x and out are read as 32-bit words of 4
// channels (Geo.chans = C / 4) and combined with __vmaxs4 / __vmaxu4; a window with no valid
// tap gives the dtype minimum in every byte. Geometry: gp::for_outputs_nhwc (grid x = word
// chunks x position chunks, y/z = batch row groups; block (TX along words, TY, TZ); one
// thread = `rows` output positions of 4 channels).
template <bool SIGNED, typename I, int K>
__global__ void qmax_pool_nhwc4(const unsigned* __restrict__ x, unsigned* __restrict__ out,
                                GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  const gp::WindowTaps<K, I> taps{g};
  gp::for_outputs_nhwc<I>(g, x, [&](const unsigned* __restrict__ xp, I cs, I o_d, I o_h,
                                    I o_w, I oi) {
    gpq::WordMax<SIGNED, I> acc(xp, cs);
    taps(o_d, o_h, o_w, acc);
    out[oi] = acc.m;
  });
}

// Adaptive average of codes, requantized (windows of gp::AdaptiveTaps). Geometry as
// qavg_pool.
template <typename T, typename A, typename I, bool NHWC>
__global__ void qavg_adaptive(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                              const int* __restrict__ row_of,
                              const long long* __restrict__ table, int zp_in, int zp_out,
                              int qmin, int qmax) {
  GP_GEO(I);
  gpq::average_outputs<T, A, I, NHWC>(x, out, gp::AdaptiveTaps<I>{g}, g, row_of, table, zp_in,
                                      zp_out, qmin, qmax);
}

// Global averages: the segmented reductions of the float global kernels (gp::reduce_lanes,
// gp::reduce_block, gp::reduce_channels in segmented.cuh; grids and blocks planned as theirs)
// over gpq::GlobalSum: read Tin, sum in A, write Tout. Tin, Tout: T and T in one pass; T and
// A (partial sums) in the first of two, A and T in the second (zp_in 0). Table row 0
// requantizes.
template <typename Tin, typename A, typename Tout, typename I, int L>
__global__ void qavg_global_lanes(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                                  I seglen, const long long* __restrict__ table, int zp_in,
                                  int zp_out, int qmin, int qmax) {
  gp::reduce_lanes<L>(gpq::GlobalSum<Tin, A, Tout>{table, zp_in, zp_out, qmin, qmax}, x, out,
                      nseg, seglen);
}

template <typename Tin, typename A, typename Tout, typename I>
__global__ void qavg_global_block(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                                  I seglen, I nchunks, I chunklen,
                                  const long long* __restrict__ table, int zp_in, int zp_out,
                                  int qmin, int qmax) {
  gp::reduce_block(gpq::GlobalSum<Tin, A, Tout>{table, zp_in, zp_out, qmin, qmax}, x, out,
                   nseg, seglen, nchunks, chunklen);
}

template <typename Tin, typename A, typename Tout, typename I>
__global__ void qavg_global_channels(const Tin* __restrict__ x, Tout* __restrict__ out,
                                     I nbatch, I seglen, I chans, I nchunks, I chunklen,
                                     const long long* __restrict__ table, int zp_in,
                                     int zp_out, int qmin, int qmax) {
  gp::reduce_channels(gpq::GlobalSum<Tin, A, Tout>{table, zp_in, zp_out, qmin, qmax}, x, out,
                      nbatch, seglen, chans, nchunks, chunklen);
}
