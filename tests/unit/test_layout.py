"""The package's shape stays easy to read: modules short enough to read whole, and an exporter that
knows operators only through their contract (``ops/base.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import merlin_torch_serving
from merlin_torch_serving import ops
from merlin_torch_serving.ops.base import ServingOperator

PACKAGE = Path(merlin_torch_serving.__file__).parent
LONGEST_MODULE = 450


def test_no_module_of_the_package_is_over_450_lines():
    lengths = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(lengths) > 50
    assert {name: n for name, n in lengths.items() if n > LONGEST_MODULE} == {}


def _concrete_operator_names() -> set[str]:
    found = {
        name
        for name in dir(ops)
        if isinstance(getattr(ops, name), type)
        and issubclass(getattr(ops, name), ServingOperator)
        and getattr(ops, name) is not ServingOperator
    }
    assert {"PredictPytorch", "TopK", "RetrieveTopK", "TransformWorkflow"} <= found
    return found


def test_export_names_no_concrete_operator_class():
    concrete = _concrete_operator_names()
    named = {}
    for path in (PACKAGE / "export").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        names |= {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        if names & concrete:
            named[path.name] = sorted(names & concrete)
    assert named == {}
