#!/usr/bin/env python3
"""Modeled H100 memory traffic and bandwidth of every benchmark case (the suite's and the
backward rows) at its --size large shape, from traces of the CUDA kernels on the CPU executor
(no GPU needed). Modeled, not measured.

Each case of gpupool/bench/cases.py is traced at a smaller shape with the same launch plan
(gpumodel/benchmodel.py), its global loads and stores grouped into warp requests and
sectors (tests/cudacpu/traffic.py, where every constant of the time model is, with its
source), and the counts scaled to the full shape. Per launch it reports sectors per request
(actual / ideal), DRAM bytes against the ideal (input read once, output written once),
registers (ptxas, through CuPy's NVRTC when installed) and occupancy, the compiled code's
global loads per run (nvdisasm of the same compile, tests/cudacpu/sass.py), the modeled time's
bound (dram, l2, l1, latency) and the bandwidth the op shows as a percentage of DRAM peak.

Results go to bench/results/model-h100-large-<date>.{json,md} (-partial with --ops, -beyond
with --beyond: cases outside the suite); an existing file is not overwritten without --force.

  python bench/model.py
  python bench/model.py --ops max --sites
  python bench/model.py --beyond
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

HEADER = ("MODELED, NOT MEASURED: an H100 SXM memory-traffic model of gpupool's CUDA kernels, "
          "from traces on the CPU executor (tests/cudacpu); no GPU ran these figures.")


def output_stem(results_dir: str, suffix: str = "", date: datetime.date | None = None) -> str:
    """The results path without extension (``suffix``: "-partial", "-beyond" or none)."""
    date = date or datetime.date.today()
    return os.path.join(results_dir, f"model-h100-large-{date.isoformat()}{suffix}")


def short(name: str) -> str:
    """A kernel name expression, compact."""
    for long, brief in (("unsigned ", "u"), ("signed char", "s8"), ("long long", "ll"),
                        ("__half", "half"), (" ", "")):
        name = name.replace(long, brief)
    return name


def per_request(sectors: int, requests: int) -> str:
    return f"{sectors / requests:.2f}" if requests else "-"


def launch_row(model, la) -> dict:
    """One launch of a case model, as JSON."""
    t = la.traffic
    return {
        "kernel": la.name, "grid": list(la.grid), "block": list(la.block),
        "registers": la.registers, "shared_bytes": la.shared,
        "compiled_load_blocks": [list(b) for b in la.batching.blocks] if la.batching else None,
        "compiled_loads_per_run": la.traffic.batch,
        "blocks_per_sm": la.occupancy.blocks_per_sm, "occupancy": la.occupancy.fraction,
        "occupancy_limiter": la.occupancy.limiter,
        "traced": {"load_requests": t.load_requests, "load_sectors": t.load_sectors,
                   "load_ideal_sectors": t.load_ideal, "store_requests": t.store_requests,
                   "store_sectors": t.store_sectors, "store_ideal_sectors": t.store_ideal,
                   "dram_read_sectors": t.dram_read_sectors,
                   "dram_write_sectors": t.dram_write_sectors,
                   "l2_read_sectors": t.l2_read_sectors, "l2_write_sectors": t.l2_write_sectors,
                   "l1_wavefronts": t.l1_wavefronts, "rounds": t.rounds,
                   "block_rounds": t.block_rounds,
                   "most_loads_per_thread_and_epoch": t.epoch_loads},
        "dram_bytes": la.dram_bytes,
        "seconds": {"dram": la.time.dram, "l2": la.time.l2, "l1": la.time.l1,
                    "latency": la.time.latency},
        "dram_bytes_in_flight": la.time.bytes_in_flight,
        "bound": la.time.bound,
        "sites": [{"source": la.sites.get(s.site, hex(s.site)), "write": s.write,
                   "array": s.array, "requests": s.requests,
                   "sectors_per_request": s.sectors / s.requests,
                   "ideal_per_request": s.ideal / s.requests, "lanes": s.lanes}
                  for s in la.traffic.sites] if la.sites else [],
    }


def case_row(model) -> dict:
    return {
        "case": model.case.name, "shape": list(model.shape),
        "traced_shape": list(model.traced_shape), "traced_sm_count": model.sms,
        "scale": model.scale, "ideal_bytes": model.ideal_bytes,
        "dram_bytes": model.dram_bytes, "seconds": model.seconds, "bound": model.bound,
        "percent_of_dram_peak": model.percent_of_peak,
        "launches": [launch_row(model, la) for la in model.launches],
    }


def constants() -> dict:
    from gpumodel import traffic
    names = ("DRAM_PEAK", "DRAM_EFFICIENCY", "L2_BANDWIDTH", "SM_COUNT", "SM_CLOCK",
             "L1_WAVEFRONTS_PER_CLOCK", "DRAM_LATENCY", "LOOP_LOADS_IN_FLIGHT",
             "COMPILED_BATCH")
    return {n: getattr(traffic, n) for n in names}


TABLE_HEAD = ("| case | kernel | grid x block (full size) | regs | occupancy | compiled loads/run "
              "used (whole code: LDG / runs, longest) | load sectors/req "
              "(actual / ideal) | store sectors/req (actual / ideal) | DRAM / ideal bytes | "
              "bound | modeled us | % of DRAM peak |")


def compiled_batch(la) -> str:
    """A launch's compiled global loads per run as the rounds used them, and the kernel's
    loads, runs and longest run over its whole code."""
    b = la.batching
    if b is None:
        return "?"
    if not b.runs:
        return "no loads"
    used = la.traffic.batch
    return (f"{used if used is not None else b.batch:.2f} "
            f"({b.loads} / {len(b.runs)}, {max(b.runs)})")


def table_rows(models) -> list[str]:
    rows = [TABLE_HEAD, "|" + "---|" * TABLE_HEAD.count(" | ") + "---|"]
    for m in models:
        for i, la in enumerate(m.launches):
            t = la.traffic
            first = i == 0
            rows.append(
                f"| {m.case.name if first else ''} | `{short(la.name)}` | "
                f"{tuple(la.grid)} x {tuple(la.block)} | {la.registers or '?'} | "
                f"{la.occupancy.fraction:.2f} ({la.occupancy.limiter}) | "
                f"{compiled_batch(la)} | "
                f"{per_request(t.load_sectors, t.load_requests)} / "
                f"{per_request(t.load_ideal, t.load_requests)} | "
                f"{per_request(t.store_sectors, t.store_requests)} / "
                f"{per_request(t.store_ideal, t.store_requests)} | "
                f"{f'{m.dram_bytes / m.ideal_bytes:.2f}' if first else ''} | {la.time.bound} | "
                f"{la.time.seconds * 1e6:.1f} | "
                f"{f'{m.percent_of_peak:.1f}' if first else ''} |")
    return rows


def markdown(models, meta: dict) -> str:
    from gpumodel import traffic
    c = meta["constants"]
    lines = [
        f"# gpupool: modeled H100 memory traffic, benchmark suite at --size large "
        f"({meta['date']})", "",
        f"**{HEADER}**", "",
        f"Model: tests/cudacpu/traffic.py. DRAM peak {c['DRAM_PEAK'] / 1e12:.3f} TB/s, of which "
        f"{c['DRAM_EFFICIENCY']:.0%} is sustainable (assumption); L2 {c['L2_BANDWIDTH'] / 1e12:.1f}"
        f" TB/s (assumption); L1 one 128-byte wavefront per SM per clock at "
        f"{c['SM_CLOCK'] / 1e9:.3f} GHz (assumption); latency {c['DRAM_LATENCY'] * 1e9:.0f} ns "
        f"(assumption) per round of independent loads of a block's slowest warp, over the "
        f"resident blocks; an epoch (one output stored) of m loads per thread (every "
        f"array's) takes at least ceil(m / compiled loads per run) rounds, loads per run = "
        f"{c['COMPILED_BATCH']} ({meta['batching']}; every code path counts once, "
        f"see traffic.py). L2 assumption: "
        f"each distinct sector is read from DRAM once per launch and each written sector written "
        f"once. Time = the largest of the four limits per launch, summed over launches; launch "
        f"overhead and the last wave's tail are left out. Registers: "
        f"{meta['registers']}.", "",
        f"Each case was traced at a smaller shape with the same launch plan (traced shape and "
        f"the SM count the planner was given are in the JSON), on the CPU executor; counts are "
        f"scaled to the full shape. Sectors per request: traced warp requests, "
        f"ideal = ceil(distinct bytes / {traffic.SECTOR}). % of DRAM peak = ideal bytes "
        f"(input read once + output written once) / modeled time / DRAM peak.", "",
        *table_rows(models), "",
        f"{len(models)} cases; traced and modeled in {meta['wall_seconds']:.0f} s on "
        f"{meta['host']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/model.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                        help="only these ops or cases (as gpupool bench); the files are then "
                             "named ...-partial")
    parser.add_argument("--beyond", action="store_true",
                        help="the cases beyond the suite (other layouts, dtypes and windows of "
                             "its ops) instead; the files are then named ...-beyond")
    parser.add_argument("--sites", action="store_true",
                        help="name every load and store site by its source line (JSON)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite result files of the same name")
    parser.add_argument("--results-dir", default=RESULTS, metavar="DIR",
                        help="where the files go (default: bench/results next to this script)")
    args = parser.parse_args(argv)
    import platform

    from gpumodel import benchmodel  # first: it puts the executor (cudacpu) in reach

    import cudacpu
    from cudacpu import executor

    if args.beyond:
        cases, suffix = benchmodel.beyond_suite_cases(), "-beyond"
    else:
        cases, suffix = benchmodel.modeled_cases(args.ops), "-partial" if args.ops else ""
    stem = output_stem(args.results_dir, suffix)
    existing = [stem + ext for ext in (".json", ".md") if os.path.exists(stem + ext)]
    if existing and not args.force:
        print(f"bench/model.py: not overwriting {', '.join(existing)}; pass --force to replace "
              f"it", file=sys.stderr)
        return 1
    if not os.path.isdir(args.results_dir):
        print(f"bench/model.py: --results-dir {args.results_dir} is not a folder",
              file=sys.stderr)
        return 2
    reason = executor.host_compiler_reason()
    if reason:
        print(f"bench/model.py: the CPU executor needs a host compiler: {reason}",
              file=sys.stderr)
        return 1
    nvrtc = cudacpu.real_nvrtc()
    if nvrtc is not None:
        from gpumodel import sass
        try:
            sass.nvdisasm()
        except FileNotFoundError as e:
            print(f"bench/model.py: {e}", file=sys.stderr)
            return 1
    cudacpu.install()
    start = time.perf_counter()
    models = benchmodel.model_suite(cases, nvrtc, sites=args.sites)
    meta = {"date": datetime.date.today().isoformat(), "modeled_not_measured": HEADER,
            "constants": constants(), "wall_seconds": time.perf_counter() - start,
            "host": f"{os.cpu_count()} CPU cores ({platform.machine()})",
            "registers": ("ptxas -v for sm_90 through CuPy's NVRTC" if nvrtc is not None else
                          "unknown (CuPy's NVRTC not importable): occupancy from threads "
                          "and blocks only"),
            "batching": ("nvdisasm of the same compile: global loads (LDG) in runs that end "
                         "at the first wait for one" if nvrtc is not None else
                         "unknown (CuPy's NVRTC not importable): rounds from the trace only, "
                         "as if every load were batched")}
    text = markdown(models, meta)
    print(text)
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "cases": [case_row(m) for m in models]}, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
