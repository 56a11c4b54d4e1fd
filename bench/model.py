#!/usr/bin/env python3
"""The calibrated GPU time model (gpumodel) of every benchmark case (the suite's and the
backward rows, at their --size large shape) and of every published TileOPs pooling workload
gpupool runs (../shared/calibration/workloads.json, with its semantics). Modeled, not
measured: no GPU ran these figures.

Each case is traced at a smaller shape with the same launch plan on the CPU executor, its
kernels compiled as the CUDA backend compiles them (NVRTC, sm_90) and disassembled; the
counts are scaled to the full shape (gpumodel.benchmodel). Per case it prints the calibrated
time on an H200 and an H100 SXM at the same SM clock (1500 MHz: the clock of the published
measurements), the binding limit (dram, l2, l1, latency, issue), executed warp instructions
per output element, the time of the case's ideal bytes at the DRAM triad bandwidth as a
percentage of the modeled time, and, for a published workload, the modeled time over the
fastest published kernel's (best-public.json).

Results go to bench/results/model-<date>.{json,md} (-partial with --ops, -beyond with
--beyond: cases outside the suite); an existing file is not overwritten without --force.

  python bench/model.py
  python bench/model.py --ops max --clock 1980
  python bench/model.py --beyond
  python bench/model.py --render bench/results/model-2026-11-25.json   # the tables in docs/
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
HEADER = ("MODELED, NOT MEASURED: gpumodel's time model of gpupool's CUDA kernels (machine code "
          "from NVRTC, traces from the CPU executor), calibrated on published H200 measurements "
          "of PyTorch's pooling kernels; no GPU ran these figures.")


def output_stem(results_dir: str, suffix: str = "", date: datetime.date | None = None) -> str:
    date = date or datetime.date.today()
    return os.path.join(results_dir, f"model-{date.isoformat()}{suffix}")


def short(name: str) -> str:
    """A kernel name expression, compact."""
    for long, brief in (("unsigned ", "u"), ("signed char", "s8"), ("long long", "ll"),
                        ("__half", "half"), (" ", "")):
        name = name.replace(long, brief)
    return name


def fastest_public(best: list[dict], case) -> dict | None:
    """The fastest published non-PyTorch kernel on ``case``'s workload (bfloat16 rows count
    for float16: gpupool runs bfloat16 workloads as float16)."""
    if not getattr(case, "workload", ""):
        return None
    op, label = case.workload.split(" ", 1)
    dtypes = {case.dtype} | ({"bfloat16"} if case.dtype == "float16" else set())
    rows = [r for r in best if r["op"] == op and r["workload"] == label
            and r["dtype"] in dtypes and bool(r["indices"]) == case.indices]
    return min(rows, key=lambda r: r["time_us"]) if rows else None


def selected(case, ops) -> bool:
    """Whether ``--ops`` (None: every case) names the case's op or a part of its name."""
    return ops is None or any(o == case.op or o in case.name for o in ops)


def case_row(model, devices, best) -> dict:
    """One case as JSON: per device its time, bound and limits; its counts."""
    first = devices[0]
    public = fastest_public(best, model.case)
    row = {
        "case": model.case.name, "shape": list(model.shape),
        "traced_shape": list(model.traced_shape), "dtype": model.case.dtype,
        "outputs": model.outputs, "ideal_bytes": model.ideal_bytes,
        "dram_bytes": model.dram_bytes, "warp_instructions": model.warp_instructions,
        "warp_instructions_per_output": model.warp_instructions / model.outputs,
        "devices": {d.label(): {
            "seconds": model.seconds(d), "bound": model.bound(d),
            "issue_part": model.longest(d).issue_part,
            "percent_of_triad_time": model.percent_of_triad(d),
            "memory_floor_seconds": model.floor_seconds(d)} for d in devices},
        "launches": [{
            "kernel": la.name, "grid": list(la.grid), "block": list(la.block),
            "registers": la.counts.registers, "occupancy": la.counts.occupancy.fraction,
            "warp_instructions": la.counts.warp_instructions,
            "pipe_warp_instructions": la.counts.pipe_instructions,
            "unmatched_accesses": la.counts.unmatched, "dram_bytes": la.counts.dram_bytes,
            "compiled_loads_per_run": la.traffic.batch,
            "limits_seconds": {d.label(): la.counts.time(d).limits for d in devices},
            "sites": [{"source": la.sites.get(s.site, hex(s.site)), "write": s.write,
                       "requests": s.requests, "sectors_per_request": s.sectors / s.requests}
                      for s in la.traffic.sites] if la.sites else [],
        } for la in model.launches],
    }
    if public:
        row["fastest_public"] = {k: public[k] for k in ("impl", "time_us", "clock", "source")}
        row["ratio_to_fastest_public"] = model.seconds(first) * 1e6 / public["time_us"]
    return row


