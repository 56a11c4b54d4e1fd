"""How a user's type checker sees the public API (checked by mypy in tests/test_typing.py,
not run): each op keeps its own signature through the dispatch decorator, and a max pool's
result type follows ``return_indices``."""
from __future__ import annotations

from typing import assert_type

import numpy as np

import gpupool as gp
from gpupool import quantized as q
from gpupool.arrays import Array

x = np.zeros((1, 1, 4, 4), np.float32)

assert_type(gp.max_pool(x, 2), Array)
assert_type(gp.max_pool(x, 2, return_indices=False), Array)
assert_type(gp.max_pool(x, 2, return_indices=True), tuple[Array, Array])
flag: bool = bool(np.random.rand() > 0.5)
assert_type(gp.max_pool(x, 2, return_indices=flag), Array | tuple[Array, Array])
assert_type(gp.adaptive_max_pool(x, 2, return_indices=True), tuple[Array, Array])
assert_type(gp.adaptive_max_pool(x, (2, 2)), Array)
assert_type(gp.avg_pool(x, 2, count_include_pad=True), Array)
assert_type(gp.lp_pool(x, 2.0, 2), Array)
assert_type(gp.global_avg_pool(x), Array)
assert_type(gp.max_pool_backward(x, x, (1, 1, 4, 4), 2), Array)
assert_type(q.max_pool(q.quantize(x, 0.1, 0, "int8"), 2), q.QArray)

y, idx = gp.max_pool(x, 2, return_indices=True)
assert_type(gp.max_unpool(y, idx, 2), Array)

gp.max_pool(x, 2, bogus=1)  # type: ignore[call-overload]
gp.avg_pool(x, 2, count_include_pads=True)  # type: ignore[call-arg]
gp.global_max_pool(x, spatial_dims="2")  # type: ignore[arg-type]
