// Global max / average pooling as segmented reductions (the bodies are in segmented.cuh).
//
// Template parameters: IS_MAX (max with PyTorch's NaN rule, else sum); Tin, Tout input and
// output element types (equal, except for the float partial sums of a half average split in
// two passes); I index type (int or long long, chosen on the host); L lanes per segment.
// The reduction runs in A = Num<Tin>::acc. An average sums each value times `scale` (1/count
// in the pass over the input, 1 over partial sums), so a mean of values near the largest
// float stays finite, as on the CPU; float16 values, whose float sums cannot overflow, are
// summed as they are and the sum scaled once. Max ignores `scale`.
#include "segmented.cuh"
#include "traits.cuh"

namespace gp {

// Whether the float sum of any count of T values stays finite (float16: at most 65504 each).
template <typename T> struct BoundedSum { static constexpr bool value = false; };
template <> struct BoundedSum<__half> { static constexpr bool value = true; };

// The reduction of the global kernels (see segmented.cuh): max with PyTorch's NaN rule (the
// rule is order-free for values only), or the sum of value * scale (of the values, then
// times scale, where their sum is bounded); the result converted to Tout.
template <bool IS_MAX, typename Tin, typename Tout>
struct ValueReduce {
  typedef Tin In;
  typedef Tout Out;
  typedef typename Num<Tin>::acc Acc;
  static constexpr bool SCALE_SUM = !IS_MAX && BoundedSum<Tin>::value;
  Acc scale;
  __device__ __forceinline__ Acc identity() const { return IS_MAX ? Num<Acc>::lowest() : (Acc)0; }
  __device__ __forceinline__ Acc load(Tin v) const {
    return IS_MAX || SCALE_SUM ? Num<Tin>::load(v) : Num<Tin>::load(v) * scale;
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if (IS_MAX) return max_takes(b, a) ? b : a;
    return a + b;
  }
  __device__ __forceinline__ Tout store(Acc v) const {
    typedef typename Num<Tout>::acc B;
    return Num<Tout>::store((B)(SCALE_SUM ? v * scale : v));
  }
};

}  // namespace gp

// Many small contiguous segments: gp::reduce_lanes (grid x = ceil(nseg / (blockDim.x / L)),
// block 256 threads, L lanes per segment).
template <bool IS_MAX, typename Tin, typename Tout, typename I, int L>
__global__ void global_lanes(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                             I seglen, typename gp::Num<Tin>::acc scale) {
  gp::reduce_lanes<L>(gp::ValueReduce<IS_MAX, Tin, Tout>{scale}, x, out, nseg, seglen);
}

// Large contiguous segments, optionally split in chunks (then a second launch reduces the
// partials): gp::reduce_block (grid x = nseg * nchunks, block 256 threads).
template <bool IS_MAX, typename Tin, typename Tout, typename I>
__global__ void global_block(const Tin* __restrict__ x, Tout* __restrict__ out, I nseg,
                             I seglen, I nchunks, I chunklen,
                             typename gp::Num<Tin>::acc scale) {
  gp::reduce_block(gp::ValueReduce<IS_MAX, Tin, Tout>{scale}, x, out, nseg, seglen, nchunks,
                   chunklen);
}

// Channels-last segments, optionally split along the positions in chunks:
// gp::reduce_channels (grid x = channel chunks, y/z = batch * nchunks; block (TX, TY)).
template <bool IS_MAX, typename Tin, typename Tout, typename I>
__global__ void global_channels(const Tin* __restrict__ x, Tout* __restrict__ out, I nbatch,
                                I seglen, I chans, I nchunks, I chunklen,
                                typename gp::Num<Tin>::acc scale) {
  gp::reduce_channels(gp::ValueReduce<IS_MAX, Tin, Tout>{scale}, x, out, nbatch, seglen, chans,
                      nchunks, chunklen);
}
