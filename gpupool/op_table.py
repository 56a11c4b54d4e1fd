"""The op table: one row per public op (the float ops, ``max_unpool`` and the backward ops),
with what the adapters need to know of it. Explain, the Dask adapters, the framework adapters
(autograd, DLPack, PyTorch's eager path) read it instead of keeping lists of their own, so an
op is added here once (and as its function in :mod:`gpupool.ops` or :mod:`gpupool.gradients`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """A public op.

    ``family``: how its windows are made, ``"window"`` (sliding), ``"adaptive"``, ``"global"``
    or ``"unpool"``; a backward op has its forward op's. ``reduction``: ``"max"``, ``"avg"`` or
    ``"lp"`` (None for unpool). ``options``: the forward op's own options beyond its geometry.
    ``operand``: the array parameter after the first (``"indices"`` or ``"x"``), if any.
    ``saved``: what its autograd keeps from the forward for the backward, ``"indices"``,
    ``"x"`` or ``"shape"``; ``gradient``: the backward op autograd then runs (a global max's
    is the adaptive max's, from its indices); both None where the op has no gradient.
    ``gradient_of``: for a backward op, its forward op.
    """
    name: str
    family: str
    reduction: str | None
    options: tuple[str, ...] = ()
    operand: str | None = None
    saved: str | None = None
    gradient: str | None = None
    gradient_of: str | None = None

    @property
    def is_backward(self) -> bool:
        return self.gradient_of is not None


OPS = (
    Op("max_pool", "window", "max", ("return_indices",), saved="indices",
       gradient="max_pool_backward"),
    Op("avg_pool", "window", "avg", ("count_include_pad", "divisor_override"), saved="shape",
       gradient="avg_pool_backward"),
    Op("lp_pool", "window", "lp", ("p",), saved="x", gradient="lp_pool_backward"),
    Op("global_avg_pool", "global", "avg", saved="shape", gradient="global_avg_pool_backward"),
    Op("global_max_pool", "global", "max", saved="indices",
       gradient="adaptive_max_pool_backward"),
    Op("adaptive_avg_pool", "adaptive", "avg", saved="shape",
       gradient="adaptive_avg_pool_backward"),
    Op("adaptive_max_pool", "adaptive", "max", ("return_indices",), saved="indices",
       gradient="adaptive_max_pool_backward"),
    Op("max_unpool", "unpool", None, operand="indices"),
    Op("max_pool_backward", "window", "max", operand="indices", gradient_of="max_pool"),
    Op("avg_pool_backward", "window", "avg", gradient_of="avg_pool"),
    Op("lp_pool_backward", "window", "lp", operand="x", gradient_of="lp_pool"),
    Op("global_avg_pool_backward", "global", "avg", gradient_of="global_avg_pool"),
    Op("global_max_pool_backward", "global", "max", operand="x", gradient_of="global_max_pool"),
    Op("adaptive_avg_pool_backward", "adaptive", "avg", gradient_of="adaptive_avg_pool"),
    Op("adaptive_max_pool_backward", "adaptive", "max", operand="indices",
       gradient_of="adaptive_max_pool"),
)

#: the rows by op name
BY_NAME = {op.name: op for op in OPS}
#: the ops with a gradient (the differentiable float ops), in table order
DIFFERENTIABLE = tuple(op.name for op in OPS if op.gradient is not None)
