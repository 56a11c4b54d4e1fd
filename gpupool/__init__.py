"""gpupool: pooling for NumPy arrays (CPU) and CuPy arrays (CUDA kernels).

The backend follows the input: a NumPy array runs on the CPU and returns NumPy, a CuPy array
runs on its GPU and returns CuPy. PyTorch tensors and JAX arrays go the same way without
copies, through DLPack (:mod:`gpupool.interop.dlpack`), and come back as the input's kind;
through the float ops gradients flow in PyTorch's autograd (:mod:`gpupool.interop.autograd`)
and JAX's transformations (:mod:`gpupool.interop.jax_ops`).
``import gpupool`` needs neither CuPy nor a GPU.
"""
from .ops import (adaptive_avg_pool, adaptive_max_pool, avg_pool, global_avg_pool,
                  global_max_pool, lp_pool, max_pool, max_unpool)
from .gradients import (adaptive_avg_pool_backward, adaptive_max_pool_backward,
                        avg_pool_backward, global_avg_pool_backward, global_max_pool_backward,
                        lp_pool_backward, max_pool_backward)
from . import quantized
from .interop.autograd import install as _install_gradients
from .interop.jax_ops import install as _install_jax
from .cuda.explain import explain
from .cpu.threads import get_num_threads, set_num_threads

_install_gradients()  # PyTorch autograd through the float ops
_install_jax()  # JAX transformations through the float ops

__version__ = "0.1.0"
__all__ = ["max_pool", "avg_pool", "lp_pool", "global_avg_pool", "global_max_pool",
           "adaptive_avg_pool", "adaptive_max_pool", "max_unpool", "max_pool_backward",
           "avg_pool_backward", "lp_pool_backward", "global_avg_pool_backward",
           "global_max_pool_backward", "adaptive_avg_pool_backward",
           "adaptive_max_pool_backward", "quantized", "explain",
           "set_num_threads", "get_num_threads"]
