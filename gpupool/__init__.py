"""gpupool: pooling for NumPy arrays (CPU) and CuPy arrays (CUDA kernels).

The backend follows the input: a NumPy array runs on the CPU and returns NumPy, a CuPy array
runs on its GPU and returns CuPy. PyTorch tensors and JAX arrays go the same way without
copies, through DLPack (:mod:`gpupool.interop.dlpack`), and come back as the input's kind;
the float ops and their backward ops are PyTorch operators (:mod:`gpupool.interop.torch_ops`:
autograd, ``torch.compile``, export), and JAX's transformations run through them
(:mod:`gpupool.interop.jax_ops`).
``import gpupool`` needs neither CuPy nor a GPU.
"""
import importlib as _importlib
import sys as _sys

from .ops import (adaptive_avg_pool, adaptive_max_pool, avg_pool, global_avg_pool,
                  global_max_pool, lp_pool, max_pool, max_unpool)
from .gradients import (adaptive_avg_pool_backward, adaptive_max_pool_backward,
                        avg_pool_backward, global_avg_pool_backward, global_max_pool_backward,
                        lp_pool_backward, max_pool_backward)
from . import quantized
from .interop import dlpack as _dlpack
from .interop.jax_ops import install as _install_jax
from .cuda.explain import explain
from .cpu.threads import get_num_threads, set_num_threads

_install_jax()  # JAX transformations through the float ops
# PyTorch's operators of the float ops: registered now where PyTorch is loaded (so that a
# first call inside torch.compile finds them), else by the first tensor
_dlpack.TORCH_OPERATORS = "gpupool.interop.torch_ops"
if "torch" in _sys.modules:
    _importlib.import_module(_dlpack.TORCH_OPERATORS)

__version__ = "0.1.0"
__all__ = ["max_pool", "avg_pool", "lp_pool", "global_avg_pool", "global_max_pool",
           "adaptive_avg_pool", "adaptive_max_pool", "max_unpool", "max_pool_backward",
           "avg_pool_backward", "lp_pool_backward", "global_avg_pool_backward",
           "global_max_pool_backward", "adaptive_avg_pool_backward",
           "adaptive_max_pool_backward", "quantized", "explain",
           "set_num_threads", "get_num_threads"]
