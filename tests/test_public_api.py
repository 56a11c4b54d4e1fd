"""The public API as its docstrings and docs/api.md describe it: every docstring example runs
and prints what it shows, and every public function is annotated.

Examples run as a reader types them after ``import numpy as np`` and ``from gpupool import
*``: NumPy as ``np`` and gpupool's public names in scope, the module's own names over them
(``gpupool.quantized``'s ``max_pool`` is its own).
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import numpy as np

import gpupool
from gpupool import quantized

MODULES = sorted(m.name for m in pkgutil.walk_packages(gpupool.__path__, "gpupool."))


def test_every_docstring_example_runs():
    """Regression: no test ran the examples, and explain's had rotted (it showed output
    that explain no longer starts with); max_pool_backward's needs gpupool's max_pool,
    which its own module does not import, hence gpupool's public names in scope."""
    public = {name: getattr(gpupool, name) for name in gpupool.__all__}
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for name in MODULES:
        module = importlib.import_module(name)
        globs = {"np": np, **public, **vars(module)}
        for test in doctest.DocTestFinder().find(module, name, globs=globs):
            runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
    assert runner.tries >= 26  # the examples are found


def test_every_public_function_is_annotated():
    """docs/api.md: every public function is annotated (``gpupool.explain`` was not)."""
    missing = []
    for module in (gpupool, quantized):
        for name in module.__all__:
            func = getattr(module, name)
            if not inspect.isfunction(inspect.unwrap(func)):
                continue
            signature = inspect.signature(func)
            missing += [f"{module.__name__}.{name}({p})" for p, param in
                        signature.parameters.items() if param.annotation is param.empty]
            if signature.return_annotation is signature.empty:
                missing.append(f"{module.__name__}.{name} -> ?")
    assert not missing
