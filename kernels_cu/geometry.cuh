// Launch geometry: the plane (or batch row) index of a block and of a thread, the
// sliding-window geometry Geo<I> that the window and adaptive kernels take as parameters, and
// the tap lines of one dim of a window (TapLine).
#pragma once

// The constants the planner shares with the kernels arrive as #defines ahead of the text, from
// their one definition in gpupool.cuda.planner (gpupool.cuda.kernels.DEFINES): the threads of
// a block at most (GP_BLOCK_THREADS), the outputs of a row tile (GP_ROW_TILE), the positions
// of a max unpooling gather (GP_NAMED_GROUP, 32-bit offsets), the positions of a max
// gradient's pack (GP_MAX_PACK), the 16-byte packs of a thread of a global average's
// backward (GP_BROADCAST_PACKS), the slots of a backward gather by its compiled-in bound C
// (GP_GATHER_GROUP_C) and the cells of the backward by cells (GP_CELL_COLUMNS of stride 2;
// GP_CELL1_ROWS by GP_CELL1_COLUMNS of stride 1).
#if !defined(GP_BLOCK_THREADS) || !defined(GP_ROW_TILE) || !defined(GP_NAMED_GROUP) || \
    !defined(GP_MAX_PACK) || !defined(GP_GATHER_GROUP_0) || !defined(GP_GATHER_GROUP_1) || \
    !defined(GP_GATHER_GROUP_2) || !defined(GP_GATHER_GROUP_3) || !defined(GP_BROADCAST_PACKS) || \
    !defined(GP_CELL_COLUMNS) || !defined(GP_CELL1_ROWS) || !defined(GP_CELL1_COLUMNS)
#error "the planner's constants are set by the host (gpupool.cuda.kernels.DEFINES)"
#endif

namespace gp {

// Index of this block over grid y, then z (each at most 65535).
__device__ __forceinline__ long long block_plane() {
  return (long long)blockIdx.y + (long long)gridDim.y * (long long)blockIdx.z;
}

// Plane of this thread in the window and adaptive launches: each block holds blockDim.z
// planes (several when a plane has too few outputs to fill a block), threadIdx.z picks one.
__device__ __forceinline__ long long thread_plane() {
  return block_plane() * (long long)blockDim.z + (long long)threadIdx.z;
}

// Sliding-window geometry of one launch, canonical 3-D (D, H, W): a 1-D op has D = H = 1, a
// 2-D op D = 1. `chans` is the channel count of an NHWC launch (1 for NCHW); `rows` how many
// outputs one thread computes.
template <typename I>
struct Geo {
  I planes, chans, id, ih, iw, od, oh, ow;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw, rows;
};

// One dim of a window (or of the windows covering a position): tap t in [0, n) lies at
// position first + t * step; the taps inside [0, size) are valid, the others fall in the
// padding.
template <typename I>
struct TapLine {
  I first, n, step, size;
};

// n / d for 0 <= n, d < 2**31 with 32-bit I, by a multiply and a shift: the host's magic
// number (gpupool.cuda.grid.divider: m and s packed as m * 2**32 + s; Granlund and
// Montgomery, as PyTorch's IntDivider); a 64-bit I divides.
template <typename I>
struct Divider {
  I d;
  long long magic;
  __device__ __forceinline__ I div(I n) const {
    if constexpr (sizeof(I) == 4) {
      const unsigned m = (unsigned)((unsigned long long)magic >> 32);
      return (I)((__umulhi((unsigned)n, m) + (unsigned)n) >> (int)(magic & 31));
    } else {
      return n / d;
    }
  }
};

}  // namespace gp

// Kernel parameters spelling out a Geo<I>, and the statement that builds it.
#define GP_GEO_PARAMS(I)                                                                       \
  I planes, I chans, I id, I ih, I iw, I od, I oh, I ow, int kd, int kh, int kw, int sd,       \
      int sh, int sw, int pd, int ph, int pw, int dd, int dh, int dw, int rows
#define GP_GEO(I)                                                                              \
  const gp::Geo<I> g = {planes, chans, id, ih, iw, od, oh, ow, kd, kh, kw, sd,                 \
                        sh, sw, pd, ph, pw, dd, dh, dw, rows}
