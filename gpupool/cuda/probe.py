"""Whether the CuPy backend can run here; CuPy is imported only when asked."""
from __future__ import annotations

import functools

#: What the probe compiles: a float16 kernel, so that NVRTC's library and the CUDA headers
#: the kernels include (cuda_fp16.h) are both found.
PROBE_SOURCE = """#include <cuda_fp16.h>
extern "C" __global__ void gpupool_probe(__half* x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[threadIdx.x]); }
"""


@functools.cache
def nvrtc_reason() -> str | None:
    """None when NVRTC loads and compiles :data:`PROBE_SOURCE` with the backend's options for
    the current device, else why not; found once per process."""
    from cupy.cuda import compiler

    from .kernels import compile_options
    try:
        compiler.compile_using_nvrtc(PROBE_SOURCE, compile_options())
    except Exception as e:  # noqa: BLE001 - a missing library, header or architecture
        return (f"NVRTC cannot compile a kernel ({type(e).__name__}: {str(e).strip()[:300]}); "
                f"gpupool's cuda12 and cuda13 extras install it with CuPy")
    return None


def gpu_usable() -> tuple[bool, str]:
    """(usable, reason) for the CuPy backend: CuPy imports, a GPU is there, and NVRTC
    compiles a kernel for it."""
    try:
        import cupy
    except ImportError as e:
        return False, f"CuPy not installed ({e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return False, f"no usable CUDA driver/GPU ({type(e).__name__}: {str(e)[:120]})"
    if not count:
        return False, "no GPU"
    reason = nvrtc_reason()
    return (False, reason) if reason else (True, f"{count} GPU(s)")
