"""gpupool's GPU time model: no GPU needed, and none of its figures is a measurement.

Each kernel is compiled as gpupool's CUDA backend compiles it (NVRTC, sm_90) and disassembled
(:mod:`gpumodel.sass`); it runs on the project's CPU executor (``tests/cudacpu``, the harness
the GPU tests run on), whose trace builds record every global load and store
(:mod:`gpumodel.trace`). From the trace and the machine code: memory traffic
(:mod:`gpumodel.traffic`), executed warp instructions (:mod:`gpumodel.instructions`) and the
pipes that run them (:mod:`gpumodel.pipes`), and a time on a device profile
(:mod:`gpumodel.device`) whose fitted constants come from published H200 measurements
(:mod:`gpumodel.calibration`) and from Nsight Compute's counts of gpupool's own kernels.
:mod:`gpumodel.benchmodel` applies it to the benchmark suite.

A development tool, not part of the wheel: it needs the executor in ``tests/`` (put on
``sys.path`` below when this checkout's ``tests`` holds it) and a host C++ compiler.
"""
from __future__ import annotations

import sys
from pathlib import Path

#: The folder holding the CPU executor package ``cudacpu`` (the test harness).
HARNESS = Path(__file__).resolve().parent.parent / "tests"

if (HARNESS / "cudacpu").is_dir() and str(HARNESS) not in sys.path:
    sys.path.append(str(HARNESS))
