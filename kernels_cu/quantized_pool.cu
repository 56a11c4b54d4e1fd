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
// text (gpupool.cuda.kernels.DEFINES).
#include "geometry.cuh"
#include "segmented.cuh"
#include "thread_map.cuh"
#include "walk.cuh"

#if !defined(GPQ_LEVELS) || !defined(GPQ_HEAD)
#error "GPQ_LEVELS and GPQ_HEAD are defined by the host (gpupool.cuda.kernels.DEFINES)"
#endif
#define GPQ_ROW (GPQ_HEAD + GPQ_LEVELS + 2)

namespace gpq {

// saturate(zp_out + sign(acc) * f(|acc|)) with f given by one table row: M = m, sh, xcap and
// the thresholds t = row + GPQ_HEAD. `checks`: the threshold corrections to make, bit 0 up
// (x >= t[v + 1]), bit 1 down (x < t[v]); the host leaves out one only where it found that it
// changes no result of the table (gpupool.cuda.quantized._corrections). NARROW: in 32-bit
// unsigned arithmetic, for a table the host found narrow (quantized_spec.narrow_table:
// xcap * M + 2**(sh-1) < 2**32, sh < 32, every threshold below 2**31, read as its low word).
template <typename A, bool NARROW = false>
__device__ __forceinline__ int requantize_with(A acc, long long m, int sh, long long xcap,
                                               const long long* __restrict__ t, int checks,
                                               int zp_out, int qmin, int qmax) {
  int v;
  if constexpr (NARROW) {
    const unsigned x = min((unsigned)(acc < 0 ? -acc : acc), (unsigned)xcap);
    const unsigned u = min((x * (unsigned)m + ((1u << sh) >> 1)) >> sh, (unsigned)GPQ_LEVELS);
    const int* __restrict__ low = reinterpret_cast<const int*>(t);  // little-endian
    v = (int)u + ((checks & 1) && (int)x >= low[2 * (u + 1)] ? 1 : 0) -
        ((checks & 2) && (int)x < low[2 * u] ? 1 : 0);
  } else {
    long long x = acc < 0 ? -(long long)acc : (long long)acc;
    x = min(x, xcap);
    long long w = (x * m + ((1LL << sh) >> 1)) >> sh;  // x * M < 2**62 (host invariant)
    w = min(max(w, 0LL), (long long)GPQ_LEVELS);
    w += ((checks & 1) && x >= t[w + 1] ? 1 : 0) - ((checks & 2) && x < t[w] ? 1 : 0);
    v = (int)w;
  }
  const int q = zp_out + (acc < 0 ? -v : v);
  return min(max(q, qmin), qmax);
}

// requantize_with, reading the row's head off the table.
template <typename A>
__device__ __forceinline__ int requantize(A acc, const long long* __restrict__ row, int zp_out,
                                          int qmin, int qmax) {
  return requantize_with<A>(acc, row[0], (int)row[1], row[2], row + GPQ_HEAD, 3, zp_out, qmin,
                            qmax);
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

// Word kernels (NCHW, OW % 4 == 0): one thread computes the 4 outputs of one 32-bit output
// word, o_w = 4q .. 4q + 3 of one output row, from the input bytes its windows span along W
// (at most 16: checked by the host), read as aligned loads of `unit` bytes (8, or 4 where the
// rows are not 8-byte aligned).

// Bytes [c0, c0 + 16) of one input row (c0 a multiple of unit; iw too, so a unit lies wholly
// inside or outside [0, iw)); a unit outside reads as `fill` in every byte. Only the units
// below `nbytes` are loaded.
template <typename I>
struct RowBytes {
  unsigned long long lo, hi;  // bytes 0-7, 8-15
  __device__ __forceinline__ RowBytes(const unsigned* __restrict__ row, I c0, I iw, int unit,
                                      int nbytes, unsigned fill) {
    const unsigned long long fill2 = ((unsigned long long)fill << 32) | fill;
    unsigned long long u[2];
    if (unit == 8) {
      const unsigned long long* __restrict__ row8 =
          reinterpret_cast<const unsigned long long*>(row);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const I b = c0 + (I)(8 * k);
        u[k] = (8 * k < nbytes && b >= 0 && b < iw) ? row8[b >> 3] : fill2;
      }
    } else {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        unsigned w[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const I b = c0 + (I)(8 * k + 4 * j);
          w[j] = (8 * k + 4 * j < nbytes && b >= 0 && b < iw) ? row[b >> 2] : fill;
        }
        u[k] = ((unsigned long long)w[1] << 32) | w[0];
      }
    }
    lo = u[0];
    hi = u[1];
  }
  // byte r, 0 <= r < 16
  __device__ __forceinline__ unsigned byte(int r) const {
    return (unsigned)(((r & 8) ? hi : lo) >> ((r & 7) * 8)) & 0xffu;
  }
};

