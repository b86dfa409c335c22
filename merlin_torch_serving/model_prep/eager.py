"""Eager models on the python backend: written with ``torch.save`` (the pickle names each class
by its import path and holds the module's state) and read back in the stub with ``torch.load``.

Reading imports those classes, so an export first loads the file in a fresh Python process started
the way the launcher starts the stub (this interpreter, the same working directory, no
``PYTHONPATH``, which the stub ignores); a class that process cannot import fails the export,
named, instead of the model failing later in the server.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import torch

from merlin_torch_serving.exceptions import ExportError, ModelNotImportableError

EAGER_MODEL_FILE = "eager_model.pt"
_CHECK_TIMEOUT_S = 300.0
_UNIMPORTABLE_EXIT_CODE = 3


def save_eager_model(model: torch.nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model`` into ``directory`` and check that a fresh Python process can load it."""
    path = Path(directory) / EAGER_MODEL_FILE
    try:
        torch.save(model, path)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        # e.g. a class defined inside a function: pickle cannot name it
        raise ModelNotImportableError(
            class_path(type(model)), f"pickle cannot save it: {exc}"
        ) from exc
    check_loads_in_fresh_python(path, class_path(type(model)))
    return path


def load_eager_model(path: str | os.PathLike) -> torch.nn.Module:
    return torch.load(os.fspath(path), map_location="cpu", weights_only=False).eval()


def check_loads_in_fresh_python(path: str | os.PathLike, model_class: str) -> None:
    """Load ``path`` in a new interpreter.

    Raises ``ModelNotImportableError`` naming the class it could not import.
    """
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    try:
        result = subprocess.run(
            [sys.executable, "-m", __name__, os.fspath(path)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise ExportError(
            f"loading the eager model {model_class!r} in a fresh Python process took more than "
            f"{_CHECK_TIMEOUT_S:g} s"
        ) from exc
    if result.returncode == 0:
        return
    if result.returncode == _UNIMPORTABLE_EXIT_CODE:
        failure = json.loads(result.stdout.strip().splitlines()[-1])
        raise ModelNotImportableError(failure["class"], failure["error"])
    last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
    raise ModelNotImportableError(
        model_class, f"a fresh Python process could not load it: {last_line}"
    )


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _NamingUnpickler(pickle.Unpickler):
    """Exits with the name of the first class that cannot be imported."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception as exc:
            print(
                json.dumps({"class": f"{module}.{name}", "error": f"{type(exc).__name__}: {exc}"})
            )
            sys.exit(_UNIMPORTABLE_EXIT_CODE)


def _main(path: str) -> None:
    naming_pickle = types.SimpleNamespace(
        Unpickler=_NamingUnpickler, load=pickle.load, __name__="pickle"
    )
    torch.load(path, map_location="cpu", weights_only=False, pickle_module=naming_pickle)


if __name__ == "__main__":
    _main(sys.argv[1])
