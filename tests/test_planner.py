"""CPU unit tests of the CUDA launch planner (pure Python: no CuPy, no GPU)."""
from __future__ import annotations

import math

import pytest

from gpupool.cuda import planner, row_tiles
from gpupool import spec as S
from gpupool.cuda.explain import explain
from gpupool.cuda.planner import H100, DeviceInfo, plan

SMALL_GPU = DeviceInfo(name="test GPU", sm_count=4)


def window(shape, k, s=None, p=0, d=1, *, op="max", dtype="float32", layout="NCHW", **kw):
    return S.window_spec("max_pool", op, shape, dtype, k, s, p, d, False, layout, **kw)


def covered_outputs(sp, launch):
    """Outputs the grid/block/rows cover, per plane (NCHW: rows x W; NHWC: positions x C)."""
    tx, ty, _ = launch.block
    od, oh, ow = planner.canonical3(sp.out_spatial, 1)
    if launch.kernel.endswith("depth_rows"):  # grid x: W chunks x row groups
        wchunks = -(-ow // (tx * row_tiles.ROW_TILE))
        return launch.grid[0] // wchunks * ty, wchunks * tx * row_tiles.ROW_TILE
    if launch.kernel.endswith("_rows"):
        return launch.grid[1] * ty, launch.grid[0] * tx * row_tiles.ROW_TILE
    if sp.geom.layout == "NHWC":  # a thread per channel, or per pack of channels
        pack = planner.channel_pack(sp) if launch.kernel.endswith("_packs") else 1
        n_x = -(-sp.geom.channels // pack // tx)
        chunks = launch.grid[0] // n_x
        return chunks * ty * launch.rows, n_x * tx * pack
    n_x = -(-ow // tx)
    chunks = launch.grid[0] // n_x
    return chunks * ty * launch.rows, n_x * tx


@pytest.mark.parametrize("shape,k,s,p,layout", [
    ((64, 64, 112, 112), 3, 2, 1, "NCHW"),
    ((1, 1, 4000, 3000), 2, 2, 0, "NCHW"),
    ((2, 3, 7), (3,), 1, 1, "NCHW"),
    ((8, 64, 32, 112, 112), (2, 2, 2), 2, 0, "NCHW"),
    ((128, 112, 112, 64), 3, 2, 1, "NHWC"),
    ((1, 9, 9, 3), 2, 1, 0, "NHWC"),
    ((64, 35, 35, 192), 3, 1, 1, "NHWC"),  # 48 packs of channels
    ((70000, 5, 5), 2, 1, 0, "NCHW"),
])
@pytest.mark.parametrize("device", [H100, SMALL_GPU])
def test_window_plan_covers_every_output(shape, k, s, p, layout, device):
    sp = window(shape, k, s, p, layout=layout)
    pl = plan(sp, device)
    assert pl.family == "window" and len(pl.launches) == 1
    la = pl.launches[0]
    tx, ty, tz = la.block
    assert tx * ty * tz <= 256 and tz <= 64 and la.rows >= 1
    units, cols = covered_outputs(sp, la)
    od, oh, ow = planner.canonical3(sp.out_spatial, 1)
    if layout == "NHWC":
        assert units >= od * oh * ow and cols >= sp.geom.channels
        planes = sp.geom.batch
    else:
        assert units >= od * oh and cols >= ow
        planes = sp.geom.planes
        # no wasted block rows: the last chunk holds at least one row
        assert units - ty * la.rows < od * oh
    assert la.grid[1] <= 65535 and la.grid[2] <= 65535
    groups = -(-planes // tz)
    if la.kernel.endswith("_rows"):  # plane groups on grid z alone (depth rows: y alone)
        assert la.grid[1 if la.kernel.endswith("depth_rows") else 2] == groups
        return
    assert la.grid[1] * la.grid[2] >= groups
    assert la.grid[1] * (la.grid[2] - 1) < groups


def _small_plane_specs():
    """Window, adaptive and indices specs over small planes, few and many of them."""
    for planes in ((1,), (3,), (2, 5), (64,), (40, 7), (1000,), (70000,)):
        for spatial in ((1,), (5,), (10,), (2, 2), (3, 7), (4, 4), (7, 7), (9, 1), (2, 3, 4)):
            nd = len(spatial)
            for layout, channels in (("NCHW", ()), ("NHWC", (3,)), ("NHWC", (1,))):
                if layout == "NHWC" and len(planes) != 1:
                    continue
                shape = planes + spatial + channels
                for k in (1, 2, 3):
                    kernel = tuple(min(k, i) for i in spatial)
                    yield window(shape, kernel, 1, layout=layout)
                    yield window(shape, kernel, kernel, layout=layout, op="avg")
                yield S.adaptive_spec("adaptive_max_pool", "max", shape, "float32", (1,) * nd,
                                      layout, return_indices=True)


@pytest.mark.parametrize("device", [H100, SMALL_GPU])
def test_blocks_hold_two_warps_when_there_are_64_outputs(device):
    """Small planes are packed several to a block (block z), so no launch with >= 64
    outputs runs blocks under 64 threads (a streaming multiprocessor holds at most 32
    blocks); every output is still covered. (A max whose window covers its plane runs as the
    global max: see its own test.)"""
    for sp in _small_plane_specs():
        pl = plan(sp, device)
        if pl.family == "global":
            continue
        (la,) = pl.launches
        tx, ty, tz = la.block
        outputs = math.prod(sp.out_shape)
        if outputs >= 64:
            assert tx * ty * tz >= 64, (sp.geom.shape, sp.out_spatial, la)
        assert tx * ty * tz <= 256 and tz <= 64
        if la.kernel.endswith("_lanes"):  # one output per group of tx lanes, on grid x
            assert tx * ty == planner.BLOCK_THREADS and la.grid[0] * ty >= outputs
            continue
        planes = sp.geom.batch if sp.geom.layout == "NHWC" else sp.geom.planes
        assert la.grid[1] * la.grid[2] * tz >= planes
        units, cols = covered_outputs(sp, la)
        od, oh, ow = planner.canonical3(sp.out_spatial, 1)
        if sp.geom.layout == "NHWC":
            assert units >= od * oh * ow and cols >= sp.geom.channels
        else:
            assert units >= od * oh and cols >= ow


@pytest.mark.parametrize("op, shape, kw", [
    ("avg_pool", (256, 2048, 7, 7), dict(kernel_size=7)),
    ("adaptive_max_pool", (256, 2048, 7, 7), dict(output_size=(1, 1), return_indices=True)),
    ("max_pool", (512, 512, 4, 4), dict(kernel_size=2)),
    ("max_pool", (4096, 64, 10), dict(kernel_size=(2,))),
])
def test_launches_that_wasted_the_gpu_now_fill_blocks(op, shape, kw):
    text = explain(op, shape, **kw)
    block = eval(text.split(" block ")[-1].split(":")[0])
    assert math.prod(block) >= 64, text
    assert "packing:" in text or "lane groups:" in text


def test_explain_reports_traffic_and_the_roofline_floor():
    text = explain("max_pool", (8, 64, 112, 112), kernel_size=3, stride=2, padding=1,
                   return_indices=True, device=DeviceInfo(dram_gbps=1000.0))
    line = [w for w in text.splitlines() if w.startswith("launch:")][0]
    read, written = 8 * 64 * 112 * 112 * 4, 8 * 64 * 56 * 56 * (4 + 8)
    assert f"reads {read / 1e6:.3f} MB, writes {written / 1e6:.3f} MB" in line
    assert f"floor {(read + written) / 1e12 * 1e6:.2f} us at 1000 GB/s DRAM" in line
    (la,) = plan(S.window_spec("max_pool", "max", (8, 64, 112, 112), "float32", 3, 2, 1, 1,
                               False, "NCHW", return_indices=True), H100).launches
    assert (la.bytes_read, la.bytes_written, la.outputs) == (read, written, 8 * 64 * 56 * 56)
    assert la.floor_seconds(DeviceInfo(dram_gbps=0)) == 0
    first, second = plan(S.global_spec("g", "avg", (1, 2, 4096, 4096), "float16", 2, "NCHW"),
                         H100).launches
    n = first.get("nchunks")
    assert (first.bytes_read, first.bytes_written) == (2 * 4096 * 4096 * 2, 2 * n * 4)
    assert (second.bytes_read, second.bytes_written) == (2 * n * 4, 2 * 2)
    assert "unknown" in explain("global_max_pool", (2, 3, 4, 4), device=DeviceInfo(dram_gbps=0))


# float64 in the tests of the general window launch: float16 and float32 take the row tiles
def test_many_planes_split_across_planes_only():
    sp = window((512, 512, 14, 14), 2, 2, dtype="float64")
    pl = plan(sp, H100)
    la = pl.launches[0]
    assert la.grid[0] == 1  # one block column per plane
    assert any("across the 262144 planes only" in w for w in pl.words)


def test_few_planes_split_spatial_dims():
    sp = window((1, 2, 512, 512), 3, 1, 1, dtype="float64")
    pl = plan(sp, H100)
    la = pl.launches[0]
    assert la.grid[0] > 1
    assert la.grid[0] * la.grid[1] >= 2  # more blocks than planes
    assert any("too few planes" in w for w in pl.words)
    assert any("halo" in w for w in pl.words)


def test_aligned_chunks_without_overlap_or_padding():
    pl = plan(window((1, 1, 1024, 1024), 2, 2, dtype="float64"), H100)
    assert any("aligned" in w for w in pl.words)
    pl = plan(window((1, 1, 1024, 1024), 3, 2, dtype="float64"), H100)
    assert any("halo" in w for w in pl.words)


def test_3d_chunks_cut_depth_before_height():
    sp = window((1, 1, 64, 8, 8), (1, 1, 1), 1)
    pl = plan(sp, H100)
    assert any("D cut first" in w or "D and H" in w for w in pl.words)


def test_planes_beyond_grid_y_go_to_z():
    # float64: the tiled kernels (the row tiles take float16/32)
    sp = window((3, 40000, 16, 16), 2, 2, dtype="float64")  # 8x8 outputs: 64 threads a plane
    la = plan(sp, H100).launches[0]
    assert la.block[2] == 1 and la.grid[1] == 65535 and la.grid[2] == 2
    sp = window((3, 40000, 4, 4), 2, 2, dtype="float64")  # 2x2 outputs: 64 planes a block
    la = plan(sp, H100).launches[0]
    assert la.block == (2, 2, 64) and la.grid[1:] == (1875, 1)


def test_row_tiles_take_more_planes_than_a_grid_dim_when_packed():
    """Row tiles hold planes in groups of TZ on grid z: 120000 planes of 8x8 outputs (16 row
    tiles each, 16 planes a block) fit; 120000 planes of 64 row tiles each (no packing) do
    not, and take the tiled kernels."""
    la = plan(window((3, 40000, 16, 16), 2, 2), H100).launches[0]
    assert la.kernel == "max_pool_rows" and la.block[2] == 16
    assert la.grid[2] == 120000 // 16 and la.grid[2] <= 65535
    assert plan(window((3, 40000, 16, 64), 2, 2), H100).launches[0].kernel == "max_pool"


def test_row_tiles_are_as_wide_as_a_row_has_tiles_where_the_grid_makes_a_wave():
    """A values-only row-tile launch whose grid makes a wave of blocks takes a thread per tile
    of a row (28 outputs: 7 tiles of 4) and all 28 rows of a plane in a block, 196 threads in 7
    warps, so that no lane idles past a row's end; a max with indices (stored by lane pairs or
    warps of tiles side by side), and a grid under a wave, keep power-of-two blocks."""
    la = plan(window((256, 64, 56, 56), 3, 2, 1, dtype="float16"), H100).launches[0]
    assert la.kernel == "max_pool_rows" and la.block == (7, 28, 1)
    la = plan(window((256, 64, 56, 56), 3, 2, 1, dtype="float16", return_indices=True),
              H100).launches[0]
    assert la.kernel == "max_pool_indices_rows" and la.block[0] == 8
    la = plan(window((1, 64, 56, 56), 3, 2, 1, dtype="float16"), H100).launches[0]
    assert la.kernel == "max_pool_rows" and la.block[0] == 8


def test_nhwc_threads_along_channels():
    la = plan(window((2, 16, 16, 256), 2, 2, layout="NHWC"), H100).launches[0]
    assert la.block[0] == 64
    la = plan(window((2, 16, 16, 3), 2, 2, layout="NHWC"), H100).launches[0]
    assert la.block[0] == 4


@pytest.mark.parametrize("channels, kw, align, expected", [
    (64, {}, 16, 4), (8, dict(dtype="float16"), 16, 8), (8, dict(dtype="bfloat16"), 16, 8),
    (2, dict(dtype="float64"), 16, 2), (192, dict(op="avg"), 16, 4),
    (6, {}, 16, 0),  # 24 bytes: no whole packs
    (12, dict(dtype="float16"), 16, 0),
    (64, {}, 8, 0),  # the input's start off a pack
    (64, dict(return_indices=True), 16, 0), (64, dict(op="lp", p=2.0), 16, 0),
    (64, dict(dtype="int32"), 16, 0), (64, dict(layout="NCHW"), 16, 0)])
def test_channel_packs(channels, kw, align, expected):
    """NHWC averages and values-only maxima of float dtypes take a thread per 16-byte pack of
    a position's channels where the channels and the input's start allow whole packs."""
    kw = {"op": "max", "dtype": "float32", "layout": "NHWC", **kw}
    op, dtype, layout = kw.pop("op"), kw.pop("dtype"), kw.pop("layout")
    shape = (4, 9, 9, channels) if layout == "NHWC" else (4, channels, 9, 9)
    sp = S.window_spec(f"{op}_pool", op, shape, dtype, 3, 2, 1, 1, False, layout, **kw)
    assert planner.channel_pack(sp, align) == expected
    la = plan(sp, H100, align=align).launches[0]
    assert la.kernel.endswith("_packs") == bool(expected)
    if expected:  # a block along the packs of a position: none idle under 64
        assert la.block[0] == min(64, channels // expected)


@pytest.mark.parametrize("shape, k, s, p, d, kw, expected", [
    ((32, 64, 112, 112), 3, 2, 1, 1, dict(op="avg"), (3, 3, 2, 1, 4, 3)),
    ((16, 128, 56, 56), 2, 2, 0, 1, dict(op="avg", dtype="float16"), (2, 2, 2, 1, 8, 0)),
    ((2, 3, 9, 300), 3, 1, 1, 1, dict(op="avg"), (3, 3, 1, 1, 4, 3)),
    ((2, 3, 9, 300), 3, 1, 1, 1, dict(op="avg", dtype="bfloat16"), (3, 3, 1, 1, 4, 3)),  # 8 bytes
    ((2, 3, 9, 302), 3, 1, 1, 1, dict(op="avg"), (3, 3, 1, 1, 1, 0)),  # rows off the packs
    ((32, 80, 4096), (3,), 3, 0, 1, dict(dtype="float16"), (1, 3, 3, 1, 4, 0)),
    ((32, 80, 4096), (3,), 3, 0, 1, dict(dtype="bfloat16"), (1, 3, 3, 1, 4, 0)),
    ((32, 80, 4097), (3,), 3, 0, 1, dict(dtype="float16"), (1, 3, 3, 1, 1, 0)),  # 1-D, 2 bytes
    ((32, 80, 4097), (3,), 3, 0, 1, {}, (1, 3, 3, 1, 4, -1)),  # shifted packs
    ((3, 5, 4097), (3,), 3, 0, 1, {}, (1, 3, 3, 1, 1, 0)),  # ... where the input ends on one
    ((32, 80, 4096), (3,), 3, 0, 1, dict(dtype="float16", return_indices=True),
     (1, 3, 3, 1, 4, 0)),
    ((32, 64, 112, 112), 3, 2, 1, 1, dict(return_indices=True), (3, 3, 2, 1, 4, 3)),
    ((32, 64, 55, 55), 3, 2, 0, 1, dict(return_indices=True), (3, 3, 2, 1, 4, -1)),
    ((32, 64, 112, 112), 3, 2, 1, 1, {}, (3, 3, 2, 1, 4, 3)),  # a 2-D max, in packs
    ((16, 128, 56, 56), 2, 2, 0, 1, dict(dtype="float16"), (2, 2, 2, 1, 8, 0)),
    ((32, 64, 55, 55), 3, 2, 0, 1, {}, (3, 3, 2, 1, 4, -1)),  # rows off the packs: shifted
    ((3, 5, 55, 55), 3, 2, 0, 1, {}, None),  # ... where the input ends on a pack
    ((32, 64, 35, 35), 3, 1, 1, 1, {}, (3, 3, 1, 1, 4, -1)),  # a 2-D max, whatever its stride
    ((32, 64, 35, 35), 3, 1, 1, 1, dict(op="avg"), (3, 3, 1, 1, 1, 0)),  # an average of stride 1
    ((2, 256, 32000), (5,), 4, 2, 1, dict(op="avg", count_include_pad=True), (1, 5, 4, 1, 4, 2)),
    ((2, 128, 56, 56), 5, 2, 2, 1, dict(op="avg", dtype="float16"), (5, 5, 2, 1, 8, 6)),
    ((3, 96, 55, 57), (3, 5), 2, (1, 2), 1, dict(op="avg", dtype="bfloat16", divisor_override=7),
     (3, 5, 2, 1, 8, -1)),  # rows off the packs
    ((64, 8192), (4,), 4, 0, 1, dict(op="avg"), (1, 4, 4, 1, 4, 0)),
    ((32, 64, 112, 112), 3, 2, 1, 1, dict(op="avg", layout="NHWC"), None),  # NHWC
    ((32, 64, 112, 112), 3, 2, 1, 1, dict(op="avg", dtype="float64"), None),
    ((32, 64, 112, 112), 3, 2, 1, 2, dict(op="avg"), None),  # a W dilation not compiled in
    # a 1-D window of W dilation 2 (row_tiles.ROW_TILE_WINDOWS); one of dilation 3 is not
    ((16, 128, 2048), (5,), 2, 2, 2, dict(dtype="float16"), (1, 5, 2, 2, 8, 6)),
    ((16, 128, 2048), (5,), 2, 2, 2, dict(return_indices=True), (1, 5, 2, 2, 4, 2)),
    ((16, 128, 2048), (5,), 2, 2, 2, dict(op="avg", dtype="bfloat16"), (1, 5, 2, 2, 8, 6)),
    ((16, 128, 2045), (5,), 2, 2, 2, dict(dtype="float16"), (1, 5, 2, 2, 1, 0)),
    ((16, 128, 2045), (5,), 2, 2, 2, {}, (1, 5, 2, 2, 4, -1)),
    ((16, 128, 2048), (5,), 2, 2, 3, dict(dtype="float16"), None),
    ((32, 64, 112, 112), 3, 3, 1, 1, dict(op="avg"), None),  # a stride not compiled in
    ((2, 3, 10, 10, 10), (2, 2, 2), 2, 0, 1, dict(op="avg"), (2, 2, 2, 1, 4, -1)),  # shifted
    ((1, 1, 3, 10, 9), (2, 2, 2), 2, 0, 1, dict(op="avg"), None),  # ... ends off a pack
    # a 3-D max with one D tap per window at its own slice: the 2-D pooling of its slices
    ((8, 64, 16, 112, 112), (1, 2, 2), (1, 2, 2), 0, 1, dict(dtype="float16"), (2, 2, 2, 1, 8, 0)),
    ((2, 3, 5, 64, 64), (1, 3, 3), (1, 2, 2), (0, 1, 1), 1, {}, (3, 3, 2, 1, 4, 3)),
    # ... else the D taps at run time (max_pool_depth_rows), and always with indices
    ((8, 64, 16, 112, 112), (1, 2, 2), (1, 2, 2), 0, 1,
     dict(dtype="float16", return_indices=True), (2, 2, 2, 1, 8, 0)),
    ((2, 3, 5, 64, 64), (1, 3, 3), (1, 2, 2), 1, 1, {}, (3, 3, 2, 1, 4, 3)),  # D padding
    ((2, 3, 5, 64, 64), (1, 3, 3), (2, 2, 2), (0, 1, 1), 1, {}, (3, 3, 2, 1, 4, 3)),  # D stride
    ((4, 128, 16, 56, 56), (2, 2, 2), 2, 0, 1, dict(dtype="float16"), (2, 2, 2, 1, 8, 0)),
    ((2, 3, 10, 10, 10), (2, 2, 2), 2, 0, 1, {}, (2, 2, 2, 1, 4, -1)),  # rows off the packs
    ((2, 3, 5, 64, 64), (3, 3, 3), (1, 2, 2), 1, 2, {}, None),  # dilation
    ((2, 3, 5, 64, 64), (1, 3, 3), (1, 2, 2), (0, 1, 1), 1, dict(op="avg"), (3, 3, 2, 1, 4, 3)),
    ((1, 32, 16, 56, 56), (2, 2, 2), 2, 0, 1, dict(op="avg", dtype="float16"), (2, 2, 2, 1, 8, 0)),
    ((2, 3, 5, 8, 64), (2, 1, 3), (1, 1, 2), 0, 1, {}, None),  # D taps, a window 1 high
    # slices, planes past one grid dim (a block of 256 threads per slice or plane: no packing)
    ((4000, 20, 8, 2048), (1, 2, 2), (1, 2, 2), 0, 1, {}, None),
    ((70000, 8, 2048), 2, 2, 0, 1, dict(op="avg"), None),
])
def test_row_tiles_take_the_compiled_in_nchw_windows(shape, k, s, p, d, kw, expected):
    """1-D and 2-D NCHW averages and max pooling (values, or values and indices) of
    ROW_TILE_DTYPES with a window, W stride and W dilation of ROW_TILE_WINDOWS (D and H dilation
    1) take the row-tile kernels, ROW_TILE outputs per thread, in packs of 16 bytes (8 where 16
    do not divide ROW_TILE * SW) where the packs divide the rows, else in shifted packs of 16
    bytes where the input ends on one (but for windows of W stride 1 and 1-D ones of 2-byte
    elements that may load a column at a time); a 2-D or 3-D max only in packs; 3-D as 2-D
    planes where each window takes one D tap at its own slice (not a max with indices), else the
    D taps at run time, in packs only and for windows over 1 high; the rest the general window
    walk."""
    sp = window(shape, k, s, p, d, **kw)
    assert row_tiles.row_tile(sp) == expected
    (la,) = plan(sp, H100).launches
    assert la.kernel.endswith("_rows") == (expected is not None)
    if expected:
        assert tuple(map(la.get, row_tiles.ROW_TILE_PARAMS)) == expected
        assert la.grid[0] * la.block[0] * row_tiles.ROW_TILE >= sp.out_spatial[-1]
        depth = la.kernel.endswith("depth_rows")
        slices = row_tiles.depth_slices(sp)
        assert depth == (slices == 0)
        assert la.kernel.startswith("max_pool_indices_") == sp.return_indices
        od, oh, ow = planner.canonical3(sp.out_spatial, 1)
        wchunks = -(-ow // (la.block[0] * row_tiles.ROW_TILE))
        # depth: (W chunks x row groups, plane groups, 1); else (W chunks, row groups, planes)
        planes, rows = (la.grid[1], la.grid[0] // wchunks) if depth else la.grid[2:0:-1]
        assert planes * la.block[2] >= sp.geom.planes * max(slices, 1)
        assert rows * la.block[1] >= (od * oh if depth else oh)
    lp = S.window_spec("lp_pool", "lp", shape, "float32", k, s, p, d, False, "NCHW", p=2.0)
    assert row_tiles.row_tile(lp) is None


@pytest.mark.parametrize("align, avg, max_", [(16, (3, 3, 2, 1, 4, 3), (3, 3, 2, 1, 4, 3)),
                                              (8, (3, 3, 2, 1, 1, 0), None),
                                              (4, (3, 3, 2, 1, 1, 0), None)])
def test_row_tiles_load_packs_only_from_an_input_aligned_to_them(align, avg, max_):
    """An input whose start is not aligned to a pack loads a column at a time (averages) or
    takes the general walk (a 2-D max)."""
    for op, expected in (("avg", avg), ("max", max_)):
        sp = window((2, 64, 112, 112), 3, 2, 1, 1, op=op)
        assert row_tiles.row_tile(sp, align) == expected
        (la,) = plan(sp, H100, align=align).launches
        assert la.kernel == (f"{op}_pool_rows" if expected else f"{op}_pool")


@pytest.mark.parametrize("k,expected", [(3, 3), (2, 2), (5, 0), ((3, 2), 0), ((1, 3, 3), 3),
                                        ((3,), 0)])
def test_static_window(k, expected):
    nd = len(k) if isinstance(k, tuple) else 2
    shape = (1, 1) + (9,) * nd
    assert planner.static_window(window(shape, k, 1)) == expected


@pytest.mark.parametrize("k,s,d,expected", [(3, 2, 1, 2), (2, 2, 1, 1), (3, 1, 1, 0),
                                            (2, 1, 1, 2), (3, 3, 1, 1), (2, 3, 2, 1),
                                            (3, 2, 2, 0), (2, 2, 2, 2), (5, 4, 1, 2)])
def test_gather_covers_bounds_the_covering_windows(k, s, d, expected):
    """The bound the window backward kernels compile in (1 or 2 windows covering an input
    position along H and W, else 0) is the most that cover any position, counted by direct
    loops over the outputs of an input padded at both ends; 64-bit offsets compile none."""
    n, pad = 40, (k - 1) * d // 2
    fwd = window((1, 1, n, n), k, s, pad, d, op="avg")
    out = fwd.out_spatial[-1]
    most = max(sum(1 for o in range(out) for t in range(k) if o * s - pad + t * d == i)
               for i in range(n))
    assert planner.gather_covers(fwd, "int", "avg") == (most if most <= 2 else 0) == expected
    assert planner.gather_covers(fwd, "long long", "avg") == 0
    # the max gradients' packs of MAX_PACK positions along W: the windows reaching any of them
    pack = max(sum(1 for o in range(out) if any(
        o * s - pad + t * d == i for t in range(k) for i in range(w0, w0 + planner.MAX_PACK)))
        for w0 in range(0, n, planner.MAX_PACK))
    assert planner.gather_covers(fwd, "int", "max") == (3 if max(most, pack) <= 3 else 0)


@pytest.mark.parametrize("d", [1, 2, 3, 7, 56, 255, 1000, 2**16 + 1, 2**30 - 3, 2**30,
                               2**30 + 1, 2**31 - 1])
def test_divider_magic_divides_every_31_bit_numerator(d):
    """gp::Divider's arithmetic, (((n * m) >> 32) + n) >> s in 32-bit unsigned words, against
    Python's n // d, on numerators at and around the multiples of d up to 2**31 - 1."""
    from gpupool.cuda.grid import divider
    word = divider(d) % 2**64  # the kernel reads it as an unsigned 64-bit word
    m, s = word >> 32, word & 31
    assert word & (2**32 - 32) == 0 and m < 2**32
    q = list(range(0, 2**31 // d, max(1, 2**31 // d // 4000))) + [2**31 // d]
    ns = {min(2**31 - 1, max(0, k * d + e)) for k in q for e in (-1, 0, 1)} | {2**31 - 1}
    for n in sorted(ns):
        hi = (n * m) >> 32
        assert ((hi + n) % 2**32) >> s == n // d, n


def test_divider_is_not_used_past_31_bits():
    from gpupool.cuda.grid import divider
    assert divider(2**31) == 0


def test_index_type_32_and_64_bit():
    assert plan(window((2, 3, 100, 100), 2), H100).index_type == "int"
    big = window((1, 1, 2**16, 2**15 + 64), 2, 2, dtype="int8")
    assert math.prod(big.geom.shape) > 2**31
    assert plan(big, H100).index_type == "long long"
    near = window((1, 1, 2**15, 2**16 - 4), 2, 2, dtype="int8")  # 2**31 - 2**17 elements
    assert plan(near, H100).index_type == "int"


def test_adaptive_index_type_counts_the_bound_product():
    sp = S.adaptive_spec("adaptive_max_pool", "max", (1, 1, 60000, 1), "float32",
                         (50000, 1), "NCHW")
    assert plan(sp, H100).index_type == "long long"  # 50001 * 60000 > 2**31


def test_global_small_planes_use_lane_groups():
    sp = S.global_spec("global_avg_pool", "avg", (512, 2048, 7, 7), "float32", 2, "NCHW")
    pl = plan(sp, H100)
    (la,) = pl.launches
    assert la.kernel == "global_lanes" and la.get("lanes") == 4
    assert la.grid[0] * (256 // 4) >= 512 * 2048


@pytest.mark.parametrize("dtype,lanes", [("float32", 4), ("int32", 4), ("float16", 4),
                                         ("int16", 4), ("int8", 16), ("float64", 16)])
def test_global_lane_groups_take_about_four_loads_per_lane(dtype, lanes):
    """2- and 4-byte elements load in fours, so a 7x7 plane takes a quarter of the lanes."""
    op = "avg" if dtype.startswith("float") else "max"
    sp = S.global_spec(f"global_{op}_pool", op, (4, 64, 7, 7), dtype, 2, "NCHW")
    (la,) = plan(sp, H100).launches
    assert la.kernel == "global_lanes" and la.get("lanes") == lanes


def test_global_large_planes_split_in_two_passes():
    sp = S.global_spec("global_avg_pool", "avg", (1, 2, 4096, 4096), "float16", 2, "NCHW")
    pl = plan(sp, H100)
    first, second = pl.launches
    assert first.kernel == "global_block" and first.get("partial") == 1
    n, length = first.get("nchunks"), first.get("chunklen")
    assert n * length >= 4096 * 4096 > (n - 1) * length
    assert first.grid[0] == 2 * n
    assert second.kernel == "global_lanes" and second.get("seglen") == n <= 1024


def test_global_many_large_planes_one_pass():
    sp = S.global_spec("global_max_pool", "max", (64, 256, 64, 64), "float32", 2, "NCHW")
    (la,) = plan(sp, H100).launches
    assert la.kernel == "global_block" and la.get("nchunks") == 1


def test_global_nhwc_split():
    sp = S.global_spec("global_max_pool", "max", (2, 1000, 1000, 3), "float32", 2, "NHWC")
    first, second = plan(sp, H100).launches
    assert first.kernel == second.kernel == "global_channels"
    n = first.get("nchunks")
    assert first.grid[1] * first.grid[2] >= 2 * n
    assert second.get("chunklen") == n


@pytest.mark.parametrize("shape, k, s, p, d, kw, kernel", [
    ((64, 256, 128), (128,), 1, 0, 1, dict(dtype="float16"), "global_lanes"),
    ((2, 3, 37), (40,), 40, 2, 1, {}, "global_lanes"),  # padding around the plane
    ((2, 5, 6, 3), (5, 6), None, 0, 1, dict(layout="NHWC"), "global_channels"),
    ((2, 3, 100, 100), 100, None, 0, 1, {}, "global_block"),
    ((2, 3, 37), (37,), 1, 0, 1, dict(return_indices=True), "adaptive_max_indices_lanes"),
    ((2, 5, 6, 3), (5, 6), None, 0, 1, dict(return_indices=True, layout="NHWC"),
     "adaptive_max_indices"),
    ((2, 3, 37), (37,), 1, 0, 1, dict(return_indices=True, dtype="int8"), "max_pool_indices"),
    ((2, 3, 37), (36,), 2, 0, 1, {}, "max_pool"),  # the last element in no window
    ((2, 3, 37), (19,), 1, 0, 2, {}, "max_pool"),  # dilation: every other element
    ((2, 3, 37), (37,), 1, 0, 1, dict(op="avg"), "avg_pool"),
    ((2, 3, 37), (37,), 1, 0, 1, dict(dtype="int8"), "max_pool"),
])
def test_max_windows_covering_their_planes_run_as_the_global_max(shape, k, s, p, d, kw, kernel):
    """A values-only float max whose one window per plane covers the plane runs as the global
    max's segmented reduction, and with indices as the adaptive max to size 1 (the global
    kernels have none); another op, an integer dtype (the quantized word kernels plan integer
    windows as window launches) or a window that misses an element, the window kernels."""
    sp = window(shape, k, s, p, d, **kw)
    pl = plan(sp, H100)
    assert pl.launches[0].kernel == kernel
    assert (pl.family == "global") == kernel.startswith("global")


def test_global_with_indices_takes_the_adaptive_kernels():
    """The global kernels have no indices: lane groups on planes 4 or more columns wide, else
    the tiled walk."""
    for spatial, kernel in (((5, 5), "adaptive_max_indices_lanes"),
                            ((5, 3), "adaptive_max_indices")):
        sp = S.adaptive_spec("adaptive_max_pool", "max", (2, 3) + spatial, "float32", (1, 1),
                             "NCHW", return_indices=True)
        pl = plan(sp, H100)
        assert pl.family == "adaptive" and pl.launches[0].kernel == kernel


@pytest.mark.parametrize("op, dtype, shape, out, layout, lanes, rows", [
    ("avg", "float16", (8, 2048, 7, 7), (1, 1), "NCHW", 4, 8),  # 7 columns, two per lane
    ("avg", "float16", (2, 128, 56, 56), (6, 6), "NCHW", 8, 16),  # up to 10 columns, bound 11
    ("max", "float32", (1, 2, 3, 160), (1, 2), "NCHW", 32, 4),  # 80 columns: two passes
    ("max", "float32", (1, 2, 40, 9), (2, 2), "NCHW", 4, 16),  # 20 rows: two batches
    ("max", "int8", (2, 3, 12), (3,), "NCHW", 2, 1),  # 4 columns of one row
    ("avg", "float32", (4, 512, 14, 14), (7, 7), "NCHW", 0, 0),  # 2 columns: the tiled walk
    ("max", "float32", (1, 2, 4, 4, 40), (1, 1, 1), "NCHW", 0, 0),  # 3-D: the tiled walk
    ("max", "float32", (2, 9, 9, 64), (2, 2), "NHWC", 0, 0),  # threads along channels instead
    ("avg", "int8", (2, 3, 7, 9), (3, 2), "NCHW", 0, 0),  # the quantized average's own kernel
])
def test_adaptive_lane_groups(op, dtype, shape, out, layout, lanes, rows):
    sp = S.adaptive_spec(f"adaptive_{op}_pool", op, shape, dtype, out, layout,
                         integers="int" in dtype)
    assert planner.adaptive_lanes(sp) == lanes
    if lanes:
        (la,) = plan(sp, H100).launches
        assert la.kernel == f"adaptive_{op}_lanes" and la.block == (lanes, 256 // lanes, 1)
        assert la.grid[0] * la.block[1] >= math.prod(sp.out_shape)
        assert la.get("batch_rows") == planner.lane_rows(sp) == rows


def test_unpool_plan():
    sp = S.unpool_spec("max_unpool", (2, 3, 4, 4), "float32", (2, 3, 4, 4), "int64", 2, None,
                       0, None, "NCHW")
    pl = plan(sp, H100)
    assert pl.family == "unpool" and pl.launches[0].grid[0] >= 1


def test_unpool_of_windows_that_tile_the_output_with_int64_indices_takes_the_tiles():
    """2x2 s2 NCHW with int64 indices: a thread per 8 bytes of pooled values (2 floats) and
    their indices writes its windows' rows, every output once; int32 indices or NHWC take the
    gather."""
    def unpool(index_dtype, layout):
        shape = (2, 3, 8, 8) if layout == "NCHW" else (2, 8, 8, 3)
        return S.unpool_spec("max_unpool", shape, "float32", shape, index_dtype, 2, 2, 0, None,
                             layout)
    (la,) = plan(unpool("int64", "NCHW"), H100).launches
    x = 2 * 3 * 8 * 8
    assert la.kernel == "max_unpool_tiles" and la.outputs == 4 * x
    assert la.threads == x // 2 and (la.bytes_read, la.bytes_written) == (x * 12, 4 * x * 4)
    assert plan(unpool("int32", "NCHW"), H100).launches[0].kernel == "max_unpool_gather"
    assert plan(unpool("int64", "NHWC"), H100).launches[0].kernel == "max_unpool_gather"


def test_unpool_gathers_where_windows_do_not_overlap():
    """2x2 s2 (and k2 d2 s3: extent 3 = stride): one gather pass that reads x and the indices
    and writes each output once; 3x3 s2 windows overlap, and more than 3 spatial dims have
    no gather: zero fill + scatter, which writes the output twice. ``scatter=True`` asks for
    the scatter where the gather applies (indices outside their windows)."""
    def unpool(shape, k, s, d=1):
        return S.unpool_spec("max_unpool", shape, "float32", shape, "int32", k, s, 0, None,
                             "NCHW", dilation=d)
    x = 2 * 3 * 8 * 8  # pooled elements (and int32 indices)
    for sp in (unpool((2, 3, 8, 8), 2, 2), unpool((2, 3, 8, 8), 2, 3, 2)):
        (la,) = plan(sp, H100).launches
        out = math.prod(sp.out_shape)
        assert la.kernel == "max_unpool_gather" and la.outputs == out
        assert (la.bytes_read, la.bytes_written) == (x * 4 + x * 4, out * 4)
        (sc,) = plan(sp, H100, scatter=True).launches
        assert sc.kernel == "max_unpool" and sc.bytes_written == 2 * out * 4
    for sp in (unpool((2, 3, 8, 8), 3, 2), unpool((2, 2, 3, 3, 3, 3), (2,) * 4, 2)):
        assert [la.kernel for la in plan(sp, H100).launches] == ["max_unpool"]


def test_explain_reads_like_the_op():
    text = explain("max_pool", (64, 64, 112, 112), kernel_size=3, stride=2, padding=1)
    assert text.startswith("max_pool: output (64, 64, 56, 56)")
    assert "H100" in text and "grid" in text and "32-bit" in text
    text = explain("global_avg_pool", (8, 2048, 7, 7), dtype="float16")
    assert "4 lanes per plane" in text
    text = explain("adaptive_avg_pool", (1, 3, 10, 10), output_size=(3, 3), layout="NCHW")
    assert "adaptive_avg" in text
    text = explain("lp_pool", (1, 3, 10, 10), 2, p=2.0, device=SMALL_GPU)
    assert "test GPU" in text


def test_explain_raises_like_the_op():
    with pytest.raises(ValueError, match="unknown op"):
        explain("median_pool", (1, 1, 4, 4), 2)
    with pytest.raises(ValueError):
        explain("max_pool", (1, 1, 2, 2), 5)  # output too small
    with pytest.raises(TypeError):
        explain("avg_pool", (1, 1, 4, 4), 2, dtype="int8")


def test_more_than_three_spatial_dims_not_planned():
    sp = window((1, 1, 3, 3, 3, 3), (2, 2, 2, 2), 1)
    with pytest.raises(ValueError, match="1-3 spatial dims"):
        plan(sp, H100)
