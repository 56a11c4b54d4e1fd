// Quantized (int8 / uint8) pooling: max over codes, and averages requantized exactly.
//
// Template parameters: T the code type (signed char or unsigned char); I the index type (int
// or long long, chosen on the host); A the accumulator (int, or long long where a window of
// 255-magnitude terms could overflow int32); K the window size along H and W when the host
// specialised it (0: run time); NHWC the layout.
//
// Averages: acc = sum over the valid taps of (q - zp_in), then gpq::requantize maps it through
// one row of the host table of gpupool.quantized.requant_table (row = row_of[output position]):
//   row[0] = M, row[1] = sh, row[2] = xcap, row[3 + v] = T[v], v = 0..LEVELS+1.
// The NumPy backend (gpupool/quantized_numpy.py: requantize) runs the same integer steps, so
// both agree to the bit; why the steps are exact is in gpupool/quantized.py.
#include "common.cuh"

#define GPQ_LEVELS 256
#define GPQ_HEAD 3
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

// Global average of contiguous planes (NCHW). grid: x = planes (up to 2**31 - 1); block: 256
// threads (a multiple of 32, at most 1024). thread: a strided share of its block's plane, then
// warp shuffles and one shared-memory step; thread 0 requantizes with table row 0.
template <typename T, typename A, typename I>
__global__ void qavg_global(const T* __restrict__ x, T* __restrict__ out, I seglen,
                            const long long* __restrict__ table, int zp_in, int zp_out,
                            int qmin, int qmax) {
  __shared__ A partial[32];
  const I plane = (I)blockIdx.x;
  const T* __restrict__ xp = x + plane * seglen;
  A s = 0;
  for (I i = (I)threadIdx.x; i < seglen; i += (I)blockDim.x) s += (A)((int)xp[i] - zp_in);
  s = gp::group_reduce<false, 32>(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / 32;
    s = gp::group_reduce<false, 32>(lane < nwarps ? partial[lane] : (A)0);
    if (lane == 0) out[plane] = (T)gpq::requantize<A>(s, table, zp_out, qmin, qmax);
  }
}

// Global average, channels last: x is (batch, positions, C). grid: x = channel chunks of
// blockDim.x, y/z = batch rows (gp::block_plane). block: (TX along channels, TY along
// positions), TX * TY <= 256. thread: channel c, positions threadIdx.y + k*TY (consecutive
// lanes read consecutive channels); the TY partial sums of a channel are added in shared
// memory by threadIdx.y == 0, which requantizes with table row 0.
template <typename T, typename A, typename I>
__global__ void qavg_global_nhwc(const T* __restrict__ x, T* __restrict__ out, I batch,
                                 I positions, I chans, const long long* __restrict__ table,
                                 int zp_in, int zp_out, int qmin, int qmax) {
  __shared__ A partial[256];
  const long long b = gp::block_plane();
  if (b >= (long long)batch) return;  // uniform over the block
  const I c = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  A s = 0;
  if (c < chans) {
    const T* __restrict__ xp = x + (I)b * positions * chans + c;
    for (I p = (I)threadIdx.y; p < positions; p += (I)blockDim.y) {
      s += (A)((int)xp[p * chans] - zp_in);
    }
  }
  partial[threadIdx.y * blockDim.x + threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < chans) {
    for (unsigned j = 1; j < blockDim.y; ++j) s += partial[j * blockDim.x + threadIdx.x];
    out[(I)b * chans + c] = (T)gpq::requantize<A>(s, table, zp_out, qmin, qmax);
  }
}
