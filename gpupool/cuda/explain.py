"""How the CUDA backend would run an op, in words (:func:`explain`): the planner's plan for
the op's spec. Pure Python, so it works on a machine without a GPU."""
from __future__ import annotations

from typing import Sequence

from .. import spec as S
from ..op_table import OPS
from ..ops import Padding, Size
from .planner import DeviceInfo, plan

#: the ops explain accounts for: the forward ops (the backward ops' launches are not planned
#: by name)
_EXPLAINED = {op.name: op for op in OPS if not op.is_backward}


def explain(op: str, shape: Sequence[int], kernel_size: Size | None = None,
            stride: Size | None = None, padding: Padding = 0, dilation: Size = 1,
            ceil_mode: bool = False, *, output_size: Size | None = None, p: float | None = None,
            count_include_pad: bool = False, divisor_override: int | None = None,
            return_indices: bool = False, spatial_dims: int = 2, dtype: str = "float32",
            layout: str = "NCHW", device: DeviceInfo | None = None) -> str:
    """How the CUDA backend would run ``op`` on an input of ``shape``, in words: the split,
    then per launch its grid and block, threads, outputs per thread, the bytes it must read
    and write, and their time at the device's DRAM bandwidth (the roofline floor a measured
    time compares with).

    Arguments mirror the public op of the same name (``op`` is its name, e.g. ``"max_pool"``);
    ``device`` defaults to an H100's properties, so this works without a GPU. Raises what the
    op would raise for invalid arguments.

    >>> print(explain("max_pool", (64, 64, 112, 112), 3, 2, 1))  # doctest: +ELLIPSIS
    max_pool: output (64, 64, 56, 56)
    device: NVIDIA H100 (assumed: no GPU queried) (132 SMs)
    ...
    """
    if op not in _EXPLAINED:
        raise ValueError(f"gpupool.explain: unknown op {op!r} (one of {sorted(_EXPLAINED)})")
    family, kind = _EXPLAINED[op].family, _EXPLAINED[op].reduction
    if family == "window":
        sp = S.window_spec(op, kind, tuple(shape), dtype, kernel_size, stride, padding,
                           dilation, ceil_mode, layout, return_indices=return_indices,
                           count_include_pad=count_include_pad,
                           divisor_override=divisor_override, p=p if kind == "lp" else None)
        if kind == "lp" and p is None:
            raise ValueError("gpupool.explain: lp_pool needs p")
    elif family == "adaptive":
        sp = S.adaptive_spec(op, kind, tuple(shape), dtype, output_size, layout,
                             return_indices=return_indices)
    elif family == "global":
        sp = S.global_spec(op, kind, tuple(shape), dtype, spatial_dims, layout)
    else:
        sp = S.unpool_spec(op, tuple(shape), dtype, tuple(shape), "int64", kernel_size, stride,
                           padding, output_size, layout)
    return f"{op}: output {sp.out_shape}\n" + str(plan(sp, device))
