#!/usr/bin/env python3
"""Executed warp instructions of every modeled case's launches as the GPU counts them
(Nsight Compute's ``smsp__inst_executed.sum``), to hold the model's count
(:mod:`gpumodel.instructions`) against.

On a machine with an NVIDIA GPU, CuPy and Nsight Compute (``.ci/gpu LOGDIR issued`` runs both):

  ncu --profile-from-start off --clock-control none --csv --page details \\
      --metrics "$(python bench/issued.py metrics)" --log-file ncu.csv python bench/issued.py run
  python bench/issued.py parse ncu.csv --sm-clock 1500   # bench/results/issued-<gpu>-<date>.json

and anywhere, the model's count beside the GPU's, launch by launch (in all and on the ALU):

  python bench/issued.py compare bench/results/issued-h200-2026-11-27.json \\
      bench/results/model-2026-11-28.json bench/results/model-2026-11-28-beyond.json

``run`` calls each case of bench/measure.py (the suite, the published workloads, the cases
beyond the suite) once to compile it, then once inside the profiler's range, after a marker
kernel whose grid size is the case's number: ``parse`` names each launch's case by it.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure  # noqa: E402

MARKER = "case_marker"
#: ncu's metrics kept, by the name each is kept under (per launch)
METRICS = {"smsp__inst_executed.sum": "warp_instructions", "dram__bytes.sum": "dram_bytes",
           "gpu__time_duration.sum": "nanoseconds",
           # the warp instructions each pipe executed; how busy the ALU, FMA and schedulers were
           **{f"smsp__inst_executed_pipe_{p}.sum": f"{p}_warp_instructions"
              for p in ("alu", "fma", "fmaheavy", "fmalite", "lsu", "xu", "uniform", "cbu",
                        "adu")},
           "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": "alu_busy_percent",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "fma_busy_percent",
           "smsp__issue_active.avg.pct_of_peak_sustained_active": "scheduler_busy_percent"}


def all_cases() -> list:
    """The cases ``run`` calls, in order: the suite and workloads, then those beyond."""
    return measure.cases(False) + measure.cases(True)


def run() -> int:
    import cupy
    from cupy.cuda import profiler
    from gpumodel import benchmodel
    marker = cupy.RawKernel(f'extern "C" __global__ void {MARKER}() {{}}', MARKER)
    for number, case in enumerate(all_cases(), 1):
        x = measure.full_input(case)
        call = benchmodel.prepared_call(case, x)[0]
        call()
        cupy.cuda.Device().synchronize()
        profiler.start()
        marker((number,), (1,), ())
        call()
        cupy.cuda.Device().synchronize()
        profiler.stop()
        print(f"{number} {case.name}", flush=True)
        del x, call
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


def kernel_name(signature: str) -> str:
    """The kernel's name in ncu's signature, as the model and CUPTI write it: without
    ``void``, its parameter list and the casts of negative template arguments (``(int)-1``)."""
    return re.sub(r"\([^()]*\)$", "", signature.removeprefix("void ")).replace("(int)", "")


def parse(path: str, gpu: str, sm_clock_mhz: float | None = None) -> dict:
    """The launches of ncu's CSV (``--csv --page details``) on ``gpu`` grouped by case, and
    the SM clock their times were taken at (None: not locked)."""
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    launches: dict[str, dict] = {}
    for r in rows:
        launch = launches.setdefault(r["ID"], {
            "kernel": kernel_name(r["Kernel Name"]),
            "grid": [int(v) for v in r["Grid Size"].strip("()").split(",")],
            "block": [int(v) for v in r["Block Size"].strip("()").split(",")]})
        if r["Metric Name"] in METRICS:
            launch[METRICS[r["Metric Name"]]] = float(r["Metric Value"].replace(",", ""))
    names = [c.name for c in all_cases()]
    cases: list[dict] = []
    for launch in launches.values():
        if launch["kernel"] == MARKER:
            cases.append({"case": names[launch["grid"][0] - 1], "launches": []})
        elif cases:
            cases[-1]["launches"].append(launch)
    return {"date": datetime.date.today().isoformat(), "gpu": gpu,
            "source": "Nsight Compute, smsp__inst_executed.sum per launch",
            "sm_clock_mhz": sm_clock_mhz, "cases": cases}


def _key(kernel: str, grid) -> tuple:
    # ncu writes a bool template argument as 1/0, the model as true/false
    return kernel.replace("true", "1").replace("false", "0"), tuple(grid)


def compare(issued_path: str, model_paths: list[str]) -> list[tuple]:
    """(case, kernel, modeled, counted, modeled ALU, counted ALU) for each modeled launch the
    GPU counted: warp instructions, in all and on the ALU pipe (None where a file lacks the
    pipe's count)."""
    with open(issued_path) as f:
        counted = {(c["case"], _key(l["kernel"], l["grid"])): l
                   for c in json.load(f)["cases"] for l in c["launches"]}
    rows = []
    for path in model_paths:
        with open(path) as f:
            for c in json.load(f)["cases"]:
                for l in c["launches"]:
                    n = counted.get((c["case"], _key(l["kernel"], l["grid"])))
                    if n:
                        rows.append((c["case"], l["kernel"], l["warp_instructions"],
                                     n["warp_instructions"],
                                     l.get("pipe_warp_instructions", {}).get("alu"),
                                     n.get("alu_warp_instructions")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/issued.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="each case once inside the profiler's range (under ncu)")
    sub.add_parser("metrics", help="the metrics to ask ncu for, comma-separated")
    p = sub.add_parser("parse", help="ncu's CSV to bench/results/issued-<gpu>-<date>.json")
    p.add_argument("csv")
    p.add_argument("--gpu", help="the GPU's name (default: the current GPU's, from CuPy)")
    p.add_argument("--results-dir", default=measure.RESULTS, metavar="DIR")
    p.add_argument("--sm-clock", type=float, metavar="MHZ",
                   help="the SM clock the GPU was locked at while ncu ran (default: not locked)")
    p = sub.add_parser("compare", help="the model's counts beside the GPU's")
    p.add_argument("issued")
    p.add_argument("models", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run()
    if args.command == "metrics":
        print(",".join(METRICS))
        return 0
    if args.command == "parse":
        result = parse(args.csv, args.gpu or measure.gpu_name(), args.sm_clock)
        words = result["gpu"].split()
        short = (words[1] if len(words) > 1 else "gpu").lower()
        path = os.path.join(args.results_dir, f"issued-{short}-{result['date']}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"wrote {path}: {sum(len(c['launches']) for c in result['cases'])} launches "
              f"of {len(result['cases'])} cases")
        return 0
    rows = compare(args.issued, args.models)
    print("| case | kernel | modeled (M) | counted (M) | modeled / counted | ALU: modeled / "
          "counted |\n|---|---|---|---|---|---|")
    for case, kernel, modeled, counted, alu, counted_alu in rows:
        print(f"| {case} | `{kernel}` | {modeled / 1e6:.2f} | {counted / 1e6:.2f} | "
              f"{modeled / counted:.2f} | "
              f"{f'{alu / counted_alu:.2f}' if alu is not None and counted_alu else '-'} |")
    ratios = [row[2] / row[3] for row in rows]
    if ratios:
        print(f"\n{len(ratios)} launches: median modeled / counted {statistics.median(ratios):.2f}"
              f", within 10 %: {sum(abs(r - 1) <= 0.1 for r in ratios)}, within 20 %: "
              f"{sum(abs(r - 1) <= 0.2 for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
