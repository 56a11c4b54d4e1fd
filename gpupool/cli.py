"""The gpupool command: gpupool info and gpupool bench."""
from __future__ import annotations

import argparse
import os
import sys

import gpupool

DESCRIPTION = ("gpupool: pooling for NumPy arrays (CPU) and CuPy arrays (CUDA kernels). "
               "'gpupool info' reports the version, the usable backends and the device; "
               "'gpupool bench' runs the benchmark suite.")

BENCH_DESCRIPTION = (
    "Run the benchmark suite: real layer shapes, each checked and then timed, on the GPU when "
    "one is usable, else on the CPU, then the fixed cost of a warm call on tiny inputs (the "
    "overhead section). The tables go to stdout, a progress bar to stderr. "
    "Baselines appear as columns when installed: PyTorch (pip install torch), onnxruntime on "
    "the CPU and plain CuPy on the GPU (pip install \"gpupool[bench]\" also gives the progress "
    "bar and --plot).")


def cuda_version(version: int) -> str:
    """CUDA's integer version (1000 * major + 10 * minor) as "major.minor": 13020 -> "13.2"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def info() -> None:
    """Version, which backends are usable (and why not), device, CuPy/CUDA versions, cache."""
    print(f"gpupool {gpupool.__version__} ({os.path.dirname(gpupool.__file__)})")
    from .cpu.threads import ENV_VAR, available_cpus, get_num_threads
    print(f"backend numpy: usable, {get_num_threads()} threads ({available_cpus()} CPUs "
          f"available; {ENV_VAR} or gpupool.set_num_threads to change)")
    try:
        import cupy
    except ImportError as e:
        print(f"backend cupy: not usable: CuPy is not installed ({e}); "
              f"pip install 'gpupool[cuda13]' (or [cuda12])")
        return
    from .cuda.probe import gpu_usable
    usable, reason = gpu_usable()
    print(f"backend cupy: {'usable' if usable else 'not usable'}: {reason}")
    print(f"cupy {cupy.__version__}, CUDA runtime "
          f"{cuda_version(cupy.cuda.runtime.runtimeGetVersion())}")
    try:
        print(f"NVRTC {'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        print(f"NVRTC: not loadable ({type(e).__name__}: {str(e)[:100]})")
    if usable:
        dev = cupy.cuda.runtime.getDevice()
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"device {dev}: {name}, {props['multiProcessorCount']} SMs, compute capability "
              f"{props['major']}.{props['minor']}, driver "
              f"{cuda_version(cupy.cuda.runtime.driverGetVersion())}")
    from .cuda.kernels import cache_dir
    print(f"kernel cache: {cache_dir()} (set GPUPOOL_CACHE_DIR to move it)")


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``gpupool`` parser and its ``bench`` subparser."""
    from .bench import OPS
    top = argparse.ArgumentParser(prog="gpupool", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"gpupool {gpupool.__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="versions, usable backends, device, kernel cache",
                   description="Print the gpupool version, which backends are usable (and why "
                               "not), the device, the CuPy/CUDA/NVRTC versions and the kernel "
                               "cache directory.")
    bench = sub.add_parser("bench", help="run the benchmark suite (GPU when usable, else CPU)",
                           description=BENCH_DESCRIPTION)
    bench.add_argument("--size", choices=("small", "large"), default="small",
                       help="small: N=4 per case; large: inputs of at least 256 MiB "
                            "(default: small)")
    bench.add_argument("--ops", nargs="+", default=None, metavar="OP_OR_NAME",
                       help=f"only the cases whose op ({', '.join(OPS)}) is given or whose name "
                            f"contains one of these strings (default: every case)")
    bench.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                       help="auto: the GPU when CuPy sees one, else the CPU; numpy: the CPU; "
                            "cupy: the GPU, an error without one (default: auto)")
    bench.add_argument("--json", metavar="PATH",
                       help="write raw times, device, versions and commit here")
    bench.add_argument("--markdown", metavar="PATH", help="write the Markdown table here")
    bench.add_argument("--plot", metavar="PATH",
                       help="write a PNG plot of GB/s per case here (needs matplotlib: "
                            "pip install \"gpupool[bench]\")")
    return top, bench


def error(message: str) -> int:
    """Report a problem found before anything runs, on one line of stderr; the exit status
    of a usage error (2)."""
    print(message, file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except BrokenPipeError:  # the reader left (gpupool info | head -1): stop without a trace
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # for the exit flush
        return 1


def _command(argv: list[str] | None) -> int:
    top, bench = parsers()
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help(sys.stderr)
        return 2
    from .cpu.threads import get_num_threads
    try:  # GPUPOOL_NUM_THREADS, read by both commands
        get_num_threads()
    except ValueError as e:
        return error(str(e))
    if args.command == "info":
        info()
        return 0
    from . import bench as benchmark
    try:  # every argument problem is reported before anything runs
        benchmark.preflight(args.ops, benchmark.output_options(args.json, args.markdown,
                                                               args.plot))
    except (ValueError, ImportError) as e:
        return error(f"gpupool bench: error: {e}")
    result = benchmark.run(args.size, args.ops, args.backend, args.json, args.markdown,
                           args.plot)
    failed = [r["case"] for r in result["rows"] + result["overhead"]["rows"]
              if r.get("error") or "FAILED" in r["check"]]
    if failed:
        print(f"gpupool bench: {len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
