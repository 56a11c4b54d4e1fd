#!/usr/bin/env python3
"""Run each benchmark case once on the GPU inside a profiler range, for Nsight Compute:

  ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
      --section MemoryWorkloadAnalysis --section Occupancy python bench/profile.py --size large

Each case runs once before the range (so kernel compilation and loading stay out of it), then
once inside it: the profiler sees every launch of every case exactly once. For each case the
script prints a line with the fewest bytes the case must move (input read once, outputs
and indices written once), which is what ncu's DRAM bytes compare with.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpupool import bench as benchmark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/profile.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("small", "large"), default="large")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                        help="only these ops or cases (as gpupool bench)")
    args = parser.parse_args(argv)
    cases = benchmark.select_cases(args.ops)
    import cupy
    from cupy.cuda import profiler
    for case in cases:
        x = benchmark.make_input(case, benchmark.batch_size(case, args.size), cupy)
        call = benchmark.gpupool_call(case, x)
        result = call()
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        profiler.start()
        call()
        stream.synchronize()
        profiler.stop()
        out_bytes = benchmark.output_bytes(result)
        print(f"{case.name}: shape {x.shape} {case.dtype} {case.layout}, fewest bytes "
              f"{x.nbytes + out_bytes} (input {x.nbytes}, outputs {out_bytes})", flush=True)
        del x, call, result
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