TABLE_HEAD = ("| case | {0} us | bound | {1} us | warp instr / output | % of triad time | "
              "fastest public us (impl) | ratio |")


#: How a table names a binding limit ("issue": instruction issue) and a pipe that binds it.
BOUND_NAMES = {"issue": "instructions"}
PIPE_NAMES = {"alu": "ALU", "fmaheavy": "integer FMA", "fma": "FMA", "fp64": "FP64",
              "xu": "XU"}


def bound_name(limits: dict) -> str:
    """A device's binding limit as a table names it (``limits``: a row's ``devices`` entry)."""
    name = BOUND_NAMES.get(limits["bound"], limits["bound"])
    part = limits.get("issue_part", "scheduler")
    return f"{name} ({PIPE_NAMES[part]})" if limits["bound"] == "issue" and part in PIPE_NAMES \
        else name


def table(rows, labels) -> list[str]:
    """A Markdown table of result rows, the times on the devices named by ``labels``."""
    a, b = labels
    lines = [TABLE_HEAD.format(a, b), "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        da, db = r["devices"][a], r["devices"][b]
        public = r.get("fastest_public")
        lines.append(
            f"| {r['case']} | {da['seconds'] * 1e6:.1f} | {bound_name(da)} | "
            f"{db['seconds'] * 1e6:.1f} | {r['warp_instructions_per_output']:.2f} | "
            f"{da['percent_of_triad_time']:.0f} | "
            + (f"{public['time_us']:g} ({public['impl']}) | "
               f"{r['ratio_to_fastest_public']:.2f} |" if public else "- | - |"))
    return lines


def markdown(sections, skipped, meta, devices) -> str:
    from gpumodel import device as d
    lines = [f"# gpupool: calibrated GPU time model ({meta['date']})", "", f"**{HEADER}**", "",
             f"Devices: {', '.join(x.label() for x in devices)}; 132 SMs, 4 warp schedulers "
             f"per SM issuing one warp instruction per clock at an issue efficiency of "
             f"{d.ISSUE_EFFICIENCY} (fitted), the ALU and integer FMA pipes half a warp "
             f"instruction per clock and conversions an eighth at a pipe efficiency of "
             f"{d.PIPE_EFFICIENCY} (fitted; the bound names such a pipe where it binds), plus "
             f"{d.LAUNCH_SECONDS * 1e6:.2f} us per launch (fitted); DRAM at the STREAM triad "
             f"({d.DRAM_TRIAD_FRACTION:.3f} of peak: "
             f"{devices[0].dram_bandwidth / 1e12:.2f} and {devices[1].dram_bandwidth / 1e12:.2f}"
             f" TB/s). Time = the largest of the DRAM, L2, L1, latency and issue limits, plus "
             f"the fixed cost, per launch (gpumodel/device.py names every constant and its "
             f"source). Warp instructions per output: executed warp instructions (the SASS path "
             f"each warp takes, gpumodel/instructions.py) over the output's elements. % of triad time: "
             f"the ideal bytes (input read once, output written once) at the triad bandwidth "
             f"over the modeled time. Ratio: modeled {devices[0].label()} time over the fastest "
             f"published kernel's time (best-public.json; some of those ran at unstated clocks, "
             f"up to ~1.3x faster than at 1500 MHz). Calibration: `python bench/calibrate.py`.",
             ""]
    for title, rows in sections:
        if rows:
            lines += [f"## {title}", "", *table(rows, [x.label() for x in devices]), ""]
    if skipped:
        lines += ["Not modeled:", ""] + [f"- {name}: {why}" for name, why in skipped] + [""]
    lines += [f"Traced and modeled in {meta['wall_seconds']:.0f} s on {meta['host']}.", ""]
    return "\n".join(lines)


def rendered_tables(path: str) -> str:
    """The tables of a results file (``--render``): the suite's cases, then the others, under
    their section titles (what docs/performance.md shows)."""
    from gpumodel import benchmodel
    with open(path) as f:
        results = json.load(f)
    suite = {c.name for c in benchmodel.modeled_cases()}
    rows = results["cases"]
    sections = [("Benchmark suite (--size large)", [r for r in rows if r["case"] in suite]),
                ("Published workloads (TileOPs)", [r for r in rows if r["case"] not in suite])]
    lines = []
    for title, section in sections:
        if section:
            lines += [f"**{title}**", "", *table(section, results["devices"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/model.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                        help="only these ops or cases (as gpupool bench, workloads by a part "
                             "of their name); the files are then named ...-partial")
    parser.add_argument("--beyond", action="store_true",
                        help="the cases beyond the suite (other layouts, dtypes and windows of "
                             "its ops) instead of the suite and the workloads; the files are "
                             "then named ...-beyond")
    parser.add_argument("--sites", action="store_true",
                        help="name every load and store site by its source line (JSON)")
    parser.add_argument("--clock", type=float, default=1500, metavar="MHZ",
                        help="SM clock of both devices (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite result files of the same name")
    parser.add_argument("--results-dir", default=RESULTS, metavar="DIR",
                        help="where the files go (default: bench/results next to this script)")
    parser.add_argument("--render", metavar="JSON",
                        help="print the tables of a results file instead of modeling")
    args = parser.parse_args(argv)
    if args.render:
        print(rendered_tables(args.render), end="")
        return 0
    if not os.path.isdir(args.results_dir):
        print(f"bench/model.py: --results-dir {args.results_dir} is not a folder",
              file=sys.stderr)
        return 2
    stem = output_stem(args.results_dir,
                       "-beyond" if args.beyond else "-partial" if args.ops else "")
    existing = [stem + ext for ext in (".json", ".md") if os.path.exists(stem + ext)]
    if existing and not args.force:
        print(f"bench/model.py: not overwriting {', '.join(existing)}; pass --force to replace "
              f"it", file=sys.stderr)
        return 1
    from gpumodel import benchmodel, calibration, device, sass

    import cudacpu
    from cudacpu import executor
    reason = executor.host_compiler_reason()
    if reason:
        print(f"bench/model.py: the CPU executor needs a host compiler: {reason}",
              file=sys.stderr)
        return 1
    nvrtc = cudacpu.real_nvrtc()
    if nvrtc is None:
        print("bench/model.py: CuPy's NVRTC is not importable (the model reads the compiled "
              "code): pip install -e '.[test,cuda13]'", file=sys.stderr)
        return 1
    try:
        sass.nvdisasm()
    except FileNotFoundError as e:
        print(f"bench/model.py: {e}", file=sys.stderr)
        return 1
    cudacpu.install()
    devices = [device.h200(args.clock * 1e6), device.h100(args.clock * 1e6)]
    suite = [c for c in (benchmodel.beyond_suite_cases() if args.beyond else
                         benchmodel.modeled_cases()) if selected(c, args.ops)]
    workloads, skipped = [], []
    best = []
    if calibration.calibration_file("workloads.json").is_file() and not args.beyond:
        best = json.loads(calibration.calibration_file("best-public.json").read_text())
        for case in benchmodel.workload_cases(calibration.calibration_file("workloads.json")):
            if not selected(case, args.ops):
                continue
            try:
                planes, _, full = benchmodel.matching_scale(case)
                benchmodel.block_limit(case, planes, full)
            except LookupError as e:
                skipped.append((case.name, str(e)))
                continue
            workloads.append(case)
    if not suite and not workloads:
        print(f"bench/model.py: --ops {' '.join(args.ops)} matches no case", file=sys.stderr)
        return 2
    start = time.perf_counter()
    models = benchmodel.model_suite(suite + workloads, nvrtc, sites=args.sites)
    rows = [case_row(m, devices, best) for m in models]
    meta = {"date": datetime.date.today().isoformat(), "modeled_not_measured": HEADER,
            "devices": [d.label() for d in devices],
            "constants": {"issue_efficiency": device.ISSUE_EFFICIENCY,
                          "pipe_efficiency": device.PIPE_EFFICIENCY,
                          "issue_warps": device.ISSUE_WARPS,
                          "launch_seconds": device.LAUNCH_SECONDS,
                          "dram_triad_fraction": device.DRAM_TRIAD_FRACTION,
                          "dram_latency": device.DRAM_LATENCY, "l1_latency": device.L1_LATENCY},
            "wall_seconds": time.perf_counter() - start,
            "host": f"{os.cpu_count()} CPU cores ({platform.machine()})"}
    sections = [("Beyond the suite" if args.beyond else "Benchmark suite (--size large)",
                 rows[:len(suite)]),
                ("Published workloads (TileOPs)", rows[len(suite):])]
    text = markdown(sections, skipped, meta, devices)
    print(text)
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "cases": rows, "not_modeled": dict(skipped)}, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