// The Geo of the thread map: output and input rows counted in words (the plane offsets of
// gp::for_outputs_nchw, and oi, in words).
template <typename I>
__device__ __forceinline__ gp::Geo<I> word_geo(gp::Geo<I> g) {
  g.iw >>= 2;
  g.ow >>= 2;
  return g;
}

// acc(o, code byte) for every valid tap of the 4 windows of word q: the valid input rows of
// the windows by gp::walk_row_major (D and H taps), the W taps from the row's bytes, padding
// taps reading `fill`; with K = 2 and Acc::takes_pairs, acc.pairs(bytes 0-7 of the row) where
// the windows lie side by side from the row's first byte. xp: the plane, in words. Returns
// whether they do (every row then went to acc.pairs).
template <int K, typename I, typename Acc>
__device__ __forceinline__ bool word_taps(const gp::Geo<I>& g, const unsigned* __restrict__ xp,
                                          I o_d, I o_h, I q, int unit, unsigned fill,
                                          Acc& acc) {
  const I col0 = (I)4 * q * (I)g.sw - (I)g.pw;  // >= -16 (host check)
  const I c0 = ((col0 + (I)16) & ~(I)(unit - 1)) - (I)16;
  const int off = (int)(col0 - c0);
  const int nw = K ? K : g.kw;
  const int nbytes = off + 3 * g.sw + (nw - 1) * g.dw + 1;
  gp::TapLine<I> d, h, w;
  gp::WindowTaps<K, I>{g}.lines(o_d, o_h, (I)0, d, h, w);
  const gp::TapLine<I> row_start = {0, 1, 1, g.iw};
  // windows side by side from the first byte (compiled-in K, stride K, dilation 1, no offset:
  // every byte's place known when compiled)
  const bool tiled = K && off == 0 && g.sw == K && g.dw == 1;
  constexpr bool pairs = K == 2 && Acc::takes_pairs;
  const bool paired = pairs && tiled;
  auto row = [&](I pos) {  // pos: the row's first element, a multiple of 4
    const RowBytes<I> rb(xp + (pos >> 2), c0, g.iw, unit, nbytes, fill);
    if (paired) {
      if constexpr (pairs) acc.pairs(rb.lo);
    } else if (tiled) {
#pragma unroll
      for (int o = 0; o < 4; ++o) {
#pragma unroll
        for (int c = 0; c < nw; ++c) acc(o, rb.byte(o * K + c));
      }
    } else {
#pragma unroll
      for (int o = 0; o < 4; ++o) {
#pragma unroll
        for (int c = 0; c < nw; ++c) acc(o, rb.byte(off + o * g.sw + c * g.dw));
      }
    }
  };
  gp::walk_row_major<K, 1>(d, h, row_start, row);
  return paired;
}

// Blocks per SM that the word kernels' registers are held to: with 32-bit sums (A; the max:
// int) and offsets and windows other than the compiled-in 3 wide, on sm_90 and later, 5 (48
// registers: ptxas fits them without spilling; 56 or 64 would leave the loads of too few
// threads in flight), 4 on sm_100 and later (GP_BY_ARCH); else 1 (the block size bound only).
template <typename A, typename I, int K>
__host__ __device__ constexpr int word_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 1;
#else
  return sizeof(A) == 4 && sizeof(I) == 4 && K != 3 ? GP_BY_ARCH(5, 4) : 1;
#endif
}

// The code of a byte (signed char or unsigned char).
template <typename T>
__device__ __forceinline__ int code_of(unsigned b) {
  return (int)(T)(unsigned char)b;
}

