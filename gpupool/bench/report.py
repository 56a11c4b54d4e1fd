"""The results: a case's :class:`Row`, the per-row summaries and suite geomeans, the Markdown
tables and the plot, and the output paths (checked before a run)."""
from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Row:
    """What one case gave: its checks, raw times, missing baselines, or its error."""
    case: str
    backend: str
    shape: tuple
    dtype: str
    layout: str
    bytes: int = 0
    check: str = "unchecked"  # "ok (vs ...)" or each failed check
    checks: dict = field(default_factory=dict)  # reference name -> "ok" or "FAILED: ..."
    first_call_s: float | None = None
    times_s: dict = field(default_factory=dict)  # name -> raw times
    missing: dict = field(default_factory=dict)  # baseline -> reason
    error: str | None = None
    torch_threads: int | None = None  # the thread count of PyTorch's faster median (CPU)

    def median(self, name: str) -> float | None:
        t = self.times_s.get(name)
        return float(np.median(t)) if t else None


def spread(samples) -> dict:
    """What a results file keeps of a timing's samples (seconds): their count, median,
    quartiles and extremes."""
    q = np.percentile(np.asarray(samples, dtype=np.float64), [0, 25, 50, 75, 100])
    return {"n": len(samples), "median": float(q[2]), "q1": float(q[1]), "q3": float(q[3]),
            "min": float(q[0]), "max": float(q[4])}


def spreads(times_s: dict) -> dict:
    """:func:`spread` of each library's samples."""
    return {name: spread(t) for name, t in times_s.items() if t}


def summarise(rows: list[Row], copy_bw: float, gpu: bool) -> dict:
    """Per-row medians, GB/s, % of copy bandwidth and baseline ratios; suite geomeans."""
    table, ratios = [], {}
    for r in rows:
        entry = {"case": r.case, "shape": list(r.shape), "dtype": r.dtype, "layout": r.layout,
                 "check": r.check, "checks": r.checks, "error": r.error, "missing": r.missing,
                 "first_call_ms": None if r.first_call_s is None else round(r.first_call_s * 1e3, 2)}
        tg = r.median("gpupool")
        if tg:
            entry.update(gpupool_ms=round(tg * 1e3, 4), gbps=round(r.bytes / tg / 1e9, 2),
                         pct_copy_bw=round(100 * r.bytes / tg / copy_bw, 1))
            for name in r.times_s:
                if name != "gpupool":
                    tb = r.median(name)
                    entry[f"{name}_ms"] = round(tb * 1e3, 4)
                    entry[f"{name}_over_gpupool"] = round(tb / tg, 3)
                    if r.dtype in ("float32", "float16") and not r.error:
                        # backward rows get geomeans of their own, beside the forward suite's
                        group = r.dtype + (" backward" if r.case.endswith(" backward") else "")
                        ratios.setdefault((group, name), []).append((r.case, tg / tb))
        if r.torch_threads is not None:
            entry["torch_threads"] = r.torch_threads
        table.append(entry)
    geo = {}
    for (dtype, name), pairs in sorted(ratios.items()):
        vals = [v for _, v in pairs]
        worst = max(pairs, key=lambda p: p[1])
        geo.setdefault(dtype, {})[name] = {
            "cases": len(vals), "geomean_gpupool_time_over_baseline":
            round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 3),
            "worst_case": worst[0], "worst_gpupool_time_over_baseline": round(worst[1], 3)}
    return {"rows": table, "summary": geo}


def summarise_overhead(rows: list[Row]) -> dict:
    """Per-row median microseconds per call and each other time over gpupool's on the NumPy
    (CuPy) array (a ``_loop`` time over gpupool's loop time)."""
    table = []
    for r in rows:
        entry = {"case": r.case, "shape": list(r.shape), "dtype": r.dtype, "check": r.check,
                 "checks": r.checks, "error": r.error, "missing": r.missing,
                 "times_s": spreads(r.times_s)}
        for name in r.times_s:
            entry[f"{name}_us"] = round(r.median(name) * 1e6, 2)
        for name in r.times_s:
            own = "gpupool_loop" if name.endswith("_loop") else "gpupool"
            if name != own and r.times_s.get(own):
                entry[f"{name}_over_gpupool"] = round(r.median(name) / r.median(own), 3)
        if r.torch_threads is not None:
            entry["torch_threads"] = r.torch_threads
        table.append(entry)
    return {"rows": table}


_OWN = ("gpupool", "gpupool_loop")  # the times the others are set against


