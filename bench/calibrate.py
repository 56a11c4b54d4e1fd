#!/usr/bin/env python3
"""The GPU time model against published H200 measurements: PyTorch's own pooling kernels
(``torch_kernels.cu`` of the calibration folder) on every ``torch-ref`` row of a measured
file, modeled (traced on the CPU executor, no GPU) and set beside the measured time.

The device's two fitted constants (issue efficiency, fixed time per launch) are refitted on
the file's fit rows (gpumodel.calibration.FIT_ROWS) and both fits are reported: the one
the model ships (gpumodel.device) and the refit. Rows whose kernel the calibration source
lacks are listed with the reason. The pipe efficiency (gpumodel.device.PIPE_EFFICIENCY) is
refitted too, on Nsight Compute's counts of gpupool's own kernels (bench/issued.py).

  python bench/calibrate.py
  python bench/calibrate.py --measured other-measured.json --issued issued-h200-DATE.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

from gpumodel import calibration, device as devices


def report(results, shipped, refit) -> list[str]:
    lines = [f"{'row':<58} {'measured':>9} {'modeled':>8} {'ratio':>6} {'refit':>6} "
             f"{'bound':>7} {'warp instr/out':>14}"]
    for r in results:
        row = r.row
        what = (f"{row['source_tag']} {row['op']} {row['workload']} {row['dtype']}"
                f"{' +idx' if row['indices'] else ''}{' [fit]' if r.in_fit else ''}")
        if r.counts is None:
            lines.append(f"{what:<58} {row['time_us']:>9.2f}  not modeled: {r.reason}")
            continue
        t = r.predicted(shipped)
        clock = "" if r.clock else "  (clock not stated: modeled at 1500 MHz)"
        lines.append(f"{what:<58} {row['time_us']:>9.2f} {t.seconds * 1e6:>8.2f} "
                     f"{r.ratio(shipped):>6.3f} {r.ratio(refit):>6.3f} {t.bound:>7} "
                     f"{r.counts.warp_instructions / r.workload.outputs:>14.2f}{clock}")
    modeled = [r for r in results if r.counts]
    for label, d in (("shipped", shipped), ("refit", refit)):
        ratios = [r.ratio(d) for r in modeled]
        within = sum(abs(x - 1) <= 0.15 for x in ratios)
        lines.append(f"{label}: issue efficiency {d.issue_efficiency:.3f}, fixed "
                     f"{d.launch_seconds * 1e6:.2f} us; {len(ratios)} rows modeled, ratios "
                     f"{min(ratios):.3f}-{max(ratios):.3f}, {within} within +-15 %")
    return lines


def _clock(path: str) -> float | None:
    """The SM clock in MHz that an issued-*.json file's times were taken at (None: unlocked)."""
    with open(path) as f:
        return json.load(f).get("sm_clock_mhz")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/calibrate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", default=str(calibration.calibration_file("measured.json")),
                        metavar="FILE", help="measured rows (default: %(default)s)")
    issued = [path for path in sorted(glob.glob(os.path.join(
        os.path.dirname(__file__), "results", "issued-h200-*.json"))) if _clock(path) == 1500]
    parser.add_argument("--issued", default=issued[-1] if issued else None, metavar="FILE",
                        help="Nsight Compute's per-pipe counts of gpupool's kernels on an H200 "
                             "at 1500 MHz (default: the newest taken at that clock, "
                             "%(default)s)")
    args = parser.parse_args(argv)
    results = calibration.torch_rows(calibration.load(args.measured))
    shipped = devices.h200()
    refit = calibration.fit(results, shipped)
    print("\n".join(report(results, shipped, refit)))
    if args.issued:
        with open(args.issued) as f:
            fills = calibration.pipe_efficiency(json.load(f), shipped)
        print(f"pipe efficiency: shipped {shipped.pipe_efficiency:.3f}, refit "
              f"{statistics.median(fills):.3f} (median of {len(fills)} ALU-bound launches, "
              f"{min(fills):.3f}-{max(fills):.3f}; {args.issued})" if fills else
              f"pipe efficiency: no ALU-bound launch in {args.issued}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
