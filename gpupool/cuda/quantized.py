"""CUDA backend of :mod:`gpupool.quantized`: kernels in ``kernels_cu/quantized_pool.cu``.

Reuses the float backend's machinery: kernel loading (:mod:`gpupool.cuda.kernels`, memoized
per device), launch steps (:mod:`gpupool.cuda.launching`), the launch planner and its
thread-to-output maps, and the index-type rule. The requantization table and the
per-position table rows are built on the host (:func:`gpupool.quantized_spec.avg_plan`) and
copied to each device once per plan, into a byte-bounded memo (:mod:`gpupool.cpu.memo`);
prepared launches take them at each call.

* max, NHWC with ``C % 4 == 0`` (and a 4-byte aligned buffer): ``qmax_pool_nhwc4``, 4 channels
  per 32-bit word with ``__vmaxs4`` / ``__vmaxu4``.
* max and window average of 2 x 2 windows of stride 2, 2-D NCHW with input rows of whole
  16-byte packs (:func:`gpupool.cuda.row_tiles.pair_tiles`) on an input aligned to 16 bytes:
  ``qmax_pool_pairs`` / ``qavg_pool_pairs``, 8 outputs per thread from one 16-byte load of
  each of their two input rows; the average where its table requantizes in 32 bits with one
  row.
* otherwise max and window average, NCHW with ``OW % 4 == 0``, rows of whole words and
  windows of 4 outputs spanning at most 16 input bytes (:func:`_row_units`):
  ``qmax_pool_words`` / ``qavg_pool_words``, one thread per output word (4 outputs along W)
  from aligned 8- or 4-byte loads of the input rows; the average where its table
  requantizes in 32 bits (:func:`gpupool.quantized_spec.narrow_table`: every window small
  enough).
* otherwise max runs the float backend's integer ``max_pool`` kernel (one code per thread),
  and averages ``qavg_pool`` (window) and ``qavg_adaptive``; int32 accumulation (int64 where a
  window could overflow it); global: ``qavg_global_lanes`` / ``_block`` / ``_channels``, the
  float global kernels' segmented reductions with the launches the planner makes for them
  (a split plane's partial sums in the accumulator dtype, reduced and requantized by a
  second launch).
* more than 3 spatial dims: the NumPy backend through a host round trip, as the float ops.
"""
from __future__ import annotations

import dataclasses
import functools
import operator

import cupy
import numpy as np

from . import kernels, launching, planner, row_tiles
from .forward import window as float_window
from .names import (qavg_adaptive_name, qavg_global_name, qavg_pairs_name, qavg_pool_name,
                    qavg_words_name, qmax_nhwc4_name, qmax_pairs_name, qmax_words_name)
from .launching import (Step, contiguous, geo_args, global_passes, itype_scalar,
                        launch, launch_cache, on_host)
from ..cpu import quantized as cpu_quantized
from ..cpu.memo import array_memo
from ..quantized_spec import HEAD, LEVELS, AvgPlan
from ..spec import AdaptiveSpec, Geometry, WindowSpec


@array_memo(256)
def _device_tables(plan: AvgPlan, device_id: int) -> tuple:
    """The plan's rows and table on ``device_id``, copied once per plan and device (while
    kept). The copy is waited for, as any stream may read the tables later."""
    with cupy.cuda.Device(device_id):
        rows, table = cupy.asarray(plan.rows_and_counts()[0]), cupy.asarray(plan.table)
        cupy.cuda.get_current_stream().synchronize()
        return rows, table


def _launch_averages(steps, scratch, x, out, plan: AvgPlan, device_id: int) -> None:
    rows, table = _device_tables(plan, device_id)
    launch(steps, scratch, {"x": x, "out": out, "rows": rows, "table": table})


class _RequantStep:
    """A prepared launch of a requantizing kernel, as :class:`~gpupool.cuda.launching.Step`:
    the arrays named by ``io``, ``scalars``, the plan's device tables named by ``tables``,
    then ``tail``. The tables come with each launch (:func:`_device_tables`), so that a
    prepared launch keeps nothing per output position."""

    __slots__ = ("fn", "grid", "block", "io", "scalars", "tables", "tail", "_pick")

    def __init__(self, fn, grid, block, io, scalars, tables, tail):
        self.fn, self.grid, self.block, self.io = fn, grid, block, io
        self.scalars, self.tables, self.tail = scalars, tables, tail
        self._pick = operator.itemgetter(*io, *tables)  # three or more names: a tuple

    def __call__(self, arrays: dict) -> None:
        picked, n = self._pick(arrays), len(self.io)
        self.fn(self.grid, self.block, picked[:n] + self.scalars + picked[n:] + self.tail)


