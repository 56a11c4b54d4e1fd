#!/usr/bin/env python3
"""Run the benchmark suite and keep its JSON, Markdown and PNG under bench/results/.

The same suite as `gpupool bench` (the machinery lives in gpupool/bench/ so that the
installed command has it), with the output files named after the backend, size and date:

  bench-<backend>-<size>-<date>.{json,md,png}           a full run
  bench-<backend>-<size>-<date>-partial.{json,md,png}   a run limited with --ops

so a partial run never takes the name of a full one. An existing result file is never
overwritten unless --force is given: the script stops before running anything and names the
file. The PNG needs matplotlib (pip install "gpupool[bench]"); --no-plot skips it.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from gpupool import cli  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def output_stem(results_dir: str, backend: str, size: str, partial: bool,
                date: datetime.date | None = None) -> str:
    """The results path without extension."""
    date = date or datetime.date.today()
    name = f"bench-{backend}-{size}-{date.isoformat()}{'-partial' if partial else ''}"
    return os.path.join(results_dir, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("small", "large"), default="small",
                        help="small: N=4 per case; large: inputs of at least 256 MiB "
                             "(default: small)")
    parser.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                        help="auto: the GPU when CuPy sees one, else the CPU (default: auto)")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                        help="only these ops or cases (as gpupool bench); the files are then "
                             "named ...-partial")
    parser.add_argument("--force", action="store_true",
                        help="overwrite result files of the same name")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument("--results-dir", default=RESULTS, metavar="DIR",
                        help="where the files go (default: bench/results next to this script)")
    args = parser.parse_args(argv)
    backend = args.backend
    if backend == "auto":
        from gpupool.cuda.probe import gpu_usable
        backend = "cupy" if gpu_usable()[0] else "numpy"
    stem = output_stem(args.results_dir, backend, args.size, bool(args.ops))
    extensions = (".json", ".md") + (() if args.no_plot else (".png",))
    existing = [stem + ext for ext in extensions if os.path.exists(stem + ext)]
    if existing and not args.force:
        print(f"bench/run.py: not overwriting {', '.join(existing)}; pass --force to replace "
              f"it", file=sys.stderr)
        return 1
    bench_args = ["bench", "--size", args.size, "--backend", backend,
                  "--json", stem + ".json", "--markdown", stem + ".md"]
    if args.ops:
        bench_args += ["--ops", *args.ops]
    if not args.no_plot:
        bench_args += ["--plot", stem + ".png"]
    return cli.main(bench_args)


if __name__ == "__main__":
    sys.exit(main())
