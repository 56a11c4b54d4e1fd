#!/usr/bin/env python3
"""Run the benchmark suite and keep its JSON, Markdown and PNG under bench/results/.

    python bench/run.py [--size small|large] [--backend auto|numpy|cupy] [--ops ...]

The same as ``gpupool bench`` (the machinery lives in ``gpupool/benchmark.py`` so the installed
command has it), with output files named after the backend, size and date.
"""
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpupool.cli import main  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    size = args[args.index("--size") + 1] if "--size" in args else "small"
    backend = args[args.index("--backend") + 1] if "--backend" in args else "auto"
    if backend == "auto":
        from gpupool.benchmark import gpu_usable
        backend = "cupy" if gpu_usable()[0] else "numpy"
    stem = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        f"bench-{backend}-{size}-{datetime.date.today().isoformat()}")
    sys.exit(main(["bench", *args, "--json", stem + ".json", "--markdown", stem + ".md",
                   "--plot", stem + ".png"]))
