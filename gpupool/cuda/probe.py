"""Whether the CuPy backend can run here; CuPy is imported only when asked."""
from __future__ import annotations


def gpu_usable() -> tuple[bool, str]:
    """(usable, reason) for the CuPy backend."""
    try:
        import cupy
    except ImportError as e:
        return False, f"CuPy not installed ({e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return False, f"no usable CUDA driver/GPU ({type(e).__name__}: {str(e)[:120]})"
    return (True, f"{count} GPU(s)") if count else (False, "no GPU")
