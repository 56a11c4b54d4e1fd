"""The README's set-up, the packaging metadata and the public API's annotations."""
from __future__ import annotations

import inspect
import pathlib
import re
import sys
import typing

import pytest

import gpupool
from gpupool import arrays, quantized

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

SETUP_COMMANDS = [
    'pip install ".[cuda13,bench]" && gpupool bench',
    'pip install -e ".[test,cuda13]" && python -m pytest -q',
]


def section(title_start: str) -> str:
    """The text of the ``## `` section whose title starts with ``title_start``."""
    match = re.search(rf"^## {re.escape(title_start)}.*?$(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, title_start
    return match.group(1)


def test_setup_section_has_exactly_the_two_commands():
    setup = section("Set-up")
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", setup, re.M | re.S)
    assert [b.strip() for b in blocks] == SETUP_COMMANDS
    # the CPU-only install is offered right after the main command, as prose, not a block
    between = setup[setup.index(SETUP_COMMANDS[0]):setup.index(SETUP_COMMANDS[1])]
    assert "`pip install .`" in between and "100 MB" in between and "660 MB" in between
    assert "`pip install torch`" in between


def test_license_is_mit_and_packaged():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 gpupool developers" in text
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    assert "LICENSE" in pyproject["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]


def _public_functions():
    for name in gpupool.__all__:
        obj = getattr(gpupool, name)
        if inspect.isfunction(obj):
            yield f"gpupool.{name}", obj
    for name in quantized.__all__:
        obj = getattr(quantized, name)
        if inspect.isfunction(obj):
            yield f"gpupool.quantized.{name}", obj
        elif inspect.isclass(obj):
            yield f"gpupool.quantized.{name}", obj.__init__


def _resolve(annotation: str, func):
    """An annotation string evaluated in its module (the CuPy forward reference stays one)."""
    return eval(annotation, vars(sys.modules[func.__module__]))  # noqa: S307 - our own code


@pytest.mark.parametrize("name, func", list(_public_functions()), ids=lambda v: str(v))
def test_public_functions_are_annotated(name, func):
    sig = inspect.signature(func)
    assert sig.return_annotation is not inspect.Signature.empty, name
    for param in sig.parameters.values():
        assert "Any" not in str(param.annotation), (name, param.name)
    for array_param in ("x", "data", "indices"):
        if array_param in sig.parameters:
            resolved = _resolve(sig.parameters[array_param].annotation, func)
            assert resolved is arrays.ArrayLike, (name, array_param)
            assert typing.Any not in typing.get_args(resolved)


def test_array_aliases_name_numpy_and_cupy_without_importing_cupy():
    import numpy as np
    for alias in (arrays.Array, arrays.ArrayLike):
        args = typing.get_args(alias)
        assert np.ndarray in args
        assert typing.ForwardRef("cupy.ndarray") in args
        assert typing.Any not in args
