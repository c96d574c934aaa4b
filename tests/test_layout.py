"""The layout rules of docs/ARCHITECTURE.md, checked on the source of the whole repo (composer_pipeline/,
assets/, resources/, tests/support/, bench/): no import cycle between modules, none between composer_pipeline's
packages, none between the top-level folders (composer_pipeline <- resources <- assets <- tests/support <- bench), no
Dagster in the domain code, the test helpers (tests.support) never imported by the
pipeline, and only composer_pipeline installed (the Dagster layer stays top-level folders of the
checkout). Imports are read statically (``import``/``from`` at any depth, lazy ones included); an
import built at run time (``importlib``, ``__import__``) is not seen."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "composer_pipeline"
# lowest first: each imports only those before it (the test helpers, tests/support, are not installed: only
# the benchmarks and the tests use them)
ROOTS = ("composer_pipeline", "resources", "assets", "tests/support", "bench")


def _modules(roots: tuple[str, ...] = ("composer_pipeline",)) -> dict[str, Path]:
    out = {}
    for root in roots:
        for p in (REPO / root).rglob("*.py"):
            parts = p.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of ``modules`` that ``name`` imports, at any depth of the file (lazy imports count)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` names a module; `from mod import func` names its module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            # `import a.b.c` of a non-module attribute: its module
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph(roots: tuple[str, ...] = ("composer_pipeline",)) -> dict[str, set[str]]:
    modules = _modules(roots)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def _unit(module: str) -> str:
    """composer_pipeline.<package or top-level module>: the unit the package graph is drawn between."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules():
    # a package's __init__ importing its own submodules (cli/__init__.py registering the subcommands)
    # is how Python packages are built, not a cycle between modules
    modules = _modules(ROOTS)
    graph = {
        n: {m for m in deps if not (modules[n].name == "__init__.py" and m.rpartition(".")[0] == n)}
        for n, deps in _graph(ROOTS).items()
    }
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for n, deps in _graph().items():
        graph.setdefault(_unit(n), set()).update(_unit(m) for m in deps if _unit(m) != _unit(n))
    graph.pop("composer_pipeline", None)  # the root package's own __init__
    for deps in graph.values():
        deps.discard("composer_pipeline")
    cycle = _cycle(graph)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle)


def test_top_level_folders_import_only_those_below():
    rank = {root.split("/")[0]: i for i, root in enumerate(ROOTS)}
    upward = sorted(
        f"{n} imports {m}"
        for n, deps in _graph(ROOTS).items()
        for m in deps
        if rank[m.split(".")[0]] > rank[n.split(".")[0]]
    )
    assert upward == [], "a folder imports one above it (cycle risk): " + "; ".join(upward)


def test_domain_code_has_no_dagster_and_never_imports_the_test_helpers():
    modules = _modules()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        names = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
        names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        # the Pipes entry point speaks the dagster_pipes protocol (a separate, dependency-free package)
        assert not [n for n in names if n.split(".")[0] == "dagster"], f"{name} imports Dagster"
        assert not [n for n in names if n.split(".")[0] in ("assets", "resources")], f"{name} imports the Dagster layer"
        assert not [n for n in names if n.split(".")[0] == "tests"], f"{name} imports a test helper (tests/support)"


def test_only_composer_pipeline_is_installed():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert cfg["tool"]["setuptools"]["packages"]["find"]["include"] == ["composer_pipeline*"]
    for layer in ("assets", "resources"):
        assert (REPO / layer / "__init__.py").is_file()  # the layout's top-level folders stay
