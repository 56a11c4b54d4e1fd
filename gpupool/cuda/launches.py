"""What a launch plan is made of: the device's properties the planner reads, one kernel
launch, and the plan of launches for one spec (:mod:`gpupool.cuda.planner` makes them)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceInfo:
    """What the planner needs to know about a GPU."""

    name: str = "NVIDIA H100 (assumed: no GPU queried)"
    sm_count: int = 132
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    smem_per_block: int = 227 * 1024
    smem_per_sm: int = 228 * 1024
    l2_bytes: int = 50 * 2**20
    #: DRAM bandwidth, GB/s: the peak from the memory clock and bus width (H100 SXM: 3352);
    #: 0 when unknown. Sets the roofline floor that explain() reports.
    dram_gbps: float = 3352.0


H100 = DeviceInfo()


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel template's base name, grid and block, outputs per thread
    along rows (``rows``), kernel-specific integers (``extra``, as sorted (name, value)
    pairs), and the outputs it writes and bytes it moves (set by :func:`plan`)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    rows: int = 1
    extra: tuple[tuple[str, int], ...] = ()
    outputs: int = 0
    bytes_read: int = 0  # the least DRAM traffic the launch needs: each input byte once
    bytes_written: int = 0

    def get(self, name: str) -> int:
        return dict(self.extra)[name]

    @property
    def threads(self) -> int:
        return math.prod(self.grid) * math.prod(self.block)

    def floor_seconds(self, device: "DeviceInfo") -> float:
        """The roofline floor: the launch's bytes at the device's DRAM bandwidth."""
        if not device.dram_gbps:
            return 0.0
        return (self.bytes_read + self.bytes_written) / (device.dram_gbps * 1e9)


@dataclass(frozen=True)
class Plan:
    """The chosen launches for one spec on one device, with the reasons in words."""

    family: str  # "window" | "adaptive" | "global" | "unpool"
    index_type: str  # "int" | "long long"
    launches: tuple[Launch, ...]
    words: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return "\n".join(self.words)
