"""Benchmark suite behind ``gpupool bench``: real layer shapes, gpupool against every baseline
that is installed, all measured in one run next to the device's own copy bandwidth.

Every case is checked before it is timed; baselines that are not installed are reported as
missing. Heavy imports (torch, onnxruntime, matplotlib, tqdm) happen only when a run needs them.

- :mod:`.cases`: the cases, their inputs and the gpupool call each times
- :mod:`.baselines`: PyTorch, onnxruntime and plain CuPy on the same data
- :mod:`.checks`: comparing results, and the float64 reference
- :mod:`.timing`: host and GPU timers, the copy bandwidth
- :mod:`.runner`: checking and timing each case, the whole run
- :mod:`.report`: a case's row, the summaries, Markdown, plot and output paths
"""
from .cases import OPS, batch_size, gpupool_call, make_input, output_bytes, select_cases
from .report import output_options
from .runner import preflight, run

__all__ = ["OPS", "batch_size", "gpupool_call", "make_input", "output_bytes", "select_cases",
           "output_options", "preflight", "run"]
