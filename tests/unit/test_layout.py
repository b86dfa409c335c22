"""The package stays easy to read: its root holds the public API, every other module sits in the
subpackage of its concern, and no module is too long to read whole (``test_contract.py`` checks
that the exporter names no operator, ``test_imports.py`` that nothing imports in a cycle)."""

from __future__ import annotations

from pathlib import Path

import merlin_torch_serving

PACKAGE = Path(merlin_torch_serving.__file__).parent
LONGEST_MODULE = 450
#: the public API, ``python -m``, and the exception tree every subpackage raises from
ROOT_MODULES = {"__init__.py", "__main__.py", "exceptions.py"}


def test_the_package_root_holds_only_the_public_api():
    assert {path.name for path in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_no_module_of_the_package_is_over_450_lines():
    lengths = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(lengths) > 50
    assert {name: n for name, n in lengths.items() if n > LONGEST_MODULE} == {}
