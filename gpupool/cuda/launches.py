"""What a launch plan is made of: the device's properties the planner reads, one kernel
launch, and the plan of launches for one spec (:mod:`gpupool.cuda.planner` makes them); the
bytes each launch must move."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .. import spec as S
from ..grad_spec import GradSpec


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


def with_traffic(spec, launches: tuple[Launch, ...]) -> tuple[Launch, ...]:
    """The launches with the bytes each must move: its input once, its output once (with
    int64 indices; unpool reads its indices, and its scatter zero-fills the output first)."""
    g = spec.geom
    item = S.ITEMSIZE[g.dtype]
    x_bytes = math.prod(g.shape) * item
    out_elems = math.prod(spec.out_shape)
    if isinstance(spec, S.UnpoolSpec):  # the scatter also zero-fills, the gather does not
        (la,) = launches
        n = math.prod(g.shape)
        fills = la.kernel == "max_unpool"
        return (dataclasses.replace(
            la, outputs=n if fills else out_elems, bytes_written=(1 + fills) * out_elems * item,
            bytes_read=x_bytes + S.ITEMSIZE[spec.index_dtype] * n),)
    indices = 8 * out_elems if getattr(spec, "return_indices", False) else 0
    if len(launches) == 1:
        return (dataclasses.replace(launches[0], outputs=out_elems, bytes_read=x_bytes,
                                    bytes_written=out_elems * item + indices),)
    first, second = launches
    part = 4 if (spec.op == "avg" and S.ACC_DTYPES.get(g.dtype) == "float32") else item
    partials = out_elems * first.get("nchunks")
    return (dataclasses.replace(first, outputs=partials, bytes_read=x_bytes,
                                bytes_written=partials * part),
            dataclasses.replace(second, outputs=out_elems, bytes_read=partials * part,
                                bytes_written=out_elems * item))


def gather_traffic(spec: GradSpec, launches: tuple[Launch, ...]) -> tuple[Launch, ...]:
    """The gather with the bytes it must move: the output gradient (and a max's int64
    indices; Lp's input and forward output) read once, the input gradient written once."""
    fwd = spec.forward
    item = S.ITEMSIZE[fwd.geom.dtype]
    x_elems = math.prod(fwd.geom.shape)
    out_elems = math.prod(fwd.out_shape)
    read = out_elems * item + {"max": 8 * out_elems, "lp": (x_elems + out_elems) * item}.get(
        spec.op, 0)
    (la,) = launches
    return (dataclasses.replace(la, outputs=x_elems, bytes_read=read,
                                bytes_written=x_elems * item),)
