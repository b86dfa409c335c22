"""No module of the package imports itself back through other modules: data flows one way.

Every import counts, wherever it is written (module level, inside functions, under
``TYPE_CHECKING``): a cycle hidden in a function or a type hint is still two modules that each
need the other to be understood.
"""

from __future__ import annotations

import ast
from pathlib import Path

import merlin_torch_serving

PACKAGE = Path(merlin_torch_serving.__file__).parent
ROOT = PACKAGE.name


def package_modules() -> dict[str, Path]:
    """``dotted.name -> file`` of every module of the package (a package by its ``__init__``)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports: ``from a import b`` names module ``a.b`` when
    there is one, else ``a``; relative imports are resolved against the importing module."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            while (
                name and name not in modules
            ):  # `import a.b.c` of a module a.b.c, or of a name in a.b
                name = name.rpartition(".")[0]
            if name.split(".")[0] == ROOT and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {module: imported_modules(module, path, modules) for module, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as the modules along it (first == last), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_imports_inside_functions_and_of_packages():
    graph = import_graph()
    # a function-level import (Ensemble.export) and a package-level one
    assert f"{ROOT}.export.repository" in graph[f"{ROOT}.graph.ensemble"]
    assert f"{ROOT}.ops.base" in graph[f"{ROOT}.ops"]
    # and it finds a cycle when there is one
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_checker_resolves_relative_and_type_checking_imports(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import plan\n"
        "from ..data import wire\n"
        "from ..export import manifest\n"
        "if TYPE_CHECKING:\n"
        "    from merlin_torch_serving.client.health import ModelHealth\n"
        "def later():\n"
        "    import merlin_torch_serving.export.config\n"
    )
    found = imported_modules(f"{ROOT}.graph.module", source, package_modules())
    assert found == {
        f"{ROOT}.graph.plan",
        f"{ROOT}.data.wire",
        f"{ROOT}.client.health",
        f"{ROOT}.export.manifest",
        f"{ROOT}.export.config",
    }
