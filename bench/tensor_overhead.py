#!/usr/bin/env python3
"""The fixed cost of a call on a PyTorch tensor: gpupool on a CPU tensor against gpupool on the
same NumPy array and PyTorch's own op, on a (1, 4, 8, 8) float32 input, untracked and with
``requires_grad`` (through gpupool's PyTorch operators). CPU time of the calling thread
(``time.thread_time``; PyTorch set to one thread so that its op's time is all there), the
least of the repeats, in microseconds per call:

  python bench/tensor_overhead.py [--calls 2000] [--repeats 9]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# the repository in place of bench/, whose profile.py would hide the standard library's
sys.path[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/tensor_overhead.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed repeat")
    parser.add_argument("--repeats", type=int, default=9, help="repeats; the least is shown")
    args = parser.parse_args(argv)
    import numpy as np
    import torch
    import gpupool as gp
    torch.set_num_threads(1)
    F = torch.nn.functional
    a = np.ones((1, 4, 8, 8), np.float32)
    t = torch.from_numpy(a.copy())
    tracked = t.clone().requires_grad_()
    rows = {"max 2x2 NumPy": lambda: gp.max_pool(a, 2),
            "max 2x2 tensor": lambda: gp.max_pool(t, 2),
            "max 2x2 F.max_pool2d": lambda: F.max_pool2d(t, 2),
            "avg 2x2 NumPy": lambda: gp.avg_pool(a, 2),
            "avg 2x2 tensor": lambda: gp.avg_pool(t, 2),
            "avg 2x2 F.avg_pool2d": lambda: F.avg_pool2d(t, 2),
            "avg 2x2 tensor, requires_grad": lambda: gp.avg_pool(tracked, 2),
            "avg 2x2 F.avg_pool2d, requires_grad": lambda: F.avg_pool2d(tracked, 2)}
    print(f"CPU time per call ({args.calls} calls x {args.repeats} repeats, least):")
    for name, call in rows.items():
        call()
        best = min(_timed(call, args.calls) for _ in range(args.repeats))
        print(f"  {name:38s} {best:6.1f} us")
    return 0


def _timed(call, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        call()
    return (time.thread_time() - start) / calls * 1e6


if __name__ == "__main__":
    sys.exit(main())
