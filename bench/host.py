#!/usr/bin/env python3
"""Host time of a warm CUDA-backend call, measured without a GPU: the CPU executor's stand-in
CuPy (``tests/cudacpu``) with every kernel launch stubbed out, so what is timed is gpupool's
own host path (dispatch, spec and plan lookup, result allocation, argument packing) plus the
stand-in's allocation and device bookkeeping; the launch itself (a few microseconds in real
CuPy) is not. Prints the median microseconds per call of each op on a (1, 4, 8, 8) input:

  python bench/host.py [--calls 2000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def calls(gp, cupy):
    """``name -> call`` for each op on a (1, 4, 8, 8) float32 input and its int8 codes, and
    the max backward and unpooling of its 2x2 max (indices never checked: nothing runs)."""
    x = cupy.asarray(cupy.ones((1, 4, 8, 8), "float32"))
    q = gp.quantized.QArray(cupy.ones((1, 4, 8, 8), "int8"), 0.05, 0)
    Q = gp.quantized
    y, i = gp.max_pool(x, 2, return_indices=True)
    g = cupy.ones(y.shape, "float32")
    return {
        "max 2x2": lambda: gp.max_pool(x, 2),
        "max 3x3 s2 p1": lambda: gp.max_pool(x, 3, 2, 1),
        "max 2x2 + indices": lambda: gp.max_pool(x, 2, return_indices=True),
        "avg 2x2": lambda: gp.avg_pool(x, 2),
        "lp p=2 2x2": lambda: gp.lp_pool(x, 2, 2),
        "global avg": lambda: gp.global_avg_pool(x),
        "global max": lambda: gp.global_max_pool(x),
        "adaptive avg ->3x3": lambda: gp.adaptive_avg_pool(x, (3, 3)),
        "adaptive max ->3x3": lambda: gp.adaptive_max_pool(x, (3, 3)),
        "int8 max 2x2": lambda: Q.max_pool(q, 2),
        "int8 avg 2x2": lambda: Q.avg_pool(q, 2),
        "int8 global avg": lambda: Q.global_avg_pool(q),
        "int8 adaptive avg ->3x3": lambda: Q.adaptive_avg_pool(q, (3, 3)),
        "max 2x2 backward": lambda: gp.max_pool_backward(g, i, x.shape, 2),
        "max unpool 2x2": lambda: gp.max_unpool(y, i, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/host.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats; the median is shown")
    args = parser.parse_args(argv)
    import cudacpu
    cupy = cudacpu.install()
    import gpupool as gp
    from gpupool.cuda import kernels

    def stub(name):  # the launch list is built as usual; nothing runs
        return lambda grid, block, arguments: None
    kernels.kernel = stub
    print(f"host time per warm call, launches stubbed (stand-in CuPy, {args.calls} calls x "
          f"{args.repeats} repeats, median):")
    for name, call in calls(gp, cupy).items():
        call()
        per_call = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            per_call.append((time.perf_counter() - start) / args.calls * 1e6)
        print(f"  {name:26s} {statistics.median(per_call):6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
