"""Launch-grid arithmetic the CUDA planners share: CUDA's limits and the block size, the index
type of a launch, plane grids and block shapes. Pure Python, as :mod:`gpupool.cuda.planner`."""
from __future__ import annotations

import math

from .. import spec as S
from .launches import DeviceInfo

GRID_YZ_MAX = 65535
BLOCK_THREADS = 256
MIN_BLOCK_THREADS = 64  # a block smaller than two warps wastes the SM's block slots
BLOCK_Z_MAX = 64  # CUDA's limit on blockDim.z
INT32_LIMIT = 2**31 - 1


def pow2ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def divider(d: int) -> int:
    """gp::Divider's magic number for ``d`` (1 <= d): ``m * 2**32 + s`` as a signed 64-bit
    word, with ``n // d == (((n * m) >> 32) + n) >> s`` for every 0 <= n < 2**31 where
    d < 2**31 (Granlund and Montgomery, as PyTorch's IntDivider); 0 for a larger d, which a
    64-bit kernel divides."""
    if d > INT32_LIMIT:
        return 0
    s = (d - 1).bit_length()  # the least s with 2**s >= d
    m = (2**32 * (2**s - d)) // d + 1
    word = m << 32 | s
    return word - 2**64 if word >= 2**63 else word


def plane_grid(planes: int) -> tuple[int, int]:
    """Grid (y, z) covering ``planes``: y up to 65535, z for the rest."""
    if planes <= GRID_YZ_MAX:
        return planes, 1
    z = cdiv(planes, GRID_YZ_MAX)
    if z > GRID_YZ_MAX:
        raise ValueError(f"gpupool: {planes} planes exceed the CUDA grid ({GRID_YZ_MAX}**2)")
    return GRID_YZ_MAX, z


def canonical3(values, fill):
    """A per-dim tuple of 1-3 spatial dims padded to (D, H, W) with ``fill``."""
    values = tuple(values)
    return (fill,) * (3 - len(values)) + values


def index_type(spec) -> str:
    """``int`` when every offset the kernels form fits in int32, else ``long long``."""
    g = spec.geom
    x_elems = math.prod(g.shape)
    out_elems = math.prod(spec.out_shape)
    span = max(x_elems, out_elems)
    if isinstance(spec, S.WindowSpec):
        span += max(o * s + (k - 1) * d + pb + pe + 1 for o, s, k, d, (pb, pe) in zip(
            spec.out_spatial, spec.stride, spec.kernel, spec.dilation, spec.pads))
    elif isinstance(spec, S.AdaptiveSpec):
        span = max([span] + [(o + 1) * i + o for i, o in zip(g.spatial, spec.out_spatial)])
        # global reductions: a chunk end may reach twice a plane's length, and lane-group
        # thread ids reach 32 per plane
        # lane groups: output ids reach a block's group count past the last
        span = max(span, 2 * x_elems, 32 * g.planes + BLOCK_THREADS, out_elems + BLOCK_THREADS)
    else:  # unpool: the grid-stride loop may step past n once
        span += BLOCK_THREADS * 32 * 1024
    return "int" if span <= INT32_LIMIT else "long long"


def block_shape(inner: int, inner_cap: int, outer: int) -> tuple[int, int]:
    """(TX, TY) of a 2-D block: TX threads along the contiguous dim of ``inner`` elements (a
    power of two up to ``inner_cap``), TY along ``outer``, at most BLOCK_THREADS in all."""
    tx = min(pow2ceil(inner), inner_cap)
    return tx, max(1, min(BLOCK_THREADS // tx, pow2ceil(outer)))


def fill_target(device: DeviceInfo, threads: int) -> int:
    """Blocks for one full wave of resident blocks on every SM."""
    return device.sm_count * max(1, device.max_threads_per_sm // threads)


def footprint(spec, rows_per_block: int, tx: int, itemsize: int, out_dhw, in_dhw) -> int:
    """Input bytes one block of a window launch reads (its rows plus halo; NCHW)."""
    kd, kh, kw = canonical3(spec.kernel, 1)
    sd, sh, sw = canonical3(spec.stride, 1)
    dd, dh, dw = canonical3(spec.dilation, 1)
    od, oh, ow = out_dhw
    idd, ih, iw = in_dhw
    cols = min(iw, (tx - 1) * sw + (kw - 1) * dw + 1)
    if rows_per_block <= oh:
        in_rows = min(ih, (rows_per_block - 1) * sh + (kh - 1) * dh + 1) * kd
    else:
        slices = cdiv(rows_per_block, oh)
        in_rows = min(idd, (slices - 1) * sd + (kd - 1) * dd + 1) * ih
    return in_rows * cols * itemsize
