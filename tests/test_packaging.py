"""The wheel holds what an installed gpupool needs: the package, and the CUDA kernels, which
live at the project's root (``kernels_cu/``), inside the package where the backend finds them."""
from __future__ import annotations

import pathlib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_ships_the_kernels_inside_the_package(tmp_path):
    wheel_builder = pytest.importorskip("hatchling.builders.wheel")
    builder = wheel_builder.WheelBuilder(str(ROOT))
    (wheel,) = builder.build(directory=str(tmp_path), versions=["standard"])
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "kernels_cu").iterdir())
    assert kernels and all(f"gpupool/kernels_cu/{k}" in names for k in kernels)
    assert "gpupool/cuda/kernels.py" in names
    assert not any(n.startswith(("tests/", "gpumodel/", "bench/", "kernels_cu/")) for n in names)
