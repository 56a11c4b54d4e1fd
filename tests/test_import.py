"""``import gpupool`` needs neither CuPy, a GPU nor ml_dtypes, and imports no Dask."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gpupool


def run_fresh(code: str) -> str:
    """Standard output of ``code`` run by a fresh interpreter on this checkout, warnings as
    errors; the test fails on a non-zero exit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(gpupool.__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_import_and_pool_numpy_without_cupy():
    code = textwrap.dedent("""
        import sys
        sys.modules["cupy"] = None  # any "import cupy" now raises ImportError
        sys.modules["ml_dtypes"] = None  # bfloat16's NumPy type: only for bfloat16 tensors
        import numpy as np
        import gpupool
        y = gpupool.max_pool(np.arange(16.0).reshape(1, 1, 4, 4), 2)
        assert y.tolist() == [[[[5.0, 7.0], [13.0, 15.0]]]], y
        y = gpupool.avg_pool(np.ones((2, 4, 4, 3), np.float32), 2, layout="NHWC")
        assert y.shape == (2, 2, 2, 3)
        assert sys.modules["cupy"] is None
        assert not any(m.split(".")[0] == "dask" for m in sys.modules)  # Dask: only on use
        print("ok")
    """)
    assert run_fresh(code) == "ok"


def test_import_and_pool_do_not_import_torch_or_jax():
    """PyTorch and JAX are reached only through a tensor's type, never imported by gpupool."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import gpupool, gpupool.interop.dlpack
        gpupool.max_pool(np.ones((1, 1, 4, 4)), 2)
        print(sorted(m for m in ("torch", "jax", "jaxlib", "cupy", "dask", "threadpoolctl")
                     if m in sys.modules))
    """)
    assert run_fresh(code) == "[]"
