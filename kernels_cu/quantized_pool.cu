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

// Sum of (q - zp) over the valid taps of the window of (o_d, o_h, o_w).
template <typename T, typename A, typename I, int K>
__device__ __forceinline__ A sum_window(const T* __restrict__ xp, I cs, const gp::Geo<I>& g,
                                        I o_d, I o_h, I o_w, int zp) {
  const int kh = K ? K : g.kh;
  const int kw = K ? K : g.kw;
  const I d0 = o_d * (I)g.sd - (I)g.pd;
  const I h0 = o_h * (I)g.sh - (I)g.ph;
  const I w0 = o_w * (I)g.sw - (I)g.pw;
  A s = 0;
  for (int a = 0; a < g.kd; ++a) {
    const I d = d0 + (I)a * (I)g.dd;
    if (d < 0 || d >= g.id) continue;
#pragma unroll
    for (int b = 0; b < kh; ++b) {
      const I h = h0 + (I)b * (I)g.dh;
      if (h < 0 || h >= g.ih) continue;
      const I rowbase = (d * g.ih + h) * g.iw;
#pragma unroll
      for (int c = 0; c < kw; ++c) {
        const I w = w0 + (I)c * (I)g.dw;
        if (w < 0 || w >= g.iw) continue;
        s += (A)((int)xp[(rowbase + w) * cs] - zp);
      }
    }
  }
  return s;
}

// 4 codes per 32-bit word: byte-wise max, signed or unsigned.
template <bool SIGNED>
__device__ __forceinline__ unsigned vmax4(unsigned a, unsigned b) {
  return SIGNED ? __vmaxs4(a, b) : __vmaxu4(a, b);
}

template <typename I>
__device__ __forceinline__ void adaptive_bounds(I o, I n, I m, I& start, I& end) {
  start = (o * n) / m;
  end = ((o + 1) * n + m - 1) / m;
}

}  // namespace gpq

// Average pooling of codes, requantized. Geometry: see gp::for_outputs_nchw /
// gp::for_outputs_nhwc (grid x = spatial chunks, y/z = planes; block (TX, TY); one thread =
// `rows` outputs). row_of: table row of each output position (od*oh*ow, int32).
template <typename T, typename A, typename I, int K, bool NHWC>
__global__ void qavg_pool(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                          const int* __restrict__ row_of, const long long* __restrict__ table,
                          int zp_in, int zp_out, int qmin, int qmax) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    const A acc = gpq::sum_window<T, A, I, K>(xp, cs, g, o_d, o_h, o_w, zp_in);
    const I pos = (o_d * g.oh + o_h) * g.ow + o_w;
    const long long* __restrict__ row = table + (long long)row_of[pos] * GPQ_ROW;
    out[oi] = (T)gpq::requantize<A>(acc, row, zp_out, qmin, qmax);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
}

// Max over codes, channels-last with C % 4 == 0: x and out are read as 32-bit words of 4
// channels (Geo.chans = C / 4) and combined with __vmaxs4 / __vmaxu4; a window with no valid
// tap gives the dtype minimum in every byte. Geometry: gp::for_outputs_nhwc (grid x = word
// chunks x position chunks, y/z = batch; block (TX along words, TY); one thread = `rows`
// output positions of 4 channels).
template <bool SIGNED, typename I, int K>
__global__ void qmax_pool_nhwc4(const unsigned* __restrict__ x, unsigned* __restrict__ out,
                                GP_GEO_PARAMS(I)) {
  GP_GEO(I);
  auto body = [&](const unsigned* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    const int kh = K ? K : g.kh;
    const int kw = K ? K : g.kw;
    const I d0 = o_d * (I)g.sd - (I)g.pd;
    const I h0 = o_h * (I)g.sh - (I)g.ph;
    const I w0 = o_w * (I)g.sw - (I)g.pw;
    unsigned m = SIGNED ? 0x80808080u : 0u;
    for (int a = 0; a < g.kd; ++a) {
      const I d = d0 + (I)a * (I)g.dd;
      if (d < 0 || d >= g.id) continue;
#pragma unroll
      for (int b = 0; b < kh; ++b) {
        const I h = h0 + (I)b * (I)g.dh;
        if (h < 0 || h >= g.ih) continue;
        const I rowbase = (d * g.ih + h) * g.iw;
#pragma unroll
        for (int c = 0; c < kw; ++c) {
          const I w = w0 + (I)c * (I)g.dw;
          if (w < 0 || w >= g.iw) continue;
          m = gpq::vmax4<SIGNED>(m, xp[(rowbase + w) * cs]);
        }
      }
    }
    out[oi] = m;
  };
  gp::for_outputs_nhwc<I>(g, x, body);
}

// Adaptive average of codes, requantized (windows [floor(o*n/m), ceil((o+1)*n/m)), never
// empty). Geometry as qavg_pool.
template <typename T, typename A, typename I, bool NHWC>
__global__ void qavg_adaptive(const T* __restrict__ x, T* __restrict__ out, GP_GEO_PARAMS(I),
                              const int* __restrict__ row_of,
                              const long long* __restrict__ table, int zp_in, int zp_out,
                              int qmin, int qmax) {
  GP_GEO(I);
  auto body = [&](const T* __restrict__ xp, I cs, I o_d, I o_h, I o_w, I oi) {
    I d0, d1, h0, h1, w0, w1;
    gpq::adaptive_bounds<I>(o_d, g.id, g.od, d0, d1);
    gpq::adaptive_bounds<I>(o_h, g.ih, g.oh, h0, h1);
    gpq::adaptive_bounds<I>(o_w, g.iw, g.ow, w0, w1);
    A acc = 0;
    for (I d = d0; d < d1; ++d) {
      for (I h = h0; h < h1; ++h) {
        const I rowbase = (d * g.ih + h) * g.iw;
        for (I w = w0; w < w1; ++w) acc += (A)((int)xp[(rowbase + w) * cs] - zp_in);
      }
    }
    const I pos = (o_d * g.oh + o_h) * g.ow + o_w;
    const long long* __restrict__ row = table + (long long)row_of[pos] * GPQ_ROW;
    out[oi] = (T)gpq::requantize<A>(acc, row, zp_out, qmin, qmax);
  };
  if constexpr (NHWC) {
    gp::for_outputs_nhwc<I>(g, x, body);
  } else {
    gp::for_outputs_nchw<I>(g, x, body);
  }
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
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / 32;
    s = lane < nwarps ? partial[lane] : (A)0;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) out[plane] = (T)gpq::requantize<A>(s, table, zp_out, qmin, qmax);
  }
}

// Global average, channels last: x is (batch, positions, C). grid: x = channel chunks of the
// block, y = batch rows (y/z past 65535, gp::block_plane); block: up to 256 threads along
// channels. thread: one (batch row, channel), summing over the positions (consecutive threads
// read consecutive channels).
template <typename T, typename A, typename I>
__global__ void qavg_global_nhwc(const T* __restrict__ x, T* __restrict__ out, I batch,
                                 I positions, I chans, const long long* __restrict__ table,
                                 int zp_in, int zp_out, int qmin, int qmax) {
  const long long b = gp::block_plane();
  const I c = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  if (b >= (long long)batch || c >= chans) return;
  const T* __restrict__ xp = x + (I)b * positions * chans + c;
  A s = 0;
  for (I p = 0; p < positions; ++p) s += (A)((int)xp[p * chans] - zp_in);
  out[(I)b * chans + c] = (T)gpq::requantize<A>(s, table, zp_out, qmin, qmax);
}
