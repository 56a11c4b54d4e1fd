"""One launch's counts at full size, from its trace at a smaller size and its machine code,
and its time on a device profile (:mod:`gpumodel.device`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import device as devices
from . import instructions, pipes, traffic


@dataclass
class Counts:
    """Full-size counts of one launch (device-independent) and the traced analyses behind
    them."""

    kernel: str
    warp_instructions: float
    opcodes: dict  # warp instructions per opcode (with its suffixes)
    unmatched: float  # trace accesses no path of the machine code makes (instructions.IssueCount)
    dram_bytes: float
    l2_bytes: float
    l1_wavefronts: float
    block_rounds: float  # in DRAM latencies (traffic.Traffic.block_rounds)
    blocks: int
    traffic: traffic.Traffic  # traced size
    issue: instructions.IssueCount  # traced size
    occupancy: traffic.Occupancy
    registers: int | None
    shared: int

    @functools.cached_property
    def pipe_instructions(self) -> dict[str, float]:
        """Warp instructions per pipe (:func:`gpumodel.pipes.by_pipe`)."""
        return pipes.by_pipe(self.opcodes)

    def time(self, device: devices.Device) -> devices.LaunchTime:
        return devices.launch_time(
            device, dram_bytes=self.dram_bytes, l2_bytes=self.l2_bytes,
            l1_wavefronts=self.l1_wavefronts, block_rounds=self.block_rounds,
            resident_blocks=min(self.blocks, device.sm_count * self.occupancy.blocks_per_sm),
            warp_instructions=self.warp_instructions,
            pipe_instructions=self.pipe_instructions,
            warps_per_scheduler=self.occupancy.warps_per_sm / device.schedulers_per_sm)


def launch_counts(launch, flow: instructions.ControlFlow, batching, usage, work: float,
                  dram_scales, full_blocks: int) -> Counts:
    """The full-size counts of a traced ``launch`` whose blocks each do the work they do at
    full size: ``work``, full over traced amount of it; ``dram_scales``, per array argument,
    full over traced size; ``flow``, ``batching``, ``usage``: the kernel's control flow, load
    batching and (registers, shared bytes) from its machine code."""
    t = traffic.analyze(launch, batching)
    count = instructions.count(launch, flow)
    registers, shared = usage if usage else (None, 0)
    occ = traffic.occupancy(launch.threads_per_block, registers, shared)
    return Counts(launch.name, work * count.warp_instructions,
                  {op: work * n for op, n in count.opcodes.items()}, work * count.unmatched,
                  t.dram_bytes_scaled(dram_scales),
                  work * traffic.SECTOR * (t.l2_read_sectors + t.l2_write_sectors),
                  work * t.l1_wavefronts, work * t.block_rounds, full_blocks, t, count, occ,
                  registers, shared)
