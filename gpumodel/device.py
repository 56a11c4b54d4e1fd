"""Device profiles of the time model: H100 SXM and H200, the SM clock a parameter. Every
constant is named once here with its source: a datasheet, a published measurement, or fitted
on the published H200 measurements in ``../shared/calibration`` (:mod:`gpumodel.calibration`
fits them; the values here are its fit); "assumption" marks a judgement.

A launch's time (:func:`launch_time`) is the largest of its limits, plus a fixed cost:

* dram: its DRAM bytes at the STREAM-triad bandwidth;
* l2, l1: bytes between L2 and the SMs, L1 wavefronts (see :mod:`gpumodel.traffic`);
* latency: the waits of each resident block's slowest warp (Little's law; a round of loads
  waits DRAM_LATENCY when one misses L1, L1_LATENCY when all hit, see
  :mod:`gpumodel.traffic`), over the resident blocks;
* issue: its executed warp instructions (:mod:`gpumodel.instructions`) at one per scheduler per
  clock, or those of one pipe at that pipe's rate where that takes longer (an integer- and
  compare-heavy kernel waits on its half-rate ALU, :mod:`gpumodel.pipes`), over
  ISSUE_EFFICIENCY (a pipe's over PIPE_EFFICIENCY), and over the share of ISSUE_WARPS its
  resident warps give each scheduler where they are fewer (too few warps cannot hide each
  other's dependent latencies);

and LAUNCH_SECONDS, the part of a kernel's device time no limit sees: launch, the last
wave's tail, the first touches of a cold L2 (the measurements flush L2 before each run).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import pipes

#: SMs of H100 SXM5 and of H200 (NVIDIA H100 Tensor Core GPU Architecture whitepaper; H200
#: datasheet: the same GH100 die).
SM_COUNT = 132
#: Warp schedulers per SM, each issuing one warp instruction per clock (Hopper whitepaper:
#: four SM sub-partitions, one warp scheduler and dispatch unit of 32 threads/clock each).
SCHEDULERS_PER_SM = 4
#: DRAM peaks, bytes/s: H100 SXM HBM3 at 2 x 2619 MHz x 5120 bit / 8 (the planner's H100
#: dram_gbps; datasheet: 3.35 TB/s), H200 HBM3e 4.8 TB/s (datasheet).
H100_DRAM_PEAK = 3.352e12
H200_DRAM_PEAK = 4.8e12
#: Sustained fraction of the DRAM peak: the H200 STREAM triad, 4.07044 TB/s = 0.848 of
#: 4.8 TB/s (published measurement: TileOPs' h200 profile, measured.json
#: ``bandwidth_ceiling``); taken for H100 too (assumption: the same HBM controller).
DRAM_TRIAD_FRACTION = 4.07044e12 / 4.8e12
#: L2 -> SM bytes per SM clock (assumption, as the memory-traffic model had it: 5.5 TB/s at
#: 1.755 GHz, the low end of published H100 microbenchmarks; scales with the clock).
L2_BYTES_PER_CLOCK = 5.5e12 / 1.755e9
#: L1 wavefronts (128-byte lines) per SM per clock (assumption).
L1_WAVEFRONTS_PER_CLOCK = 1
#: Latency of a round of loads one of which misses L1, s (assumption: some 500 ns unloaded
#: on recent NVIDIA GPUs, queues near peak bandwidth add to it).
DRAM_LATENCY = 700e-9
#: Latency of a round of loads that all hit L1, s (assumption: tens of SM clocks; 40 clocks
#: at 1.755 GHz).
L1_LATENCY = 40 / 1.755e9
#: Fraction of the schedulers' issue slots a kernel bound by instruction issue fills (fitted:
#: least squares of the relative errors over the FIT_ROWS of gpumodel.calibration, the
#: pinned-clock H200 float16 rows of ../shared/calibration/measured.json; bench/calibrate.py
#: refits and reports it).
ISSUE_EFFICIENCY = 0.762
#: Fraction of a pipe's issue slots a kernel bound by that pipe fills (fitted: the median, over
#: the launches of gpupool's kernels whose ALU Nsight Compute found over 80 % busy, of their
#: ALU warp instructions at half a warp instruction per clock over their time less
#: LAUNCH_SECONDS, in bench/results/issued-h200-2026-11-27.json, H200 at 1500 MHz;
#: gpumodel.calibration.pipe_efficiency computes it: 7 launches, 0.848 to 0.875).
#: Higher than ISSUE_EFFICIENCY: the scheduler issues other pipes' instructions in between.
#: Taken for the other pipes too (assumption: no kernel measured is bound by one of them).
PIPE_EFFICIENCY = 0.865
#: Resident warps per scheduler below which issue slows in proportion (fitted: gpupool's own
#: H200 measurement at 1500 MHz, bench/results/issued-h200-2026-11-27.json, of
#: max_window_backward<float, int, true, 3>, 96 registers, 4 warps per scheduler, the one
#: launch measured with fewer than 6: Nsight Compute's count of its warp instructions at
#: ISSUE_EFFICIENCY fills 0.857 of its time less LAUNCH_SECONDS; the launches measured at 6
#: and 7 warps per scheduler fill 0.89 to 1.00 by their counts, scheduler's or ALU's.
#: PyTorch's kernels of the published rows hold 16, so the calibration does not see it).
ISSUE_WARPS = 4.67
#: Device time of a launch that no limit covers, s (fitted with ISSUE_EFFICIENCY).
LAUNCH_SECONDS = 3.56e-6
#: The SM clock of the published H200 measurements (SM 1500 MHz pinned), Hz.
CALIBRATION_CLOCK = 1.5e9


@dataclass(frozen=True)
class Device:
    """A GPU as the model sees it."""

    name: str
    sm_clock: float  # Hz
    dram_peak: float  # bytes/s
    sm_count: int = SM_COUNT
    schedulers_per_sm: int = SCHEDULERS_PER_SM
    issue_efficiency: float = ISSUE_EFFICIENCY
    pipe_efficiency: float = PIPE_EFFICIENCY
    launch_seconds: float = LAUNCH_SECONDS

    @property
    def dram_bandwidth(self) -> float:
        """Sustained DRAM bandwidth (the triad), bytes/s."""
        return self.dram_peak * DRAM_TRIAD_FRACTION

    @property
    def issue_rate(self) -> float:
        """Warp instructions the whole GPU issues per second at full efficiency."""
        return self.sm_count * self.schedulers_per_sm * self.sm_clock

    def at_clock(self, hz: float) -> "Device":
        return replace(self, sm_clock=hz)

    def label(self) -> str:
        return f"{self.name} at {self.sm_clock / 1e6:.0f} MHz"


def h200(clock: float = CALIBRATION_CLOCK) -> Device:
    return Device("H200", clock, H200_DRAM_PEAK)


def h100(clock: float = CALIBRATION_CLOCK) -> Device:
    return Device("H100 SXM", clock, H100_DRAM_PEAK)


@dataclass(frozen=True)
class LaunchTime:
    """Modeled time of one launch by limit (seconds), the largest, and the fixed cost."""

    dram: float
    l2: float
    l1: float
    latency: float
    issue: float
    fixed: float
    issue_part: str = "scheduler"  # what sets the issue limit: the scheduler or a pipe

    @property
    def limits(self) -> dict[str, float]:
        return {"dram": self.dram, "l2": self.l2, "l1": self.l1, "latency": self.latency,
                "issue": self.issue}

    @property
    def seconds(self) -> float:
        return max(self.limits.values()) + self.fixed

    @property
    def bound(self) -> str:
        limits = self.limits
        return max(limits, key=limits.get)


def launch_time(device: Device, *, dram_bytes: float, l2_bytes: float, l1_wavefronts: float,
                block_rounds: float, resident_blocks: int, warp_instructions: float,
                warps_per_scheduler: float = ISSUE_WARPS,
                pipe_instructions: dict | None = None) -> LaunchTime:
    """The time of a launch on ``device`` from its full-size counts: DRAM and L2 bytes, L1
    wavefronts, rounds of its blocks' slowest warps, blocks resident at once, warp
    instructions (and per pipe, :func:`gpumodel.pipes.by_pipe`; None: the scheduler's rate
    only), and the warps an SM's occupancy gives each of its schedulers."""
    issue_share = min(1.0, warps_per_scheduler / ISSUE_WARPS)
    issue = {part: clocks / (device.issue_rate * issue_share * (
        device.issue_efficiency if part == "scheduler" else device.pipe_efficiency))
        for part, clocks in pipes.issue_clocks(warp_instructions, pipe_instructions).items()}
    part = max(issue, key=issue.get)
    return LaunchTime(
        dram=dram_bytes / device.dram_bandwidth,
        l2=l2_bytes / (L2_BYTES_PER_CLOCK * device.sm_clock),
        l1=l1_wavefronts / (device.sm_count * device.sm_clock * L1_WAVEFRONTS_PER_CLOCK),
        latency=block_rounds * DRAM_LATENCY / resident_blocks if resident_blocks else 0.0,
        issue=issue[part], fixed=device.launch_seconds, issue_part=part)
