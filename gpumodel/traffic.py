"""Memory traffic of a traced launch (:class:`gpumodel.trace.Launch`) and an H100 time model.

Counts (:func:`analyze`, at the traced size):

* warp requests: the accesses of the 32 consecutive threads of a block (a warp) at one site,
  in the same *epoch* (the number of stores each thread made before: window kernels store
  once per output) and the same *occurrence* (how many times each thread already ran that site
  in the epoch: iterations of a loop that is not unrolled). Lanes that skip a site (padding
  taps, threads past the edge) are absent from its request, as on the GPU.
* sectors per request: distinct 32-byte sectors the request touches, against the ideal
  ``ceil(distinct bytes / 32)``. Each array is placed at a 256-byte aligned address, as
  ``cudaMalloc`` returns, so the host copies' alignment does not matter.
* DRAM bytes, under the L2 assumption: L2 (50 MB) keeps every sector a launch touches until the
  launch no longer needs it, so each distinct sector is read from DRAM once and each written
  sector is written back once. Pooling reuses data within a block or between neighbouring
  blocks, which run at about the same time, so the reuse distance is far below L2's size.
* L1 and L2: a block's re-reads of a sector hit L1 (the planner sizes blocks so that their
  input footprint fits the SM's share of L1); loads cross L2 -> SM once per (block, sector);
  stores go to L2 sector by sector as requested. L1 serves one wavefront (128-byte line) per
  SM per clock; a request takes one wavefront per distinct line it touches.
* rounds: per warp and epoch, the waits for the main input (the largest array the kernel only
  reads). From the trace: its loads are sent together and waited for together, one round per
  epoch, or ``ceil(n / LOOP_LOADS_IN_FLIGHT)`` for a site a loop runs ``n`` times. From the
  compiled code (:mod:`gpumodel.sass`, given as ``batching``): at least ``ceil(m / batch)``,
  for ``m`` the most loads (of every array) a thread of the warp made in the epoch and ``batch`` the
  kernel's compiled global loads per run (COMPILED_BATCH below). ``rounds`` sums them over warps;
  ``block_rounds`` sums, over blocks, the rounds of the block's slowest warp (a block holds its
  SM slot until its last warp ends; a warp with fewer rounds, or none, keeps nothing in flight
  for the rest of that time).

Time (:func:`launch_time`, at full size): the largest of the DRAM, L2, L1 and latency limits.
Latency, by Little's law: a resident block holds its slot for its slowest warp's rounds x a
DRAM latency, so the time is block rounds x latency / resident blocks (resident: the
occupancy's blocks on every SM, or fewer when the grid is smaller); the DRAM bandwidth this
allows is the bytes the resident blocks' warps keep in flight over the latency. Launch overhead
and the tail of the last wave are left out. Every constant is in the
block below, with its source; ``assumption`` marks a judgement, not a datasheet figure.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from . import sass

# ------------------------------------------------------------------ H100 SXM5 model constants
#: DRAM peak, bytes/s: HBM3 at 2 x 2619 MHz x 5120 bit / 8 (the planner's H100 dram_gbps;
#: NVIDIA's datasheet: 3.35 TB/s).
DRAM_PEAK = 3.352e12
#: Fraction of DRAM_PEAK a streaming kernel sustains (assumption: about what the best copy
#: kernels sustain on H100 SXM; not measured here).
DRAM_EFFICIENCY = 0.90
#: L2 -> SM bandwidth, bytes/s (assumption: the low end of published H100 microbenchmark
#: figures; not measured here).
L2_BANDWIDTH = 5.5e12
#: SMs (H100 SXM5).
SM_COUNT = 132
#: SM clock under a memory-bound load, Hz (assumption: between the 1.59 GHz base and the
#: 1.98 GHz boost).
SM_CLOCK = 1.755e9
#: L1 data wavefronts per SM per clock: L1 delivers 128 bytes (one line) per clock; that a
#: request takes one wavefront per distinct line it touches is an assumption.
L1_WAVEFRONTS_PER_CLOCK = 1
#: DRAM latency under load, s (assumption: unloaded latency is some 500 ns on recent NVIDIA
#: GPUs; queues near peak bandwidth add to it).
DRAM_LATENCY = 700e-9
#: Iterations of a run-time loop whose loads are in flight together (assumption: NVCC unrolls
#: such loops by 4; ``#pragma unroll 4`` says so).
LOOP_LOADS_IN_FLIGHT = 4
#: How the compiled code's load runs (:mod:`gpumodel.sass`: global loads started before the
#: first instruction that waits for one, per straight-line block) become rounds (assumption):
#: an epoch of ``m`` loads per thread (of every array) takes at least ``ceil(m / batch)`` rounds.
#: ``batch`` is global loads / runs over the blocks of the fewest loads that are at least
#: ``M``, the most loads a thread makes in an epoch anywhere in the trace (a full
#: window: the code that ran it straight through, e.g. a fixed-K window's unrolled taps; at
#: least, not exactly, since the trace has no record of a load predicated off, as a padding
#: tap's or that of a group's absent second output), or over the whole code when no block
#: holds ``M`` (the window's loads are spread over loop iterations or branches). Loads / runs
#: is the harmonic mean of the run lengths weighted by their loads: the waits per load, as if
#: each executed load were any of the chosen compiled ones alike; an arithmetic mean or the
#: longest run would let one long run hide many waits of one load each. Why blocks: the scan
#: is linear, so without them every code path would count once whatever its share of the work
#: (a kernel whose unrolled 18-load window sits beside 36 general-K loops of 4 would count as
#: batching about 4). What remains: several blocks of the chosen size (variants chosen at run
#: time) count alike; a window spread over loops or branches is judged by the whole code,
#: remainders and cold paths included. The runs and ``m`` count loads of every array (a
#: gradient and its window's index are two loads of one run), the trace's own rounds only the
#: main input's. Every round costs DRAM_LATENCY, even one whose loads hit L1 (a re-read of what
#: the warp just loaded).
COMPILED_BATCH = ("global loads / runs of the blocks holding a full epoch's loads, else of the "
                  "whole code")
#: Per-SM limits of sm_90 (CUDA occupancy calculator): threads, warps, blocks, 32-bit
#: registers (allocated per warp in units of 256), shared memory (1 KB reserved per block).
MAX_THREADS_PER_SM = 2048
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
REGISTERS_PER_SM = 65536
REGISTER_ALLOCATION_UNIT = 256
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024

SECTOR = 32  # bytes: the unit of L1 <-> L2 <-> DRAM transfers
LINE = 128  # bytes: an L1 cache line (4 sectors)
WARP = 32
ALIGNMENT = 256  # bytes: cudaMalloc's alignment


@dataclass
class Site:
    """One load or store instruction of a traced launch."""

    site: int
    write: bool
    array: int  # index of the array argument it touches (the first, if several)
    requests: int
    sectors: int
    ideal: int
    lanes: float  # mean active lanes per request


@dataclass
class Traffic:
    """The counts of one traced launch (see the module docstring)."""

    load_requests: int
    load_sectors: int
    load_ideal: int
    store_requests: int
    store_sectors: int
    store_ideal: int
    dram_read_sectors: list[int]  # distinct sectors read, per array argument
    dram_write_sectors: list[int]  # distinct sectors written, per array argument
    l2_read_sectors: int
    l2_write_sectors: int
    l1_wavefronts: int
    rounds: int  # summed over warps
    block_rounds: int  # summed over blocks: the rounds of each block's slowest warp
    epoch_loads: int  # the most loads (every array's) a thread made in one epoch
    batch: float | None  # the compiled loads per run the rounds used (None: trace only)
    sites: list[Site] = field(default_factory=list)

    @property
    def dram_bytes(self) -> int:
        return SECTOR * (sum(self.dram_read_sectors) + sum(self.dram_write_sectors))

    def dram_bytes_scaled(self, scales) -> float:
        """DRAM bytes with each array's sectors times its ``scales`` entry (an array that is
        larger at full size brings proportionally more distinct sectors)."""
        return SECTOR * sum(k * (r + w) for k, r, w in
                            zip(scales, self.dram_read_sectors, self.dram_write_sectors))

    @property
    def load_efficiency(self) -> float:
        """Ideal over actual sectors of the loads (1.0: fully coalesced)."""
        return self.load_ideal / self.load_sectors if self.load_sectors else 1.0

    @property
    def store_efficiency(self) -> float:
        return self.store_ideal / self.store_sectors if self.store_sectors else 1.0


def _key(*cols):
    """One int64 per row ordering the rows as the columns do (first most significant), or
    None when the columns' ranges do not fit in 63 bits together."""
    key = np.zeros(len(cols[0]), np.int64)
    width = 1
    for c in cols:
        low, high = (int(c.min()), int(c.max())) if len(c) else (0, 0)
        span = high - low + 1
        width *= span
        if width >= 2**63:
            return None
        key = key * span + (c - low)
    return key