def overhead_markdown(result: dict) -> str:
    """The overhead section's table: microseconds per warm call."""
    rows = result["overhead"]["rows"]
    names = sorted({k[:-3] for r in rows for k in r if k.endswith("_us")},
                   key=lambda n: (not n.startswith("gpupool"), n))
    head = ["case", "shape", "dtype"] + [f"{n} us" + ("" if n in _OWN else " (x)")
                                         for n in names] + ["check"]
    lines = ["### Fixed cost per call", "",
             "Warm calls on tiny inputs, median microseconds per call"
             + (" (GPU: `X` = host time of one call, launches queued; `X_loop` = a loop of "
                "calls ended by one device sync, per call)" if result["backend"] == "cupy"
                else " (`gpupool_tensor`: gpupool on a CPU PyTorch tensor over the same memory; "
                "`_grad`: the tensor requires grad, for PyTorch's op too)")
             + "; (x) = time / gpupool time (gpupool_loop's for `_loop`).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"]]
        if r.get("error"):
            cells += [f"error: {r['error']}"] + [""] * (len(head) - 4)
        else:
            for n in names:
                if f"{n}_us" not in r:
                    cells.append(f"missing: {r['missing'].get(n.removesuffix('_loop'), 'n/a')}")
                elif n in _OWN:
                    cells.append(f"{r[n + '_us']:.1f}")
                else:
                    cells.append(f"{r[n + '_us']:.1f} ({r[n + '_over_gpupool']:.2f}x)")
            cells.append(r["check"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    """The suite's table and a line per geomean."""
    names = sorted({k[:-3] for row in result["rows"] for k in row
                    if k.endswith("_ms") and k not in ("gpupool_ms", "first_call_ms")})
    head = ["case", "shape", "dtype", "layout", "gpupool ms", "GB/s", "% copy bw"] + \
           [f"{n} ms (x)" for n in names] + ["first call ms", "check"]
    lines = [f"**{result['device']}**, backend `{result['backend']}`, size `{result['size']}`, "
             f"copy bandwidth {result['copy_bw_gbps']} GB/s (measured in this run); "
             f"(x) = baseline time / gpupool time, > 1 means gpupool is faster.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        if r.get("error"):
            cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"], r["layout"],
                     f"error: {r['error']}"] + [""] * (len(head) - 5)
        else:
            cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"], r["layout"],
                     f"{r['gpupool_ms']:.3f}", f"{r['gbps']:.1f}", f"{r['pct_copy_bw']:.0f}"]
            for n in names:
                cells.append(f"{r[n + '_ms']:.3f} ({r[n + '_over_gpupool']:.2f}x)" if n + "_ms" in r
                             else f"missing: {r['missing'].get(n, 'n/a')}")
            cells += [str(r["first_call_ms"]), r["check"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if any("torch_threads" in r for r in result["rows"]):
        lines.append("- torch: the faster of 1 thread and every core, per case (JSON: "
                     "`torch_threads`)")
    for dtype, per_baseline in result["summary"].items():
        for name, s in per_baseline.items():
            lines.append(f"- {dtype} vs {name}: geomean gpupool time / {name} time = "
                         f"{s['geomean_gpupool_time_over_baseline']} over {s['cases']} cases; "
                         f"worst {s['worst_gpupool_time_over_baseline']} ({s['worst_case']})")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    """A bar chart of each case's GB/s per library, against the copy bandwidth, saved to
    ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if "gbps" in r]
    names = ["gpupool"] + sorted({k[:-3] for r in rows for k in r if k.endswith("_ms")
                                  and k not in ("gpupool_ms", "first_call_ms")})
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.8), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        gbps = [r["bytes"] / (r[f"{name}_ms"] / 1e3) / 1e9 if f"{name}_ms" in r else 0
                for r in rows] if name != "gpupool" else [r["gbps"] for r in rows]
        ax.bar(np.arange(len(rows)) + i * width, gbps, width, label=name)
    ax.axhline(result["copy_bw_gbps"], color="k", linestyle="--", label="copy bandwidth")
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [r["case"] for r in rows],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"gpupool bench ({result['device']}, {result['backend']}, {result['size']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def output_options(json_path=None, markdown_path=None, plot_path=None) -> dict:
    """The output paths by the ``gpupool bench`` option that gives them."""
    return {"--json": json_path, "--markdown": markdown_path, "--plot": plot_path}


def check_output_path(option: str, path: str) -> None:
    """``ValueError`` naming ``option`` and ``path`` when the file cannot be written: a
    directory, a missing folder, no permission, a device that refuses writes (/dev/full).
    Nothing is left behind: a missing file is created, written one byte and removed; an
    existing one is opened for appending and written zero bytes, so its contents stay (a
    zero-byte write still fails on a device that refuses writes)."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path!r}: is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path!r}: {folder!r} is not an existing folder")
    existed = os.path.exists(path)
    try:
        with open(path, "ab", buffering=0) as f:
            f.write(b"" if existed else b"\0")
    except OSError as e:
        raise ValueError(f"{option} {path!r}: cannot be written ({e.strerror or e})") from e
    finally:
        if not existed and os.path.exists(path):
            os.remove(os.path.realpath(path))


def require_matplotlib() -> None:
    """``ImportError`` saying how to install matplotlib, which ``--plot`` needs."""
    try:
        importlib.import_module("matplotlib")
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib, which is not installed ({e}): "
                          f"pip install \"gpupool[bench]\" (or pip install matplotlib)") from e
