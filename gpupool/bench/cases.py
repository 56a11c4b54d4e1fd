"""The suite's cases: real layer shapes, the backward rows and the overhead section's tiny
inputs, each case's batch size and input, and the gpupool call it times (on a PyTorch tensor
too, for the overhead section)."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import numpy as np

import gpupool
from gpupool.arrays import is_cupy_array

#: the least input size of a case at ``--size large``: repeats then measure DRAM, not L2
LARGE_BYTES = 256 << 20


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # max | avg | lp | gavg | aavg | amax | qmax | qavg | unpool | max_bwd | avg_bwd |
    #          gavg_bwd
    sample: tuple  # shape of one sample, without N
    dtype: str = "float32"
    kernel: tuple = (2, 2)
    stride: tuple | None = None
    padding: int = 0
    layout: str = "NCHW"
    output_size: tuple = ()
    n: int | None = None  # a fixed N for every --size; None: N set by --size
    batched: bool = True  # False: no N at all (the seed documents' shapes): the input is sample
    indices: bool = False  # max pooling that also returns the argmax indices
    p: float = 2.0  # lp's exponent

    def shape(self, n: int) -> tuple:
        """The input's shape for batch size ``n`` (ignored by an unbatched case)."""
        return ((n,) + self.sample) if self.batched else self.sample


SUITE = (
    Case("resnet stem max 3x3 s2 p1", "max", (64, 112, 112), kernel=(3, 3), stride=(2, 2), padding=1),
    Case("resnet stem max f16", "max", (64, 112, 112), "float16", (3, 3), (2, 2), 1),
    Case("resnet stem max + indices", "max", (64, 112, 112), kernel=(3, 3), stride=(2, 2),
         padding=1, indices=True),
    Case("resnet stem max NHWC", "max", (112, 112, 64), kernel=(3, 3), stride=(2, 2), padding=1,
         layout="NHWC"),
    Case("vgg max 2x2 s2", "max", (64, 224, 224)),
    Case("densenet avg 2x2 s2", "avg", (256, 56, 56)),
    Case("inception avg 3x3 s1 p1", "avg", (192, 35, 35), kernel=(3, 3), stride=(1, 1), padding=1),
    Case("inception avg NHWC", "avg", (35, 35, 192), kernel=(3, 3), stride=(1, 1), padding=1,
         layout="NHWC"),
    Case("resnet50 head global avg", "gavg", (2048, 7, 7)),
    Case("resnet50 head global avg f16", "gavg", (2048, 7, 7), "float16"),
    Case("global avg N=64", "gavg", (2048, 7, 7), n=64),
    Case("global avg N=64 f16", "gavg", (2048, 7, 7), "float16", n=64),
    Case("global avg NHWC", "gavg", (7, 7, 2048), layout="NHWC"),
    Case("adaptive avg 14->7", "aavg", (512, 14, 14), output_size=(7, 7)),
    Case("3d max 2x2x2", "max", (64, 16, 56, 56), kernel=(2, 2, 2)),
    Case("1d max 3 s2 p1", "max", (64, 8192), kernel=(3,), stride=(2,), padding=1),
    Case("1d avg 4 s4", "avg", (64, 8192), kernel=(4,), stride=(4,)),
    Case("int8 max 2x2 s2", "qmax", (64, 112, 112), "int8"),
    Case("int8 avg 2x2 s2", "qavg", (64, 112, 112), "int8"),
    Case("seed [64,56,56] max 2x2 s2", "max", (64, 56, 56), batched=False),
    Case("seed [64,56,56] avg 3x3 s2 p1", "avg", (64, 56, 56), kernel=(3, 3), stride=(2, 2),
         padding=1, batched=False),
    Case("seed [64,7,7] global avg", "gavg", (64, 7, 7), batched=False),
)


#: The gradient of the input of a forward case (rows of the same table, apart from
#: :data:`SUITE`, whose cases the forward kernels' traffic model covers): the input is the
#: forward op's, the call takes the gradient of its output (:func:`make_grad`) and, for the
#: max, the indices of the forward call, both prepared before it is timed.
BACKWARD = (
    Case("resnet stem max 3x3 s2 p1 backward", "max_bwd", (64, 112, 112), kernel=(3, 3),
         stride=(2, 2), padding=1),
    Case("densenet avg 2x2 s2 backward", "avg_bwd", (256, 56, 56)),
    Case("resnet50 head global avg backward", "gavg_bwd", (2048, 7, 7)),
)

