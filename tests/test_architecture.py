"""The package's layout rules, read from the source: no import cycle among its modules (late
imports and ``importlib.import_module`` of a package module count), no module using another
module's ``_private`` name, no module over 600 lines."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpupool"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = package[:len(package) - node.level + is_package]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str):
    """``(imported module, alias bound or None, names taken from it)`` for every import in
    ``module``, at any depth, and every string that names a package module (what
    ``importlib.import_module`` is given)."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, a.asname or (None if "." in a.name else a.name), ()
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in MODULES:  # `from pkg import module`
                    yield sub, a.asname or a.name, ()
                else:
                    yield source, None, (a.name,)
        elif isinstance(node, ast.Constant) and node.value in MODULES and "." in node.value:
            yield node.value, None, ()  # a module name for importlib, e.g. a backend's


def _graph() -> dict[str, set[str]]:
    return {m: {target for target, _, _ in _imports(m) if target in MODULES and target != m}
            for m in MODULES}


def test_the_rules_see_the_package():
    graph = _graph()
    assert {"gpupool.cpu.entry_points", "gpupool.interop.dask"} <= graph["gpupool.backends"]
    assert "gpupool.spec" in graph["gpupool.cpu.numpy_backend"]
    assert "gpupool.cuda.planner" in graph["gpupool.cuda.forward"]  # `from . import planner`


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_of_another_module(module):
    """Neither ``from gpupool.x import _name`` nor ``x._name`` on a package module bound by
    an import."""
    aliases, used = {}, []
    for target, alias, names in _imports(module):
        if target in MODULES and target != module:
            if alias:
                aliases[alias] = target
            used += [f"{target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            used.append(f"{aliases[node.value.id]}.{node.attr}")
    assert not used, f"{module} uses private names of other modules: {sorted(set(used))}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_600_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


@pytest.mark.parametrize("name", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_every_backend_implements_the_contract(name):
    """Each backend object has every method of :class:`gpupool.backends.Backend`, each with
    the contract's parameters (names, kinds and defaults) in its order."""
    import inspect

    from gpupool import backends
    backend = backends.load(name)
    assert isinstance(backend, backends.Backend)
    contract = [n for n, v in vars(backends.Backend).items()
                if inspect.isfunction(v) and not n.startswith("_")]
    assert len(contract) >= 11
    extra = [n for n, v in vars(type(backend)).items()
             if not n.startswith("_") and n not in contract]
    assert extra == [], f"{name}: methods outside the contract"
    for method in contract:
        want = list(inspect.signature(getattr(backends.Backend, method)).parameters.values())[1:]
        got = list(inspect.signature(getattr(backend, method)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in got] == \
            [(p.name, p.kind, p.default) for p in want], f"{name}.{method}"


#: where a collection of op names is not a list of ops: the export lists (``__all__``) and the
#: CUDA backend's kernel tables (kernels are named after their ops)
OP_NAMES_ALLOWED = {"gpupool.cuda.names"}


def test_no_op_list_outside_the_op_table():
    """An op's family, reduction, options, operand and gradient are rows of
    :mod:`gpupool.op_table`; no other module keeps a list, set or table of op names."""
    from gpupool.op_table import BY_NAME
    found = []
    for module, path in MODULES.items():
        if module in OP_NAMES_ALLOWED | {"gpupool.op_table"}:
            continue
        tree = ast.parse(path.read_text())
        exports = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "__all__" for t in node.targets)}
        for node in ast.walk(tree):
            if id(node) in exports:
                continue
            items = (node.keys if isinstance(node, ast.Dict) else
                     node.elts if isinstance(node, (ast.Set, ast.Tuple, ast.List)) else [])
            names = [i.value for i in items if isinstance(i, ast.Constant) and i.value in BY_NAME]
            if len(names) >= 2:
                found.append(f"{module}:{node.lineno} {names}")
    assert found == []