def _ids(*cols):
    """Dense ids of the distinct rows of equal-length integer columns (first most
    significant), numbered in sorted order, and the number of distinct rows."""
    if not len(cols[0]):
        return np.zeros(0, np.int64), 0
    key = _key(*cols)
    if key is not None:
        distinct, ids = np.unique(key, return_inverse=True)
        return ids.reshape(-1), len(distinct)
    order = np.lexsort(cols[::-1])
    change = np.zeros(len(order), bool)
    change[0] = True
    for c in cols:
        s = c[order]
        change[1:] |= s[1:] != s[:-1]
    ids = np.empty(len(order), np.int64)
    ids[order] = np.cumsum(change) - 1
    return ids, int(change.sum())


def _stable_groups(*cols):
    """The stable order of the rows by the columns (first most significant), and per sorted
    row whether it starts a group of equal rows."""
    key = _key(*cols)
    order = np.argsort(key, kind="stable") if key is not None else np.lexsort(cols[::-1])
    start = np.zeros(len(order), bool)
    if len(order):
        start[0] = True
        for c in (cols if key is None else (key,)):
            s = c[order]
            start[1:] |= s[1:] != s[:-1]
    return order, start


def virtual_addresses(launch, addr):
    """(array index, address with each array placed at a 256-byte aligned base) per record."""
    lo = np.array([a.address for a in launch.arrays], np.int64)
    size = np.array([a.nbytes for a in launch.arrays], np.int64)
    order = np.argsort(lo)
    arr = order[np.searchsorted(lo[order], addr, side="right") - 1]
    if not np.all((addr >= lo[arr]) & (addr < lo[arr] + size[arr])):
        raise ValueError("a record lies outside every array of the launch")
    base = np.cumsum(np.r_[0, -(-size // ALIGNMENT) * ALIGNMENT + ALIGNMENT])[:-1] + ALIGNMENT
    return arr, base[arr] + (addr - lo[arr])


def analyze(launch, batching=None) -> Traffic:
    """The counts of ``launch`` (a :class:`gpumodel.trace.Launch`); ``batching``: the kernel's
    compiled loads (:class:`gpumodel.sass.LoadBatching`), None: the trace's rounds only (loads
    as batched as the trace allows)."""
    c = launch.columns()
    n = len(c["addr"])
    arr, vaddr = virtual_addresses(launch, c["addr"])
    write, size, block = c["write"], c["size"], c["block"]
    site_ids = np.unique(c["site"], return_inverse=True)[1].reshape(-1)
    thread = block * launch.threads_per_block + c["thread"]
    position = np.arange(n)
    # epoch: stores the thread made before this access (a thread's records are in program
    # order, which the stable sort keeps)
    order, start = _stable_groups(thread)
    w = write[order]
    before = np.cumsum(w) - w
    epoch = np.empty(n, np.int64)
    epoch[order] = before - before[np.maximum.accumulate(np.where(start, position, 0))]
    # occurrence: runs of the same site by the thread earlier in the epoch
    order, start = _stable_groups(thread, epoch, site_ids)
    occurrence = np.empty(n, np.int64)
    occurrence[order] = position - np.maximum.accumulate(np.where(start, position, 0))
    warp = c["thread"] // WARP
    req, nreq = _ids(block, warp, site_ids, epoch, occurrence)
    req_write = np.zeros(nreq, np.int64)
    req_write[req] = write
    lanes = np.bincount(req, minlength=nreq)
    # per request, in address order: distinct bytes, sectors and lines (an access may straddle
    # sectors: each of its sectors counts)
    order, new_byte = _stable_groups(req, vaddr)
    r, a, sz = req[order], vaddr[order], size[order]
    new_request = np.r_[True, r[1:] != r[:-1]] if n else np.zeros(0, bool)
    distinct_bytes = np.bincount(r[new_byte], weights=sz[new_byte], minlength=nreq)
    ideal = -(-distinct_bytes.astype(np.int64) // SECTOR)
    first, last = a // SECTOR, (a + sz - 1) // SECTOR
    sectors = _distinct_spans(r, new_request, first, last, nreq)
    lines = _distinct_spans(r, new_request, a // LINE, (a + sz - 1) // LINE, nreq)
    loads, stores = req_write == 0, req_write == 1
    # launch-wide: distinct sectors read and written, and (block, sector) pairs read
    reads = write == 0
    read_sectors, read_blocks, read_arrays = _sector_rows(vaddr[reads], size[reads],
                                                          block[reads], arr[reads])
    written_sectors, _, written_arrays = _sector_rows(vaddr[~reads], size[~reads],
                                                      block[~reads], arr[~reads])
    narrays = len(launch.arrays)
    return Traffic(
        load_requests=int(loads.sum()), load_sectors=int(sectors[loads].sum()),
        load_ideal=int(ideal[loads].sum()), store_requests=int(stores.sum()),
        store_sectors=int(sectors[stores].sum()), store_ideal=int(ideal[stores].sum()),
        dram_read_sectors=_distinct_per_array(read_sectors, read_arrays, narrays),
        dram_write_sectors=_distinct_per_array(written_sectors, written_arrays, narrays),
        l2_read_sectors=_ids(read_blocks, read_sectors)[1],
        l2_write_sectors=int(sectors[stores].sum()), l1_wavefronts=int(lines.sum()),
        **_rounds(launch, arr, write, block, c["thread"], epoch, site_ids, occurrence,
                  batching),
        sites=_sites(c["site"], req, req_write, arr, sectors, ideal, lanes))


def _distinct_spans(req, new_request, first, last, nreq):
    """Per request, distinct units touched by accesses covering units [first, last], the
    accesses sorted by request, then address."""
    # a unit is new unless an earlier access of the request reached it: compare with the
    # running maximum of `last` over the request's earlier accesses
    reached = np.where(new_request, -1, np.r_[-1, last[:-1]])
    # offset each request above every value of the ones before it
    group = np.cumsum(new_request) * (int(last.max()) + 2 if len(last) else 1)
    running = np.maximum.accumulate(reached + group) - group
    fresh = np.maximum(0, last - np.maximum(first - 1, running))
    return np.bincount(req, weights=fresh, minlength=nreq).astype(np.int64)


def _sector_rows(vaddr, size, block, arr):
    """(sector, block, array) of every sector each access touches."""
    first = vaddr // SECTOR
    span = (vaddr + size - 1) // SECTOR - first + 1
    if (span == 1).all():
        return first, block, arr
    rep = np.repeat(np.arange(len(first)), span)
    within = np.arange(len(rep)) - np.repeat(np.cumsum(span) - span, span)
    return first[rep] + within, block[rep], arr[rep]


def _distinct_per_array(sectors, arrays, narrays) -> list[int]:
    """Distinct sectors per array (sectors of different arrays never coincide)."""
    distinct = np.unique(sectors, return_index=True)[1]
    return np.bincount(arrays[distinct], minlength=narrays).tolist()


def _rounds(launch, arr, write, block, thread, epoch, site_ids, occurrence,
            batching) -> dict:
    """Waits for the main input: ``rounds``, summed over warps and epochs, per epoch the most,
    over its sites, of ceil(runs of the site / LOOP_LOADS_IN_FLIGHT), and with ``batching`` at
    least ceil(a thread's loads in the epoch / the compiled batch, COMPILED_BATCH);
    ``block_rounds``, summed over blocks, the most of any warp of the block (its warps' sums);
    ``batch``: the compiled batch used (None: none given, or no main-input load)."""
    none = {"rounds": 0, "block_rounds": 0, "epoch_loads": 0, "batch": None}
    const = [i for i, a in enumerate(launch.arrays) if a.const]
    if not const:
        return none
    main = max(const, key=lambda i: launch.arrays[i].nbytes)
    m = (arr == main) & (write == 0)
    if not m.any():
        return none
    warp = thread // WARP
    warp_epoch, n_epochs = _ids(block[m], warp[m], epoch[m])
    group, n_groups = _ids(warp_epoch, site_ids[m])
    runs = np.zeros(n_groups, np.int64)
    np.maximum.at(runs, group, occurrence[m] + 1)
    epoch_of_group = np.zeros(n_groups, np.int64)
    epoch_of_group[group] = warp_epoch
    waits = np.zeros(n_epochs, np.int64)
    np.maximum.at(waits, epoch_of_group, -(-runs // LOOP_LOADS_IN_FLIGHT))
    # a thread's loads of the epoch, of every array (the compiled runs hold them all): the
    # compiled code sends them batch at a time
    read = write == 0
    thread_epoch, n_thread_epochs = _ids(block[read], thread[read], epoch[read])
    loads = np.bincount(thread_epoch, minlength=n_thread_epochs)[thread_epoch[m[read]]]
    most = np.zeros(n_epochs, np.int64)
    np.maximum.at(most, warp_epoch, loads)
    batch = None
    if batching is not None:
        batch = batching.batch_for(int(most.max()))
        if math.isfinite(batch):
            waits = np.maximum(waits, np.ceil(most / batch - 1e-9).astype(np.int64))
    # per warp, then per block its slowest warp
    warp_id, n_warps = _ids(block[m], warp[m])
    warp_of_epoch = np.zeros(n_epochs, np.int64)
    warp_of_epoch[warp_epoch] = warp_id
    per_warp = np.bincount(warp_of_epoch, weights=waits, minlength=n_warps).astype(np.int64)
    block_of_warp = np.zeros(n_warps, np.int64)
    block_of_warp[warp_id] = block[m]
    block_id, n_blocks = _ids(block_of_warp)
    slowest = np.zeros(n_blocks, np.int64)
    np.maximum.at(slowest, block_id, per_warp)
    return {"rounds": int(waits.sum()), "block_rounds": int(slowest.sum()),
            "epoch_loads": int(most.max()), "batch": batch}


def _sites(site, req, req_write, arr, sectors, ideal, lanes) -> list[Site]:
    req_site = np.zeros(len(req_write), np.int64)
    req_site[req] = site
    req_arr = np.zeros(len(req_write), np.int64)
    req_arr[req] = arr
    out = []
    for s in np.unique(req_site):
        m = req_site == s
        out.append(Site(int(s), bool(req_write[m][0]), int(req_arr[m][0]), int(m.sum()),
                        int(sectors[m].sum()), int(ideal[m].sum()), float(lanes[m].mean())))
    return out


# ------------------------------------------------------------------ occupancy and time
@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    limiter: str  # what stops one more block: blocks, threads, registers or shared memory

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / MAX_WARPS_PER_SM


def occupancy(threads_per_block: int, registers: int | None = None,
              shared: int = 0) -> Occupancy:
    """Resident blocks and warps per SM on sm_90; registers None: not limiting (unknown)."""
    warps = -(-threads_per_block // WARP)
    limits = {"blocks": MAX_BLOCKS_PER_SM, "threads": MAX_THREADS_PER_SM // (warps * WARP)}
    if registers:
        per_warp = -(-registers * WARP // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
        limits["registers"] = REGISTERS_PER_SM // per_warp // warps
    if shared:
        limits["shared memory"] = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK)
    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps, limiter)


@dataclass(frozen=True)
class LaunchTime:
    """Modeled time of one launch at full size, by limit (seconds), the largest, and the DRAM
    bytes the resident blocks keep in flight on average (latency x DRAM bandwidth needs about
    DRAM_LATENCY x DRAM_PEAK x DRAM_EFFICIENCY = 2.1 MB)."""

    dram: float
    l2: float
    l1: float
    latency: float
    bytes_in_flight: float

    @property
    def seconds(self) -> float:
        return max(self.dram, self.l2, self.l1, self.latency)

    @property
    def bound(self) -> str:
        limits = {"dram": self.dram, "l2": self.l2, "l1": self.l1, "latency": self.latency}
        return max(limits, key=limits.get)


def launch_time(traffic: Traffic, work: float, dram_bytes: float, blocks: int,
                threads_per_block: int, occ: Occupancy) -> LaunchTime:
    """Time of a launch of ``blocks`` blocks that moves ``dram_bytes`` and whose other counts
    are ``traffic``'s times ``work`` (the traced launch did the same per-block work on fewer
    blocks)."""
    resident = min(blocks, SM_COUNT * occ.blocks_per_sm)
    block_rounds = work * traffic.block_rounds
    # Little's law: a resident block holds its slot for its slowest warp's rounds, each a
    # DRAM_LATENCY; what its warps keep in flight meanwhile is dram_bytes / block_rounds per
    # block on average
    return LaunchTime(
        dram=dram_bytes / (DRAM_PEAK * DRAM_EFFICIENCY),
        l2=work * SECTOR * (traffic.l2_read_sectors + traffic.l2_write_sectors) / L2_BANDWIDTH,
        l1=work * traffic.l1_wavefronts / (SM_COUNT * SM_CLOCK * L1_WAVEFRONTS_PER_CLOCK),
        latency=block_rounds * DRAM_LATENCY / resident,
        bytes_in_flight=resident * dram_bytes / block_rounds if block_rounds else 0.0)


def percent_of_peak(ideal_bytes: float, seconds: float) -> float:
    """The bandwidth the op shows (its ideal bytes over its time) as a percentage of
    DRAM_PEAK."""
    return 100.0 * ideal_bytes / (seconds * DRAM_PEAK)


# ------------------------------------------------------------------ registers (ptxas)
def registers(nvrtc, source: str, names, arch: str = sass.ARCH) -> dict[str, tuple[int, int]]:
    """Name expression -> (registers per thread, static shared bytes) from ptxas
    (``-Xptxas=-v``) through CuPy's NVRTC with the backend's options; no GPU needed.
    ``nvrtc``: :func:`cudacpu.real_nvrtc`'s namespace, used inside
    :func:`cudacpu.installed_cupy`."""
    return register_usage(sass.compile_kernels(nvrtc, source, names, arch))


def register_usage(compiled: sass.Compiled) -> dict[str, tuple[int, int]]:
    """Name expression -> (registers per thread, static shared bytes) from the ptxas report
    of a :func:`gpumodel.sass.compile_kernels` compile."""
    used, current = {}, None
    for line in compiled.log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            shared = re.search(r"(\d+) bytes smem", line)
            used[current] = (int(m.group(1)), int(shared.group(1)) if shared else 0)
    return {n: used[mangled] for n, mangled in compiled.mangled.items()}