#: the backward ops, by the forward op whose gradient they take
BACKWARD_OPS = {"max_bwd": "max", "avg_bwd": "avg", "gavg_bwd": "gavg"}

#: The fixed cost of a call: tiny inputs, where the time is Python and launch overhead, not
#: memory traffic (the "overhead" section of the results).
OVERHEAD = tuple(
    Case(f"overhead {'x'.join(map(str, sample))} {name}", op, sample, dtype, n=1, **kw)
    for sample, ops in (
        ((4, 8, 8), (("max 2x2", "max", "float32", {}),
                     ("max 3x3 s2 p1", "max", "float32",
                      dict(kernel=(3, 3), stride=(2, 2), padding=1)),
                     ("avg 2x2", "avg", "float32", {}),
                     ("lp p=2 2x2", "lp", "float32", {}),
                     ("global avg", "gavg", "float32", {}),
                     ("adaptive avg ->3x3", "aavg", "float32", dict(output_size=(3, 3))),
                     ("adaptive max ->3x3", "amax", "float32", dict(output_size=(3, 3))),
                     ("max 2x2 + indices", "max", "float32", dict(indices=True)),
                     ("int8 max 2x2", "qmax", "int8", {}))),
        ((64, 7, 7), (("max 3x3 s2 p1", "max", "float32",
                       dict(kernel=(3, 3), stride=(2, 2), padding=1)),
                      ("avg 2x2", "avg", "float32", {}),
                      ("global avg", "gavg", "float32", {}),
                      ("max 2x2 + indices", "max", "float32", dict(indices=True)))))
    for name, op, dtype, kw in ops)

#: the op names ``--ops`` accepts besides parts of case names
OPS = ("max", "avg", "lp", "gavg", "aavg", "amax", "qmax", "qavg", *BACKWARD_OPS)


def select_cases(ops=None, cases=SUITE) -> list[Case]:
    """The ``cases`` whose op is in ``ops`` or whose name contains one of them (all for None).
    ``ValueError`` for no entries, a blank entry (it would select every case), and naming
    every entry that selects nothing in the suite or the overhead cases, listing the valid
    names."""
    if ops is None:
        return list(cases)
    if not ops:
        raise ValueError(f"--ops: no op or case name given: give an op ({', '.join(OPS)}) or "
                         f"part of a case name, or leave --ops out for every case")
    blank = [o for o in ops if not o.strip()]
    if blank:
        raise ValueError(f"--ops {', '.join(map(repr, blank))}: a blank name would select every "
                         f"case: give an op ({', '.join(OPS)}) or part of a case name, or leave "
                         f"--ops out for every case")
    every = SUITE + BACKWARD + OVERHEAD
    unknown = [o for o in ops if o not in OPS and not any(o in c.name for c in every)]
    if unknown:
        raise ValueError(f"--ops {', '.join(map(repr, unknown))} matches no case: give an op "
                         f"({', '.join(OPS)}) or part of a case name ("
                         f"{'; '.join(c.name for c in every)})")
    return [c for c in cases if c.op in ops or any(o in c.name for o in ops)]