// Max of 4 outputs, packed into a word; the dtype minimum (the padding fill) when no tap is
// valid. Taps one at a time (operator()) or, for 2-wide windows side by side, a row's 8 bytes
// at once (pairs: outputs 0, 1 and 2, 3 as the halfword lanes of two[0], two[1], each lane a
// code in both its bytes, so that the lanes order as the codes do, signed or unsigned);
// word(paired) reads the one the taps went to.
template <typename T>
struct ByteMax {
  static constexpr bool SIGNED = (T)-1 < (T)0;
  static constexpr bool takes_pairs = true;
  int m[4];
  unsigned two[2];
  __device__ __forceinline__ ByteMax() {
#pragma unroll
    for (int o = 0; o < 4; ++o) m[o] = code_of<T>(SIGNED ? 0x80u : 0u);
    two[0] = two[1] = SIGNED ? 0x80808080u : 0u;
  }
  __device__ __forceinline__ void operator()(int o, unsigned b) { m[o] = max(m[o], code_of<T>(b)); }
  // output o's taps: bytes 2o and 2o + 1 of `bytes`
  __device__ __forceinline__ void pairs(unsigned long long bytes) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned w = (unsigned)(bytes >> (32 * h));
      const unsigned first = __byte_perm(w, 0, 0x2200), second = __byte_perm(w, 0, 0x3311);
      two[h] = SIGNED ? __vmaxs2(two[h], __vmaxs2(first, second))
                      : __vmaxu2(two[h], __vmaxu2(first, second));
    }
  }
  __device__ __forceinline__ unsigned word(bool paired) const {
    if (paired) return __byte_perm(two[0], two[1], 0x6420);
    unsigned w = 0;
#pragma unroll
    for (int o = 0; o < 4; ++o) w |= (unsigned)(m[o] & 0xff) << (8 * o);
    return w;
  }
};

// Sums of (q - zp) of 4 outputs (a padding tap reads zp: adds 0). Taps one at a time
// (operator()) or, for 2-wide windows side by side, a row's 8 bytes at once (pairs: output
// o's bytes 2o and 2o + 1 by one 4-byte dot product, __dp4a).
template <typename T, typename A>
struct ByteSum {
  static constexpr bool SIGNED = (T)-1 < (T)0;
  static constexpr bool takes_pairs = true;
  A s[4];
  int zp;
  __device__ __forceinline__ explicit ByteSum(int zp_) : zp(zp_) {
#pragma unroll
    for (int o = 0; o < 4; ++o) s[o] = 0;
  }
  __device__ __forceinline__ void operator()(int o, unsigned b) { s[o] += (A)(code_of<T>(b) - zp); }
  __device__ __forceinline__ void pairs(unsigned long long bytes) {
#pragma unroll
    for (int o = 0; o < 4; ++o) {
      const unsigned w = (unsigned)(bytes >> (32 * (o >> 1)));
      const unsigned ones = (o & 1) ? 0x01010000u : 0x00000101u;
      const int sum = SIGNED ? __dp4a((int)w, (int)ones, -2 * zp)
                             : (int)__dp4a(w, ones, (unsigned)(-2 * zp));
      s[o] += (A)sum;
    }
  }
};

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

