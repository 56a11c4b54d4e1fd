"""Memory traffic of a traced launch (:class:`gpumodel.trace.Launch`): the counts the time
model (:mod:`gpumodel.device`) turns into limits.

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
  stores go to L2 sector by sector as requested. A request takes one L1 wavefront per
  distinct 128-byte line it touches.
* rounds: per warp and epoch, the waits for the main input (the largest array the kernel only
  reads). From the trace: its loads are sent together and waited for together, one round per
  epoch, or ``ceil(n / LOOP_LOADS_IN_FLIGHT)`` for a site a loop runs ``n`` times. From the
  compiled code (:mod:`gpumodel.sass`, given as ``batching``): at least ``ceil(m / batch)``,
  for ``m`` the most loads (of every array) a thread of the warp made in the epoch and ``batch`` the
  kernel's compiled global loads per run (COMPILED_BATCH below). ``rounds`` sums them over warps.
  A round waits a DRAM latency when one of its loads misses L1, an L1 latency when all hit:
  a main-input request misses when it touches a sector the warp did not touch before in the
  epoch, and the epoch's misses are spread over its rounds, one per round (so an epoch of
  ``w`` rounds and ``k`` missing requests waits ``min(w, k)`` DRAM latencies and the rest L1
  latencies). ``block_rounds`` sums, over blocks, the waits of the block's slowest warp in
  DRAM latencies (a block holds its SM slot until its last warp ends; a warp with fewer
  rounds, or none, keeps nothing in flight for the rest of that time).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from . import sass

from .device import DRAM_LATENCY, L1_LATENCY

# ------------------------------------------------------------------ counting rules
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
#: main input's.
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
    block_rounds: float  # summed over blocks: each block's slowest warp's waits, in DRAM latencies
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
    site_ids, epoch, occurrence, req, nreq = _requests(launch, c)
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
                  batching, req, vaddr),
        sites=_sites(c["site"], req, req_write, arr, sectors, ideal, lanes))


def _requests(launch, c):
    """Per record of ``c`` (:meth:`~gpumodel.trace.Launch.columns`): its site id, epoch and
    occurrence (see the module docstring), its warp request's id, and the number of
    requests."""
    n = len(c["addr"])
    write, block = c["write"], c["block"]
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
    req, nreq = _ids(block, c["thread"] // WARP, site_ids, epoch, occurrence)
    return site_ids, epoch, occurrence, req, nreq


def warp_requests(launch) -> dict[str, np.ndarray]:
    """The warp requests of ``launch`` (a warp's global loads or stores at one site, epoch
    and occurrence: one executed memory instruction of the warp), as columns: block, warp,
    write (0/1) and size (bytes per lane)."""
    c = launch.columns()
    _, _, _, req, nreq = _requests(launch, c)
    first = np.zeros(nreq, np.int64)
    first[req[::-1]] = np.arange(len(req))[::-1]  # a record of each request
    return {"block": c["block"][first], "warp": c["thread"][first] // WARP,
            "write": c["write"][first], "size": c["size"][first]}


def main_input(launch) -> int | None:
    """Index of the main input: the largest array argument the kernel only reads."""
    const = [i for i, a in enumerate(launch.arrays) if a.const]
    return max(const, key=lambda i: launch.arrays[i].nbytes) if const else None


def line_counts(launch, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(warp ids, block x warps per block + warp; per warp and level 1..``levels``, its
    epochs' most *lines* of any lane summed): the lines a thread's main-input loads walk in
    an epoch. A line (level 1) is a run of loads at a constant address step (a window's row);
    a line of level k + 1 a run of level-k lines whose starts keep a constant step (a
    window's plane). A step that changes starts a run, unless the load before started
    one."""
    main = main_input(launch)
    warps_per_block = -(-launch.threads_per_block // WARP)
    if main is None or not levels:
        return np.zeros(0, np.int64), np.zeros((0, levels), np.int64)
    c = launch.columns()
    arr, vaddr = virtual_addresses(launch, c["addr"])
    _, epoch, _, _, _ = _requests(launch, c)
    m = (arr == main) & (c["write"] == 0)
    thread = (c["block"] * launch.threads_per_block + c["thread"])[m]
    order, _ = _stable_groups(thread, epoch[m])
    te, n_te = _ids(thread[order], epoch[m][order])
    addr = vaddr[m][order]
    counts = np.zeros((n_te, levels), np.int64)
    for level in range(levels):
        step = np.r_[0, np.diff(addr)]
        first = np.r_[True, te[1:] != te[:-1]] if len(te) else np.zeros(0, bool)
        second = np.r_[False, first[:-1]] & ~first
        change = ~first & ~second & np.r_[False, step[1:] != step[:-1]]
        start = first | (change & ~np.r_[False, change[:-1]])
        counts[:, level] = np.bincount(te[start], minlength=n_te)
        te, addr = te[start], addr[start]
    thread_of = np.zeros(n_te, np.int64)
    ids, _ = _ids(thread[order], epoch[m][order])
    thread_of[ids] = thread[order]
    epoch_of = np.zeros(n_te, np.int64)
    epoch_of[ids] = epoch[m][order]
    block = thread_of // launch.threads_per_block
    warp_global = block * warps_per_block + (thread_of % launch.threads_per_block) // WARP
    we, n_we = _ids(warp_global, epoch_of)
    most = np.zeros((n_we, levels), np.int64)
    for level in range(levels):
        np.maximum.at(most[:, level], we, counts[:, level])
    warp_of = np.zeros(n_we, np.int64)
    warp_of[we] = warp_global
    ids, inverse = np.unique(warp_of, return_inverse=True)
    total = np.zeros((len(ids), levels), np.int64)
    for level in range(levels):
        np.add.at(total[:, level], inverse.reshape(-1), most[:, level])
    return ids, total


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
            batching, req, vaddr) -> dict:
    """Waits for the main input: ``rounds``, summed over warps and epochs, per epoch the most,
    over its sites, of ceil(runs of the site / LOOP_LOADS_IN_FLIGHT), and with ``batching`` at
    least ceil(a thread's loads in the epoch / the compiled batch, COMPILED_BATCH);
    ``block_rounds``, summed over blocks, the most of any warp of the block (its warps' sums,
    in DRAM latencies: a round whose loads all hit L1 counts L1_LATENCY / DRAM_LATENCY);
    ``batch``: the compiled batch used (None: none given, or no main-input load)."""
    none = {"rounds": 0, "block_rounds": 0, "epoch_loads": 0, "batch": None}
    main = main_input(launch)
    if main is None:
        return none
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
    # misses: the requests that touch a sector first in their warp's epoch
    order, first = _stable_groups(warp_epoch, vaddr[m] // SECTOR)
    firsts = np.unique(np.stack([warp_epoch[order][first], req[m][order][first]]), axis=1)
    misses = np.bincount(firsts[0], minlength=n_epochs)
    slow = np.minimum(waits, misses)
    cost = slow + (waits - slow) * (L1_LATENCY / DRAM_LATENCY)
    # per warp, then per block its slowest warp
    warp_id, n_warps = _ids(block[m], warp[m])
    warp_of_epoch = np.zeros(n_epochs, np.int64)
    warp_of_epoch[warp_epoch] = warp_id
    per_warp = np.bincount(warp_of_epoch, weights=cost, minlength=n_warps)
    block_of_warp = np.zeros(n_warps, np.int64)
    block_of_warp[warp_id] = block[m]
    block_id, n_blocks = _ids(block_of_warp)
    slowest = np.zeros(n_blocks)
    np.maximum.at(slowest, block_id, per_warp)
    return {"rounds": int(waits.sum()), "block_rounds": float(slowest.sum()),
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


# ------------------------------------------------------------------ occupancy
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
