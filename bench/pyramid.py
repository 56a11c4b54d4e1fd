#!/usr/bin/env python3
"""Multi-resolution pyramid of a large image: repeated 2x2 average pooling, Dask vs NumPy.

The image is 1 x 3 x SIZE x SIZE float32 with a cheap deterministic formula,
``sin(0.001 * row + channel) + cos(0.0007 * column)``. Each level is
``gpupool.avg_pool(previous, 2)`` down to --smallest; every level is reduced to a float64
checksum, and the smallest level is kept.

* ``dask``: the image is a Dask array generated lazily tile by tile (chunks of 1 x 1 x CHUNK x
  CHUNK), all levels computed in one ``dask.compute`` on the threaded scheduler, so memory
  holds a few tiles at a time, never a level.
* ``numpy``: the same image as one in-memory NumPy array, levels computed one after another.

Each variant runs in a fresh Python process, which reports its wall time (image generation
included) and its peak resident memory (``getrusage(RUSAGE_SELF).ru_maxrss``). Results go to
``bench/results/pyramid-<size>-<date>.{json,md}``, with whether the variants agree (the
smallest level bit for bit, the checksums to 1e-9: their sum order differs).

  python bench/pyramid.py --size 16384 --variants dask numpy
  python bench/pyramid.py --size 32768 --variants dask
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def tile(rows, cols, channels):
    """The image's values at the given rows, columns and channels, float32."""
    import numpy as np
    r = np.sin(np.float32(0.001) * rows.astype(np.float32)[None, :, None]
               + channels.astype(np.float32)[:, None, None])
    c = np.cos(np.float32(0.0007) * cols.astype(np.float32))[None, None, :]
    return (r + c)[None]


def _dask_tile(block_info=None):
    import numpy as np
    (_, _), (c0, c1), (r0, r1), (k0, k1) = block_info[None]["array-location"]
    return tile(np.arange(r0, r1), np.arange(k0, k1), np.arange(c0, c1))


def pyramid_dask(size: int, chunk: int, smallest: int):
    import dask
    import dask.array as da
    import numpy as np

    import gpupool
    image = da.map_blocks(_dask_tile, chunks=((1,), (1, 1, 1), (chunk,) * (size // chunk),
                                              (chunk,) * (size // chunk)),
                          dtype=np.float32, meta=np.empty((0, 0, 0, 0), np.float32))
    levels = [image]
    while levels[-1].shape[-1] > smallest:
        levels.append(gpupool.avg_pool(levels[-1], 2))
    sums = [level.sum(dtype=np.float64) for level in levels[1:]]
    *checksums, last = dask.compute(*sums, levels[-1], scheduler="threads")
    return [float(s) for s in checksums], last


def pyramid_numpy(size: int, smallest: int):
    import numpy as np

    import gpupool
    level = tile(np.arange(size), np.arange(size), np.arange(3))
    checksums = []
    while level.shape[-1] > smallest:
        level = gpupool.avg_pool(level, 2)
        checksums.append(float(level.sum(dtype=np.float64)))
    return checksums, level


def run_variant(args) -> dict:
    start = time.perf_counter()
    if args.run == "dask":
        checksums, last = pyramid_dask(args.size, args.chunk, args.smallest)
    else:
        checksums, last = pyramid_numpy(args.size, args.smallest)
    wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"variant": args.run, "wall_s": round(wall, 2), "peak_rss_mib": round(peak_kib / 1024),
            "levels": [args.size >> (i + 1) for i in range(len(checksums))],
            "checksums": checksums, "smallest_level_shape": list(last.shape),
            "smallest_level_sha256": hashlib.sha256(last.tobytes()).hexdigest()}


def baseline_rss_mib() -> int:
    """Peak RSS of a process that only imports NumPy, Dask and gpupool."""
    code = ("import resource, numpy, dask.array, gpupool; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=_env()).stdout
    return round(int(out) / 1024)


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def markdown(result: dict) -> str:
    lines = [f"Pyramid of a 1x3x{result['size']}x{result['size']} float32 image, 2x2 average "
             f"pooling down to {result['smallest']}x{result['smallest']} "
             f"({len(result['runs'][0]['levels'])} levels), on {result['device']}. Dask "
             f"chunks 1x1x{result['chunk']}x{result['chunk']} generated lazily, threaded "
             f"scheduler; peak RSS of a fresh process per variant (importing NumPy, Dask and "
             f"gpupool alone: {result['baseline_rss_mib']} MiB).", "",
             "| variant | wall s | peak RSS MiB |", "|---|---|---|"]
    for run in result["runs"]:
        lines.append(f"| {run['variant']} | {run['wall_s']} | {run['peak_rss_mib']} |")
    if "smallest_level_identical" in result:
        lines += ["", f"Smallest level bit-identical between variants: "
                      f"{result['smallest_level_identical']}; float64 checksums of every level "
                      f"agree to 1e-9 relative: {result['checksums_agree']}."]
    if result["note"]:
        lines += ["", result["note"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/pyramid.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=32768, help="image side (default 32768)")
    parser.add_argument("--chunk", type=int, default=4096, help="Dask tile side (default 4096)")
    parser.add_argument("--smallest", type=int, default=512,
                        help="side of the last level (default 512)")
    parser.add_argument("--variants", nargs="+", choices=("dask", "numpy"),
                        default=["dask", "numpy"])
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="date in the result file names (default today)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--note", default="", help="a sentence added to the results")
    parser.add_argument("--run", choices=("dask", "numpy"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size % args.chunk or args.size % args.smallest:
        parser.error("--size must be a multiple of --chunk and of --smallest")
    if args.run:  # a child process: one variant, JSON on stdout
        print(json.dumps(run_variant(args)))
        return 0
    runs = []
    for variant in args.variants:
        command = [sys.executable, os.path.abspath(__file__), "--run", variant,
                   "--size", str(args.size), "--chunk", str(args.chunk),
                   "--smallest", str(args.smallest)]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=_env())
        runs.append(json.loads(out.stdout))
        print(f"{variant}: {runs[-1]['wall_s']} s, peak RSS {runs[-1]['peak_rss_mib']} MiB",
              flush=True)
    result = {"size": args.size, "chunk": args.chunk, "smallest": args.smallest,
              "date": args.date, "device": f"{platform.machine()} CPU, {os.cpu_count()} cores",
              "python": platform.python_version(), "baseline_rss_mib": baseline_rss_mib(),
              "runs": runs, "note": args.note}
    if len(runs) > 1:
        first = runs[0]
        result["smallest_level_identical"] = all(
            r["smallest_level_sha256"] == first["smallest_level_sha256"] for r in runs)
        result["checksums_agree"] = all(
            abs(a - b) <= 1e-9 * abs(b) for r in runs for a, b in zip(r["checksums"],
                                                                      first["checksums"]))
    stem = os.path.join(args.results_dir, f"pyramid-{args.size}-{args.date}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