// Max over codes, channels-last with C % 4 == 0: the codes are read as 32-bit words of 4
// channels (Geo.chans = C / 4) and combined with __vmaxs4 / __vmaxu4; a window with no valid
// tap gives the dtype minimum in every byte. Geometry: gp::for_outputs_nhwc (grid x = word
// chunks x position chunks, y/z = batch row groups; block (TX along words, TY, TZ); one
// thread = `rows` output positions of 4 channels).
template <typename T, typename I, int K>
__global__ void qmax_pool_nhwc4(const T* __restrict__ codes, T* __restrict__ out_codes,
                                GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  const unsigned* __restrict__ x = reinterpret_cast<const unsigned*>(codes);
  unsigned* __restrict__ out = reinterpret_cast<unsigned*>(out_codes);
  const gp::WindowTaps<K, I> taps{g};
  gp::for_outputs_nhwc<I>(g, x, [&](const unsigned* __restrict__ xp, I cs, I o_d, I o_h,
                                    I o_w, I oi) {
    gpq::WordMax<((T)-1 < (T)0), I> acc(xp, cs);
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

// Max over codes, NCHW with OW % 4 == 0 (word kernels above): the codes as 32-bit words, one
// thread = one output word (4 outputs along W). Geometry: gp::for_outputs_nchw over the word
// columns (grid x = word column chunks x row chunks, y/z = plane groups; block (TX along
// words, TY, TZ)); `unit`: the load width, 8 or 4 bytes.
template <typename T, typename I, int K>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, (gpq::word_blocks<int, I, K>()))
    qmax_pool_words(const T* __restrict__ codes, T* __restrict__ out_codes, GP_GEO_PARAMS(I),
                    int unit) {
  GP_GEO(I);
  const unsigned* __restrict__ x = reinterpret_cast<const unsigned*>(codes);
  unsigned* __restrict__ out = reinterpret_cast<unsigned*>(out_codes);
  const unsigned fill = (T)-1 < (T)0 ? 0x80808080u : 0u;
  gp::for_outputs_nchw<I>(gpq::word_geo(g), x, [&](const unsigned* __restrict__ xp, I, I o_d,
                                                   I o_h, I q, I oi) {
    gpq::ByteMax<T> acc;
    const bool paired = gpq::word_taps<K>(g, xp, o_d, o_h, q, unit, fill, acc);
    out[oi] = acc.word(paired);
  });
}

namespace gpq {

// The outputs of qavg_pool_words; CORRECTED false: with no correction, compiled so.
template <bool CORRECTED, typename T, typename A, typename I, int K>
__device__ __forceinline__ void average_words(const gp::Geo<I>& g, const unsigned* __restrict__ x,
                                              unsigned* __restrict__ out, int unit,
                                              const int* __restrict__ row_of,
                                              const long long* __restrict__ table, long long rm,
                                              int rsh, long long rxcap, int uniform, int checks,
                                              int zp_in, int zp_out, int qmin, int qmax) {
  const unsigned fill = (unsigned)(unsigned char)zp_in * 0x01010101u;
  const bool one_row = uniform;
  const int made = CORRECTED ? checks : 0;
  gp::for_outputs_nchw<I>(word_geo(g), x, [&](const unsigned* __restrict__ xp, I, I o_d, I o_h,
                                              I q, I oi) {
    ByteSum<T, A> acc(zp_in);
    word_taps<K>(g, xp, o_d, o_h, q, unit, fill, acc);
    const I pos = (o_d * g.oh + o_h) * g.ow + (I)4 * q;
    unsigned word = 0;
#pragma unroll
    for (int o = 0; o < 4; ++o) {
      const long long* __restrict__ row =
          one_row ? nullptr : table + (long long)row_of[pos + o] * GPQ_ROW;
      const int c = one_row
          ? requantize_with<A, true>(acc.s[o], rm, rsh, rxcap, table + GPQ_HEAD, made, zp_out,
                                     qmin, qmax)
          : requantize_with<A, true>(acc.s[o], row[0], (int)row[1], row[2], row + GPQ_HEAD,
                                     made, zp_out, qmin, qmax);
      word |= (unsigned)(c & 0xff) << (8 * o);
    }
    out[oi] = word;
  });
}

}  // namespace gpq

// Average of codes, requantized in 32 bits (the host launches it with a narrow table only),
// NCHW with OW % 4 == 0; geometry as qmax_pool_words. With `uniform` every output has table
// row 0, whose head is given as rm, rsh, rxcap (M, sh, xcap); otherwise row row_of[output
// position] per output. `checks`: see gpq::requantize_with; with none (the default scales),
// compiled apart, so that no correction is issued.
template <typename T, typename A, typename I, int K>
__global__ void __launch_bounds__(GP_BLOCK_THREADS, (gpq::word_blocks<A, I, K>()))
    qavg_pool_words(const T* __restrict__ codes, T* __restrict__ out_codes, GP_GEO_PARAMS(I),
                    int unit, const int* __restrict__ row_of, const long long* __restrict__ table,
                    long long rm, int rsh, long long rxcap, int uniform, int checks, int zp_in,
                    int zp_out, int qmin, int qmax) {
  GP_GEO(I);
  const unsigned* __restrict__ x = reinterpret_cast<const unsigned*>(codes);
  unsigned* __restrict__ out = reinterpret_cast<unsigned*>(out_codes);
  if (checks) {
    gpq::average_words<true, T, A, I, K>(g, x, out, unit, row_of, table, rm, rsh, rxcap, uniform,
                                         checks, zp_in, zp_out, qmin, qmax);
  } else {
    gpq::average_words<false, T, A, I, K>(g, x, out, unit, row_of, table, rm, rsh, rxcap,
                                          uniform, checks, zp_in, zp_out, qmin, qmax);
  }
}

// Pair kernels: 2 x 2 windows of stride 2 with no padding or dilation over 2-D NCHW planes
// whose rows are whole 16-byte packs (the host checks the input's start, IW % 16 == 0, and
// 2 * OH <= IH). A thread's 8 outputs lie side by side along W; their windows span one
// 16-byte pack of each of its two input rows, loaded once, output o taking bytes 2o and
// 2o + 1 of both. Geometry: gp::outputs_rows<8> (grid x = W chunks, y = row groups, z =
// plane groups; OW % 8 == 0, so every tile is whole).
namespace gpq {

template <typename T, typename H>
__device__ __forceinline__ void pair_tiles(const gp::Geo<int>& g, const T* __restrict__ x, H h) {
  gp::outputs_rows<8>(g, x, [&](const T* __restrict__ xp, int, const gp::Output<int>* o, int) {
    typedef gp::Word<16>::type W;
    const W* __restrict__ top = reinterpret_cast<const W*>(xp + 2 * (o[0].o_h * g.iw + o[0].o_w));
    const W w[2] = {top[0], top[g.iw >> 4]};
    unsigned rows[2][4];
    memcpy(rows, w, sizeof rows);
    h(rows, o[0].oi);
  });
}

template <bool CORRECTED, typename T>
__device__ __forceinline__ void average_pairs(const gp::Geo<int>& g, const T* __restrict__ x,
                                              T* __restrict__ out,
                                              const long long* __restrict__ table, long long rm,
                                              int rsh, long long rxcap, int checks, int zp_in,
                                              int zp_out, int qmin, int qmax) {
  constexpr bool SIGNED = (T)-1 < (T)0;
  const int made = CORRECTED ? checks : 0;
  pair_tiles(g, x, [&](const unsigned (&rows)[2][4], int oi) {
    unsigned word[2] = {0u, 0u};
#pragma unroll
    for (int o = 0; o < 8; ++o) {
      const unsigned ones = (o & 1) ? 0x01010000u : 0x00000101u;
      const unsigned top = rows[0][o >> 1], bottom = rows[1][o >> 1];
      const int sum = SIGNED ? __dp4a((int)top, (int)ones, __dp4a((int)bottom, (int)ones,
                                                                  -4 * zp_in))
                             : (int)__dp4a(top, ones, __dp4a(bottom, ones,
                                                             (unsigned)(-4 * zp_in)));
      const int c = requantize_with<int, true>(sum, rm, rsh, rxcap, table + GPQ_HEAD, made,
                                               zp_out, qmin, qmax);
      word[o >> 2] |= (unsigned)(c & 0xff) << (8 * (o & 3));
    }
    *reinterpret_cast<unsigned long long*>(out + oi) =
        ((unsigned long long)word[1] << 32) | word[0];
  });
}

}  // namespace gpq

// Max over codes of the pair kernels: each row's 4 words maxed bytewise with the other row's
// (__vmaxs4 / __vmaxu4), then each output's two bytes, gathered by __byte_perm.
template <typename T>
__global__ void __launch_bounds__(GP_BLOCK_THREADS)
    qmax_pool_pairs(const T* __restrict__ codes, T* __restrict__ out, GP_GEO_PARAMS(int)) {
  GP_GEO(int);
  constexpr bool SIGNED = (T)-1 < (T)0;
  gpq::pair_tiles(g, codes, [&](const unsigned (&rows)[2][4], int oi) {
    unsigned v[4], word[2];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = SIGNED ? __vmaxs4(rows[0][k], rows[1][k]) : __vmaxu4(rows[0][k], rows[1][k]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const unsigned even = __byte_perm(v[2 * j], v[2 * j + 1], 0x6420);
      const unsigned odd = __byte_perm(v[2 * j], v[2 * j + 1], 0x7531);
      word[j] = SIGNED ? __vmaxs4(even, odd) : __vmaxu4(even, odd);
    }
    *reinterpret_cast<unsigned long long*>(out + oi) =
        ((unsigned long long)word[1] << 32) | word[0];
  });
}

// Average of codes of the pair kernels, requantized in 32 bits by one table row for every
// output (the host launches it with a narrow table of one row), its head given as rm, rsh,
// rxcap; `checks` as qavg_pool_words.
template <typename T>
__global__ void __launch_bounds__(GP_BLOCK_THREADS)
    qavg_pool_pairs(const T* __restrict__ codes, T* __restrict__ out, GP_GEO_PARAMS(int),
                    const long long* __restrict__ table, long long rm, int rsh, long long rxcap,
                    int checks, int zp_in, int zp_out, int qmin, int qmax) {
  GP_GEO(int);
  if (checks) {
    gpq::average_pairs<true, T>(g, codes, out, table, rm, rsh, rxcap, checks, zp_in, zp_out,
                                qmin, qmax);
  } else {
    gpq::average_pairs<false, T>(g, codes, out, table, rm, rsh, rxcap, checks, zp_in, zp_out,
                                 qmin, qmax);
  }
}
