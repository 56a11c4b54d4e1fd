"""Float dtypes of the tests by name: NumPy's own, and bfloat16 from ml_dtypes (the type JAX
uses and PyTorch's bfloat16 maps to)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a gpupool dtype name (``"bfloat16"`` included)."""
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)
