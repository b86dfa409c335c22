"""Eager models on the python backend: written with ``torch.save`` and cloudpickle, read back in the
stub with ``torch.load``.

The pickle names each class by its import path, except the classes the server's Python could not
import: those of ``__main__`` (a notebook cell, a script), defined in a function, or of a module
only this process can import (a file beside the notebook, a folder added to ``sys.path``), which
cloudpickle saves by value, code and all, as Ray, Dask and MLflow do. Which modules the server
cannot import is found out by loading the file in a fresh Python process started the way the
launcher starts the stub (this interpreter, the same working directory, no ``PYTHONPATH``, which
the stub ignores): each module it fails on is saved by value in turn, and what still cannot be
loaded fails the export, named, instead of the model failing later in the server.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import torch

from merlin_torch_serving.exceptions import ExportError, ModelNotImportableError

EAGER_MODEL_FILE = "eager_model.pt"
_CHECK_TIMEOUT_S = 300.0
_UNLOADABLE_EXIT_CODE = 3
#: modules saved by value before giving up: each costs one fresh Python process
_MAX_MODULES_BY_VALUE = 8


def save_eager_model(model: torch.nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model`` into ``directory`` so that a fresh Python process loads it, saving by value
    the modules that process cannot import."""
    path = Path(directory) / EAGER_MODEL_FILE
    model_class = class_path(type(model))
    by_value: list[types.ModuleType] = []
    while True:
        _save(model, path, by_value, model_class)
        failure = _fresh_python_failure(path, model_class)
        if failure is None:
            return path
        module = sys.modules.get(failure.module or "")
        if (
            module is None
            or module in by_value
            or not _savable_by_value(module)
            or len(by_value) == _MAX_MODULES_BY_VALUE
        ):
            raise ModelNotImportableError(failure.class_path, failure.error)
        by_value.append(module)


def load_eager_model(path: str | os.PathLike) -> torch.nn.Module:
    return torch.load(os.fspath(path), map_location="cpu", weights_only=False).eval()


def check_loads_in_fresh_python(path: str | os.PathLike, model_class: str) -> None:
    """Load ``path`` in a new interpreter.

    Raises ``ModelNotImportableError`` naming the class it could not load.
    """
    failure = _fresh_python_failure(path, model_class)
    if failure is not None:
        raise ModelNotImportableError(failure.class_path, failure.error)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _save(
    model: torch.nn.Module, path: Path, by_value: list[types.ModuleType], model_class: str
) -> None:
    registered = set(cloudpickle.list_registry_pickle_by_value())
    added = [module for module in by_value if module.__name__ not in registered]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        torch.save(model, path, pickle_module=cloudpickle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        # what a class saved by value holds must pickle too: a lock, an open file, a connection
        # do not
        saved = ", ".join(repr(module.__name__) for module in by_value)
        raise ModelNotImportableError(
            model_class,
            f"pickle cannot save it: {exc}"
            + (f" (with the module(s) {saved} saved by value)" if saved else ""),
        ) from exc
    finally:
        for module in added:  # the user's own cloudpickle calls go on as before
            cloudpickle.unregister_pickle_by_value(module)


@dataclass(frozen=True)
class _Failure:
    class_path: str
    error: str
    #: the module the fresh process could not import, or None when something else failed
    module: str | None


def _fresh_python_failure(path: str | os.PathLike, model_class: str) -> _Failure | None:
    """Why a new interpreter started as the stub is could not load ``path``; None once it did."""
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
        return None
    if result.returncode == _UNLOADABLE_EXIT_CODE:
        failure = json.loads(result.stdout.strip().splitlines()[-1])
        return _Failure(failure["class"] or model_class, failure["error"], failure["module"])
    last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return _Failure(model_class, f"a fresh Python process could not load it: {last_line}", None)


def _savable_by_value(module: types.ModuleType) -> bool:
    """Python code can be saved by value; a compiled extension or a built-in module cannot."""
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    return (
        sys.modules.get(module.__name__) is module  # cloudpickle finds it by that name
        and module.__name__ not in sys.builtin_module_names
        and not isinstance(loader, importlib.machinery.ExtensionFileLoader)
    )


class _Unloadable(Exception):
    def __init__(self, class_path: str | None, module: str | None, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.class_path, self.module = class_path, module


class _NamingUnpickler(pickle.Unpickler):
    """Raises ``_Unloadable`` with the first class that cannot be imported and its module."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception as exc:
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            raise _Unloadable(f"{module}.{name}", missing or module, exc) from exc


def _main(path: str) -> None:
    naming_pickle = types.SimpleNamespace(
        Unpickler=_NamingUnpickler, load=pickle.load, __name__="pickle"
    )
    try:
        torch.load(path, map_location="cpu", weights_only=False, pickle_module=naming_pickle)
    except _Unloadable as failure:
        report = {"class": failure.class_path, "module": failure.module, "error": str(failure)}
    except ModuleNotFoundError as exc:  # a module a class saved by value imports
        report = {"class": None, "module": exc.name, "error": f"{type(exc).__name__}: {exc}"}
    else:
        return
    print(json.dumps(report))
    sys.exit(_UNLOADABLE_EXIT_CODE)


if __name__ == "__main__":
    _main(sys.argv[1])
