"""The public API as a user's type checker sees it: mypy, configured in pyproject.toml, checks
the modules that define it and ``tests/typed_usage.py`` (each op's own signature, a max pool's
result type following ``return_indices``, a wrong keyword or type reported)."""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_sees_every_signature(monkeypatch):
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # the configuration names its files from the project's root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                      "--no-incremental"])
    assert status == 0, stdout + stderr