def _word_spec(spec: WindowSpec) -> WindowSpec:
    """The same window over 32-bit words of 4 channels (NHWC, C % 4 == 0)."""
    g = spec.geom
    geom = Geometry(g.func, g.shape[:-1] + (g.channels // 4,), "int32", g.layout, g.nd)
    return dataclasses.replace(spec, geom=geom)


def _vmax4_applies(spec: WindowSpec) -> bool:
    """Whether ``qmax_pool_nhwc4`` can run ``spec`` (NHWC with ``C % 4 == 0``: 4 channels per
    32-bit word) on an input aligned to 4 bytes."""
    return spec.geom.layout == "NHWC" and spec.geom.channels % 4 == 0


def _aligned_unit(x, units: tuple[int, ...]) -> int:
    """The widest of ``units`` (load widths in bytes, widest first) that ``x``'s start is
    aligned to, 0 if none. Results need no check: each is a fresh array from CuPy's pool,
    whose blocks are 256-byte aligned."""
    start = x.data.ptr
    for unit in units:
        if start % unit == 0:
            return unit
    return 0


@launch_cache
def word_max_steps(spec: WindowSpec, device_id: int) -> tuple:
    """The launch of ``qmax_pool_nhwc4`` for ``spec`` on ``device_id`` (built once)."""
    wspec = _word_spec(spec)
    pl = planner.plan(wspec, launching.device_info(device_id))
    la = pl.launches[0]
    geo = geo_args(wspec, itype_scalar(pl.index_type), True) + (np.int32(la.rows),)
    fn = kernels.kernel(qmax_nhwc4_name(spec.geom.dtype, pl.index_type,
                                        planner.static_window(spec)))
    return (Step(fn, la.grid, la.block, ("x", "out"), geo),), None


@functools.lru_cache(maxsize=256)
def _row_units(spec: WindowSpec) -> tuple[tuple[int, ...], str]:
    """The load widths in bytes, widest first, that the NCHW word kernels can use for the
    geometry of ``spec`` (empty where none can), and why. A 4-byte unit spans no more than an
    8-byte one, so 8 implies 4."""
    g = spec.geom
    if g.layout != "NCHW":
        return (), "NHWC: threads run along the channels"
    iw, ow = g.spatial[-1], spec.out_spatial[-1]
    kw, sw, dw, pw = spec.kernel[-1], spec.stride[-1], spec.dilation[-1], spec.pads[-1][0]
    if ow % 4:
        return (), f"OW = {ow} is not a multiple of 4: output rows do not start on a word"
    if iw % 4:
        return (), f"input rows (IW = {iw}) are not whole words"
    units = []
    for unit in (8, 4) if iw % 8 == 0 else (4,):
        span = max((-pw) % unit, (4 * sw - pw) % unit) + 3 * sw + (kw - 1) * dw + 1
        if span <= 16 and pw <= 16:
            units.append(unit)
    if not units:
        return (), f"4 outputs span {span} bytes from a 4-byte boundary (at most 16)"
    return tuple(units), "4 outputs per thread"


def _row_word_spec(spec: WindowSpec) -> WindowSpec:
    """The window as the planner sees the word kernels (NCHW, OW % 4 == 0): one output per
    word of 4 along W, spanning the 4 windows' input columns."""
    kw, sw, dw = spec.kernel[-1], spec.stride[-1], spec.dilation[-1]
    return dataclasses.replace(
        spec, out_spatial=spec.out_spatial[:-1] + (spec.out_spatial[-1] // 4,),
        kernel=spec.kernel[:-1] + (3 * sw + (kw - 1) * dw + 1,),
        stride=spec.stride[:-1] + (4 * sw,), dilation=spec.dilation[:-1] + (1,))


def _row_words_launch(spec: WindowSpec, device_id: int, unit: int) -> tuple:
    """(plan, launch, geometry scalars with rows and unit) of a word kernel."""
    pl = planner.plan(_row_word_spec(spec), launching.device_info(device_id))
    la = pl.launches[0]
    geo = geo_args(spec, itype_scalar(pl.index_type), True)
    return pl, la, geo + (np.int32(la.rows), np.int32(unit))


@launch_cache
def row_max_steps(spec: WindowSpec, device_id: int, unit: int) -> tuple:
    """The launch of ``qmax_pool_words`` for ``spec`` on ``device_id`` (built once); with
    ``unit`` 16, of ``qmax_pool_pairs``."""
    if unit == 16:
        la, geo = _pair_launch(spec, device_id, "qmax_pool_pairs")
        fn = kernels.kernel(qmax_pairs_name(spec.geom.dtype))
        return (Step(fn, la.grid, la.block, ("x", "out"), geo),), None
    pl, la, geo = _row_words_launch(spec, device_id, unit)
    fn = kernels.kernel(qmax_words_name(spec.geom.dtype, pl.index_type,
                                        planner.static_window(spec)))
    return (Step(fn, la.grid, la.block, ("x", "out"), geo),), None


def _pair_launch(spec: WindowSpec, device_id: int, kernel: str) -> tuple:
    """(launch, geometry scalars with rows) of a pair kernel."""
    la = row_tiles.plan_pair_tiles(spec, launching.device_info(device_id), kernel).launches[0]
    return la, geo_args(spec, itype_scalar("int"), True) + (np.int32(la.rows),)


def _row_loads(spec: WindowSpec) -> tuple[int, ...]:
    """The load widths in bytes, widest first, of the NCHW kernels of 4-byte words or more
    for ``spec``: 16 for the pair kernels, then :func:`_row_units`'s."""
    return (16,) * row_tiles.pair_tiles(spec) + _row_units(spec)[0]


def _float_window(x, spec: WindowSpec, out) -> None:
    float_window(x, spec, out, None)


def qmax_window(x, spec: WindowSpec, out) -> None:
    prepare_qmax_window(spec)(x, spec, out)


@launch_cache
def prepare_qmax_window(spec: WindowSpec):
    """:func:`qmax_window` for ``spec``, its kernel family chosen once: the host round trip
    (more than 3 spatial dims), ``qmax_pool_nhwc4``, ``qmax_pool_pairs`` or ``qmax_pool_words``
    (on an input whose start is aligned to their loads), else the float backend's integer
    ``max_pool``."""
    if spec.geom.nd > 3:
        return functools.partial(on_host, cpu_quantized.qmax_window)
    if _vmax4_applies(spec):
        units, steps_of = (4,), lambda device, unit: word_max_steps(spec, device)
    else:
        units, steps_of = _row_loads(spec), functools.partial(row_max_steps, spec)
    if not units:
        return _float_window

    def words(x, spec, out) -> None:
        x = contiguous(x)
        unit = _aligned_unit(x, units)
        if not unit:
            return _float_window(x, spec, out)
        steps, scratch = steps_of(cupy.cuda.runtime.getDevice(), unit)
        launch(steps, scratch, {"x": x, "out": out})
    return words



def _requant_args(plan: AvgPlan, zp_in: int | None = None) -> tuple:
    """zp_in (default: the plan's), zp_out, qmin, qmax as the kernels take them."""
    return (np.int32(plan.zp_in if zp_in is None else zp_in), np.int32(plan.zp_out),
            np.int32(plan.qmin), np.int32(plan.qmax))


@launch_cache
def average_steps(spec, plan: AvgPlan, device_id: int) -> tuple:
    """The launches of a quantized average (window, adaptive or global) on ``device_id`` and
    the (size, dtype) of its partial sums, or None: built once per (spec, plan, device). A
    global average runs the float global kernels' launches over codes
    (:func:`gpupool.cuda.launching.global_passes`); a split plane's partial sums, in the
    accumulator dtype, have zp_in taken off already."""
    pl = planner.plan(spec, launching.device_info(device_id))
    g = spec.geom
    it = itype_scalar(pl.index_type)
    if isinstance(spec, AdaptiveSpec) and spec.is_global:
        steps = []
        for p in global_passes(spec, pl, it, plan.acc_dtype):
            name = qavg_global_name(p.launch.kernel, p.tin, plan.acc_dtype, p.tout,
                                    pl.index_type, p.lanes)
            steps.append(_RequantStep(kernels.kernel(name), p.launch.grid, p.launch.block, p.io,
                                      p.sizes, ("table",),
                                      _requant_args(plan, 0 if p.second else None)))
        scratch = ((g.planes * pl.launches[0].get("nchunks"), plan.acc_dtype)
                   if len(pl.launches) > 1 else None)
        return tuple(steps), scratch
    la = pl.launches[0]
    window = isinstance(spec, WindowSpec)
    nhwc = g.layout == "NHWC"
    name = (qavg_pool_name(g.dtype, plan.acc_dtype, pl.index_type, planner.static_window(spec),
                           nhwc) if window
            else qavg_adaptive_name(g.dtype, plan.acc_dtype, pl.index_type, nhwc))
    geo = geo_args(spec, it, window) + (np.int32(la.rows),)
    return (_RequantStep(kernels.kernel(name), la.grid, la.block, ("x", "out"), geo,
                         ("rows", "table"), _requant_args(plan)),), None


#: Most accumulator values :func:`_corrections` runs through; past it, both corrections stay.
CORRECTION_CHECK_LIMIT = 1 << 20


@functools.lru_cache(maxsize=256)
def _corrections(plan: AvgPlan) -> int:
    """The threshold corrections of ``gpq::requantize_with`` that change some result of
    ``plan``'s table: bit 0 up, bit 1 down. Found by running the kernel's integer steps over
    every ``x = min(|acc|, xcap)`` of every row; both when that is more than
    CORRECTION_CHECK_LIMIT values."""
    table = plan.table
    if int(table[:, 2].sum()) + len(table) > CORRECTION_CHECK_LIMIT:
        return 3
    checks = 0
    for row in table:
        x = np.arange(int(row[2]) + 1, dtype=np.int64)
        sh = int(row[1])
        v = (x * row[0] + np.int64((1 << sh) >> 1)) >> np.int64(sh)
        np.clip(v, 0, LEVELS, out=v)
        checks |= int((row[HEAD + 1 + v] <= x).any()) | 2 * int((row[HEAD + v] > x).any())
    return checks


@launch_cache
def row_average_steps(spec: WindowSpec, plan: AvgPlan, device_id: int, unit: int) -> tuple:
    """The launch of ``qavg_pool_words`` for ``spec`` and ``plan`` on ``device_id``, or with
    ``unit`` 16 of ``qavg_pool_pairs`` (one table row): with one table row for every output,
    its head goes as scalars (built once)."""
    m, sh, xcap = (int(v) for v in plan.table[0, :3])
    head = (np.int64(m), np.int32(sh), np.int64(xcap))
    checks = (np.int32(_corrections(plan)),)
    if unit == 16:
        la, geo = _pair_launch(spec, device_id, "qavg_pool_pairs")
        return (_RequantStep(kernels.kernel(qavg_pairs_name(spec.geom.dtype)), la.grid,
                             la.block, ("x", "out"), geo, ("table",),
                             head + checks + _requant_args(plan)),), None
    pl, la, geo = _row_words_launch(spec, device_id, unit)
    name = qavg_words_name(spec.geom.dtype, plan.acc_dtype, pl.index_type,
                           planner.static_window(spec))
    return (_RequantStep(kernels.kernel(name), la.grid, la.block, ("x", "out"), geo,
                         ("rows", "table"),
                         head + (np.int32(len(plan.table) == 1),) + checks
                         + _requant_args(plan)),), None


def qavg_window(x, spec: WindowSpec, out, plan: AvgPlan) -> None:
    prepare_qavg_window(spec)(x, spec, out, plan)


@launch_cache
def prepare_qavg_window(spec: WindowSpec):
    """:func:`qavg_window` for ``spec``, its kernel family chosen once: the host round trip
    (more than 3 spatial dims), ``qavg_pool_pairs`` (int32 sums, a table of one row) or
    ``qavg_pool_words`` (on an input aligned to their loads, with a table that requantizes in
    32 bits) or ``qavg_pool``."""
    if spec.geom.nd > 3:
        return functools.partial(on_host, cpu_quantized.qavg_window)
    loads, word_loads = _row_loads(spec), _row_units(spec)[0]

    def run(x, spec, out, plan) -> None:
        x = contiguous(x)
        device = cupy.cuda.runtime.getDevice()
        one_row = len(plan.table) == 1 and plan.acc_dtype == "int32"
        units = loads if one_row else word_loads
        unit = _aligned_unit(x, units) if units and plan.narrow else 0
        steps, scratch = (row_average_steps(spec, plan, device, unit) if unit
                          else average_steps(spec, plan, device))
        _launch_averages(steps, scratch, x, out, plan, device)
    return run



def qavg_adaptive(x, spec: AdaptiveSpec, out, plan: AvgPlan) -> None:
    if spec.geom.nd > 3 and not spec.is_global:
        on_host(cpu_quantized.qavg_adaptive, x, spec, out, plan)
        return
    device = cupy.cuda.runtime.getDevice()
    steps, scratch = average_steps(spec, plan, device)
    _launch_averages(steps, scratch, contiguous(x), out, plan, device)
