"""Every example in the README and in ``docs/`` runs as written (a ``>>>`` block as a doctest
that prints what it shows), some with a check of what it computed against an independent
reference; the model tables in ``docs/performance.md`` are those their results file renders.
"""
from __future__ import annotations

import doctest
import json
import pathlib
import re

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import gpupool

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Optional libraries an example may import; without one, its examples skip.
OPTIONAL = ("torch", "jax", "dask")


def examples(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(heading, code)`` of each ```` ```python ```` block of ``path``, under the nearest
    heading above it."""
    found, heading = [], path.name
    for part in re.split(r"^(```python\n.*?^```)", path.read_text(), flags=re.M | re.S):
        if part.startswith("```python"):
            found.append((heading, part[len("```python\n"):-3]))
        else:
            headings = re.findall(r"^#+ (.*)$", part, re.M)
            heading = headings[-1] if headings else heading
    return found


CASES = [pytest.param(path, heading, code, id=f"{path.relative_to(ROOT)}: {heading} {i}")
         for path in DOCUMENTS for i, (heading, code) in enumerate(examples(path))]


def scaled_pyramid(code: str) -> str:
    """The Dask pyramid at 256x256 tiles of 64 instead of 32768x32768 ones of 4096."""
    assert "(4096,) * 8" in code and "> 512" in code
    return code.replace("(4096,) * 8", "(64,) * 4").replace("> 512", "> 16")


def check_pyramid(scope):
    assert scope["smallest"].shape == (1, 3, 16, 16)
    expected = scope["image"].compute()
    for checksum in scope["checksums"]:
        expected = gpupool.avg_pool(expected, 2)
        assert checksum == pytest.approx(expected.sum(dtype=np.float64), rel=1e-9)
    assert_array_equal(scope["smallest"], expected)


def check_torch_operators(scope):
    import torch
    import torch.nn.functional as F
    want = torch.autograd.functional.hessian(lambda t: F.lp_pool2d(t, 2, 2).sum(), scope["x"])
    torch.testing.assert_close(scope["hessian"], want)
    assert "gpupool.max_pool" in str(scope["program"].graph)


def check_autograd(scope):
    assert scope["t"].grad.shape == (8, 64, 56, 56) and scope["dx"].shape == (8, 64, 56, 56)


def check_jax(scope):
    import jax
    import jax.numpy as jnp
    x = scope["x"][0, 0, :4, :4]
    lp = lambda v: jnp.sqrt(jax.lax.reduce_window(v * v, 0.0, jax.lax.add, (2, 2), (2, 2),
                                                 "VALID")).sum()
    np.testing.assert_allclose(scope["hessian"], jax.hessian(lp)(x), rtol=1e-5, atol=1e-5)


def check_gradients(scope):
    assert scope["dx"].shape == scope["x"].shape == (8, 64, 56, 56)


def check_readme(scope):
    x, y, idx = scope["x"], scope["y"], scope["idx"]
    windows = x.reshape(8, 64, 56, 2, 56, 2).max(axis=(3, 5))
    assert_array_equal(y, windows)
    assert_array_equal(np.take_along_axis(x.reshape(8, 64, -1), idx.reshape(8, 64, -1), -1),
                       y.reshape(8, 64, -1))
    assert scope["g"].shape == (8, 1, 1, 64) and scope["dx"].shape == x.shape


#: Per (document, heading): the rewrite an example needs to run in a test's time, and a check
#: of its results.
ADAPT = {("dask.md", "Dask arrays"): scaled_pyramid}
CHECK = {("dask.md", "Dask arrays"): check_pyramid,
         ("frameworks.md", "PyTorch operators: torch.compile, export, higher derivatives"):
             check_torch_operators,
         ("frameworks.md", "Autograd: PyTorch and JAX"): check_autograd,
         ("frameworks.md", "JAX"): check_jax,
         ("api.md", "Gradients (backward ops)"): check_gradients,
         ("README.md", "Example"): check_readme}


# PyTorch's inductor itself still calls torch.jit.script_method
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("path, heading, code", CASES)
def test_example_runs(path, heading, code):
    for module in OPTIONAL:
        if re.search(rf"^\s*(import|from) [^#\n]*\b{module}\b", code, re.M):
            pytest.importorskip(module)
    if code.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(code, {"gpupool": gpupool, "np": np},
                                                   heading, str(path), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS
                                       | doctest.NORMALIZE_WHITESPACE)
        report: list[str] = []
        runner.run(test, out=report.append)
        assert runner.failures == 0, "".join(report)
        return
    key = (path.name, heading)
    scope: dict = {}
    exec(compile(ADAPT.get(key, str)(code), f"{path.name} ({heading})", "exec"), scope)  # noqa: S102
    if key in CHECK:
        CHECK[key](scope)


def test_every_check_names_an_example():
    present = {(path.name, heading) for path, heading, _ in (c.values for c in CASES)}
    assert set(CHECK) <= present and set(ADAPT) <= present


def test_model_tables_are_rendered_from_their_results_file():
    from bench import model
    text = (ROOT / "docs" / "performance.md").read_text()
    match = re.search(r"<!-- tables: python bench/model.py --render (\S+) -->\n\n(.*?)\n"
                      r"<!-- end of tables -->", text, re.S)
    assert match, "docs/performance.md: no rendered tables"
    assert match.group(2) == model.rendered_tables(str(ROOT / match.group(1)))


def test_measured_tables_are_rendered_from_their_results_files():
    from bench import measure
    text = (ROOT / "docs" / "performance.md").read_text()
    blocks = re.findall(r"<!-- measured: (\S+) (\S+) -->\n\n(.*?)\n<!-- end of measured -->",
                        text, re.S)
    assert len(blocks) == 2, "docs/performance.md: the measured tables"
    for measured, model, table in blocks:
        runs = [json.loads((ROOT / path).read_text()) for path in (measured, model)]
        assert table == measure.compared(runs[0], runs[1:])

@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text())
    assert [t for t in targets if not (path.parent / t).exists()] == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_workflow_words(path):
    for word in ("issue", "session"):
        assert not re.search(rf"\b{word}s?\b", path.read_text(), re.I), word


def test_result_files_keep_summaries_not_samples():
    """A committed result file keeps per-case summaries (median, quartiles, extremes, count),
    not the raw timing samples that made them."""
    results = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert results
    assert [f.name for f in results if f.stat().st_size > 300_000] == []
    assert [f.name for f in results if '"raw_times_s"' in f.read_text()] == []
