"""The ``gpupool`` command: ``gpupool info`` and ``gpupool bench``."""
from __future__ import annotations

import argparse
import os
import sys

import gpupool


def info() -> None:
    """Version, which backends are usable (and why not), device, CuPy/CUDA versions, cache."""
    print(f"gpupool {gpupool.__version__} ({os.path.dirname(gpupool.__file__)})")
    print("backend numpy: usable")
    try:
        import cupy
    except ImportError as e:
        print(f"backend cupy: not usable: CuPy is not installed ({e}); "
              f"pip install 'gpupool[cuda13]' (or [cuda12])")
        return
    from .benchmark import gpu_usable
    usable, reason = gpu_usable()
    print(f"backend cupy: {'usable' if usable else 'not usable'}: {reason}")
    print(f"cupy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
    try:
        print(f"NVRTC {'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        print(f"NVRTC: not loadable ({type(e).__name__}: {str(e)[:100]})")
    if usable:
        dev = cupy.cuda.runtime.getDevice()
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"device {dev}: {name}, {props['multiProcessorCount']} SMs, compute capability "
              f"{props['major']}.{props['minor']}, driver {cupy.cuda.runtime.driverGetVersion()}")
    from .cuda_backend import cache_dir
    print(f"kernel cache: {cache_dir()} (set GPUPOOL_CACHE_DIR to move it)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, usable backends, device, kernel cache")
    bench = sub.add_parser("bench", help="run the benchmark suite (GPU when usable, else CPU)")
    bench.add_argument("--size", choices=("small", "large"), default="small",
                       help="small: N=4 per case; large: inputs of >= 256 MiB (default small)")
    bench.add_argument("--ops", nargs="*", default=None,
                       help="only cases whose op (max avg gavg aavg qmax qavg) or name matches")
    bench.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto")
    bench.add_argument("--json", help="write raw times, device, versions and commit here")
    bench.add_argument("--markdown", help="write the Markdown table here")
    bench.add_argument("--plot", help="write a PNG plot of GB/s per case here (matplotlib)")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
        return 0
    from .benchmark import run
    result = run(args.size, args.ops, args.backend, args.json, args.markdown, args.plot)
    failed = [r["case"] for r in result["rows"] if r.get("error") or "FAILED" in r["check"]]
    if failed:
        print(f"gpupool bench: {len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