def batch_size(case: Case, size: str) -> int:
    """N for ``case`` at ``size`` ("small" or "large"); 1 for an unbatched case (no N)."""
    if not case.batched:
        return 1
    if case.n is not None:
        return case.n
    if size == "small":
        return 4
    per_sample = math.prod(case.sample) * np.dtype(case.dtype).itemsize
    return max(1, -(-LARGE_BYTES // per_sample))


def make_input(case: Case, n: int, xp=np):
    """The input of ``case`` at batch size ``n`` as an ``xp`` array: seeded random int8 codes
    or standard normal floats."""
    rng = np.random.default_rng(0)
    shape = case.shape(n)
    if case.dtype == "int8":
        host = rng.integers(-128, 128, size=shape, dtype=np.int8)
    else:
        host = rng.standard_normal(shape, dtype=np.float32).astype(case.dtype)
    return xp.asarray(host)


def make_grad(case: Case, shape, xp=np):
    """The gradient a backward case takes for a forward output of ``shape``: seeded random
    standard normal values of the case's dtype, as an ``xp`` array."""
    rng = np.random.default_rng(1)
    return xp.asarray(rng.standard_normal(shape, dtype=np.float32).astype(case.dtype))


def _backward_call(case: Case, x):
    """The backward op of ``case`` for the forward input ``x``; the callable's ``operands``
    are the arrays it reads (the gradient, and the max's indices)."""
    xp = importlib.import_module("cupy") if is_cupy_array(x) else np
    kw = {"layout": case.layout}
    geometry = (case.kernel, case.stride, case.padding)
    nd = len(case.kernel)
    if case.op == "max_bwd":
        y, indices = gpupool.max_pool(x, *geometry, return_indices=True, **kw)
        g = make_grad(case, y.shape, xp)

        def f():
            return gpupool.max_pool_backward(g, indices, x.shape, *geometry, **kw)
        f.operands = (g, indices)
    elif case.op == "avg_bwd":
        g = make_grad(case, gpupool.avg_pool(x, *geometry, **kw).shape, xp)

        def f():
            return gpupool.avg_pool_backward(g, x.shape, *geometry, **kw)
        f.operands = (g,)
    else:
        g = make_grad(case, gpupool.global_avg_pool(x, spatial_dims=nd, **kw).shape, xp)

        def f():
            return gpupool.global_avg_pool_backward(g, x.shape, spatial_dims=nd, **kw)
        f.operands = (g,)
    return f


def read_bytes(f, x) -> int:
    """Bytes the timed call ``f`` reads: its ``operands`` (a backward case's), else ``x``."""
    return sum(a.nbytes for a in getattr(f, "operands", (x,)))


def gpupool_call(case: Case, x):
    """The gpupool function of ``case`` bound to input ``x`` (NumPy or CuPy)."""
    if case.op in BACKWARD_OPS:
        return _backward_call(case, x)
    kw = {"layout": case.layout}
    if case.op == "max":
        return lambda: gpupool.max_pool(x, case.kernel, case.stride, case.padding,
                                        return_indices=case.indices, **kw)
    if case.op == "avg":
        return lambda: gpupool.avg_pool(x, case.kernel, case.stride, case.padding, **kw)
    if case.op == "lp":
        return lambda: gpupool.lp_pool(x, case.p, case.kernel, case.stride, case.padding, **kw)
    if case.op == "gavg":
        return lambda: gpupool.global_avg_pool(x, spatial_dims=len(case.kernel), **kw)
    if case.op == "aavg":
        return lambda: gpupool.adaptive_avg_pool(x, case.output_size, **kw)
    if case.op == "amax":
        return lambda: gpupool.adaptive_max_pool(x, case.output_size, **kw)
    if case.op == "unpool":  # max_unpool of max_pool's values and indices, back to x's size
        y, indices = gpupool.max_pool(x, case.kernel, case.stride, case.padding,
                                      return_indices=True, **kw)
        size = x.shape[-len(case.kernel):] if kw["layout"] == "NCHW" else \
            x.shape[-len(case.kernel) - 1:-1]

        def f():
            return gpupool.max_unpool(y, indices, case.kernel, case.stride, case.padding, size,
                                      **kw)
        f.operands = (y, indices)
        return f
    q = gpupool.quantized.QArray(x, 0.05, 0)
    f = gpupool.quantized.max_pool if case.op == "qmax" else gpupool.quantized.avg_pool
    return lambda: f(q, case.kernel, case.stride, case.padding, layout=case.layout)


def tensor_call(case: Case, x, requires_grad: bool = False):
    """``(callable, None)``: gpupool's call of ``case`` on a CPU PyTorch tensor sharing the
    NumPy array ``x``'s memory (``requires_grad``: one that requires grad); or ``(None,
    reason)``."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch not installed"
    if case.op in ("qmax", "qavg", "unpool", *BACKWARD_OPS):
        return None, "no tensor input (quantized, or tensor operands)"
    t = torch.from_numpy(x)
    return gpupool_call(case, t.requires_grad_() if requires_grad else t), None


def _arrays(result) -> tuple:
    """The arrays of a gpupool result: (values,), (values, indices), or a QArray's (codes,)."""
    parts = result if isinstance(result, tuple) else (result,)
    return tuple(p.data if isinstance(p, gpupool.quantized.QArray) else p for p in parts)


def values(result):
    """Host NumPy values of a gpupool result (array, (values, indices) or QArray)."""
    data = _arrays(result)[0]
    if hasattr(data, "detach"):  # a PyTorch tensor
        return data.detach().numpy()
    return data.get() if hasattr(data, "get") else np.asarray(data)


def output_bytes(result) -> int:
    """Bytes a gpupool result holds: values, indices when returned, a QArray's codes."""
    return sum(a.nbytes for a in _arrays(result))
