"""Per-session conditions a route sends sessions by: each is True or False for every row (session)
of what the route receives, the workflow's outputs.

``FilteredOut`` (the workflow's filters dropped the session), ``FewerKnownItems(n)`` (fewer than
``n`` items the model knows), ``AllItemsUnknown()`` and ``Predicate`` (a function of the user's, in
TorchScript or Python, over wire arrays of the columns it names). Each writes itself as JSON (and a
file, for TorchScript) so the served route rebuilds the same condition.
"""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from merlin.schema import Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.ops.session_rows import FILTERED_COLUMN

#: NVTabular 23.08's Categorify ids that are not items: padding, null, out-of-vocabulary
DEFAULT_UNKNOWN_IDS = (0, 1, 2)


class Condition:
    """A per-session condition over the route's input columns."""

    kind: ClassVar[str]

    def bind(self, route: str, input_schema: Schema) -> Condition:
        """The condition over ``input_schema`` (what ``route`` receives), its columns resolved; a
        ``SchemaError`` naming the route when they are not received."""
        return self

    def evaluate(self, table: TensorTable) -> np.ndarray:
        """True for each row the condition holds for (bool, one per row)."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def config(self) -> dict[str, Any]:
        return {}

    def save_artifacts(self, folder: str, stem: str) -> None:
        """Write the files the condition needs into ``folder``, named from ``stem``."""

    @classmethod
    def from_config(cls, config: dict[str, Any], folder: str) -> Condition:
        return cls(**config)


class FilteredOut(Condition):
    """The workflow's filters dropped the session (a one-click session under
    ``Filter(item_id-count >= 2)``); never true when the workflow cannot drop sessions."""

    kind = "filtered_out"

    def __init__(self, column: str = FILTERED_COLUMN):
        self.column = column

    def bind(self, route: str, input_schema: Schema) -> Condition:
        if self.column != FILTERED_COLUMN and self.column not in input_schema.column_names:
            raise SchemaError(
                route, self.column, "a bool column marking filtered sessions", "no such column"
            )
        return self

    def evaluate(self, table: TensorTable) -> np.ndarray:
        if self.column not in table.columns:
            return np.zeros(_rows(table), dtype=bool)
        return np.asarray(table[self.column].values, dtype=bool)

    def describe(self) -> str:
        return "FilteredOut()"

    def config(self) -> dict[str, Any]:
        return {"column": self.column}


class FewerKnownItems(Condition):
    """The session holds fewer than ``n`` items the model knows: ids in ``column`` (by default the
    one list column tagged as item ids) other than ``unknown_ids`` (NVTabular's padding, null and
    out-of-vocabulary ids; ``CategoryVocabulary.reserved_ids`` lists a workflow's own)."""

    kind = "fewer_known_items"

    def __init__(
        self,
        n: int,
        column: str | None = None,
        unknown_ids: Sequence[int] = DEFAULT_UNKNOWN_IDS,
    ):
        if int(n) < 1:
            raise ValueError(f"FewerKnownItems needs n of 1 or more, got {n!r}")
        self.n = int(n)
        self.column = column
        self.unknown_ids = sorted({int(i) for i in unknown_ids})

    def bind(self, route: str, input_schema: Schema) -> Condition:
        name = self._column(route, input_schema)
        column = input_schema[name]
        if column.dtype.element_type.value != "int" or not column.is_list:
            raise SchemaError(route, name, "an int list of item ids", describe_column(column))
        bound = copy.copy(self)
        bound.column = name
        return bound

    def evaluate(self, table: TensorTable) -> np.ndarray:
        if self.column is None:
            raise ValueError(f"{self.describe()} evaluated before it was bound to a route")
        column = table[self.column]
        values = np.asarray(column.values)
        if self.unknown_ids == list(range(len(self.unknown_ids))):  # Categorify's: 0 .. n-1
            known = values >= len(self.unknown_ids)
        else:
            known = ~np.isin(values, self.unknown_ids)
        if column.offsets is None:  # a fixed-length list: [rows, length]
            counts = known.reshape(len(values), -1).sum(axis=1)
        else:
            offsets = np.asarray(column.offsets, dtype=np.int64)
            running = np.concatenate([[0], np.cumsum(known)])
            counts = running[offsets[1:]] - running[offsets[:-1]]
        return counts < self.n

    def describe(self) -> str:
        return f"FewerKnownItems({self.n})"

    def config(self) -> dict[str, Any]:
        return {"n": self.n, "column": self.column, "unknown_ids": self.unknown_ids}

    def _column(self, route: str, input_schema: Schema) -> str:
        if self.column is not None:
            if self.column not in input_schema.column_names:
                raise SchemaError(
                    route,
                    self.column,
                    "an int list of item ids",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            return self.column
        found = [c.name for c in input_schema if _is_item_list(c)]
        if len(found) != 1:
            raise SchemaError(
                route,
                None,
                f"one list column tagged as item ids for {self.describe()}",
                f"{len(found)} ({', '.join(map(repr, found)) or 'none'})",
                f"name it: {type(self).__name__}(..., column='item_id-list')",
            )
        return found[0]


class AllItemsUnknown(FewerKnownItems):
    """No item of the session is known to the model (every id is padding, null or
    out-of-vocabulary), as for a session of items newer than the training data."""

    kind = "all_items_unknown"

    def __init__(self, column: str | None = None, unknown_ids: Sequence[int] = DEFAULT_UNKNOWN_IDS):
        super().__init__(1, column, unknown_ids)

    def describe(self) -> str:
        return "AllItemsUnknown()"

    def config(self) -> dict[str, Any]:
        return {"column": self.column, "unknown_ids": self.unknown_ids}


class Predicate(Condition):
    """A function of the user's: True for the sessions to route.

    ``function`` takes one dict of the wire arrays of ``columns`` (a ragged list ``c`` as
    ``c__values`` and ``c__offsets``) and returns one bool per row: a TorchScript module (or a
    ``torch.nn.Module`` that ``torch.jit.script`` compiles) whose ``forward`` takes a
    ``Dict[str, Tensor]``, saved as a file with the export; or a Python function over numpy
    arrays, exported by its import path (define it in a module the server can import, not in
    ``__main__`` or a notebook).
    """

    kind = "predicate"

    def __init__(self, function: torch.nn.Module | Callable | str, columns: Sequence[str]):
        if isinstance(function, str):
            function = _import(function)
        if isinstance(function, torch.nn.Module) and not isinstance(
            function, torch.jit.ScriptModule
        ):
            function = torch.jit.script(function)
        if not callable(function):
            raise TypeError(f"Predicate needs a TorchScript module or a function, got {function!r}")
        self.function = function
        self.columns = list(columns)
        if not self.columns:
            raise ValueError("Predicate needs the columns its function reads")

    @property
    def is_torchscript(self) -> bool:
        return isinstance(self.function, torch.jit.ScriptModule)

    def bind(self, route: str, input_schema: Schema) -> Condition:
        for name in self.columns:
            if name not in input_schema.column_names:
                raise SchemaError(
                    route,
                    name,
                    f"a column for {self.describe()}",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
        return self

    def evaluate(self, table: TensorTable) -> np.ndarray:
        arrays = wire.to_wire(TensorTable({c: table[c] for c in self.columns}, _unsafe=True))
        if self.is_torchscript:
            with torch.no_grad():
                tensors = {name: torch.from_numpy(np.asarray(a)) for name, a in arrays.items()}
                result = self.function(tensors).numpy()
        else:
            result = np.asarray(self.function(arrays))
        rows = _rows(table)
        if result.shape != (rows,):
            raise ValueError(
                f"{self.describe()} must return one bool per session: shape [{rows}], got"
                f" {list(result.shape)}"
            )
        return result.astype(bool)

    def describe(self) -> str:
        name = getattr(self.function, "__qualname__", None) or type(self.function).__name__
        return f"Predicate({name})"

    def config(self) -> dict[str, Any]:
        if self.is_torchscript:
            return {"columns": self.columns}
        return {"columns": self.columns, "function": _import_path(self.function)}

    def save_artifacts(self, folder: str, stem: str) -> None:
        if self.is_torchscript:
            torch.jit.save(self.function, os.path.join(folder, f"{stem}.pt"))

    @classmethod
    def from_config(cls, config: dict[str, Any], folder: str, stem: str = "") -> Predicate:
        function = config.get("function") or torch.jit.load(os.path.join(folder, f"{stem}.pt"))
        return cls(function, config["columns"])


CONDITIONS: dict[str, type[Condition]] = {
    cls.kind: cls for cls in (FilteredOut, FewerKnownItems, AllItemsUnknown, Predicate)
}


def condition_config(condition: Condition) -> dict[str, Any]:
    return {"kind": condition.kind, **condition.config()}


def condition_from_config(config: dict[str, Any], folder: str, stem: str) -> Condition:
    """The condition ``condition_config`` described (its files read from ``folder``)."""
    settings = {key: value for key, value in config.items() if key != "kind"}
    kind = CONDITIONS.get(config.get("kind", ""))
    if kind is None:
        raise ValueError(
            f"unknown condition kind {config.get('kind')!r}; this version reads"
            f" {', '.join(CONDITIONS)}"
        )
    if kind is Predicate:
        return Predicate.from_config(settings, folder, stem)
    return kind.from_config(settings, folder)


def _rows(table: TensorTable) -> int:
    from merlin_torch_serving.data.tables import num_rows

    return num_rows(table)


def _is_item_list(column) -> bool:
    tags = set(column.tags)
    return column.is_list and (Tags.ITEM_ID in tags or {Tags.ITEM, Tags.ID} <= tags)


def _import_path(function: Callable) -> str:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"the Predicate function {qualname or function!r} cannot be exported by its import"
            f" path (module {module!r}): define it at the top level of a module the server can"
            " import, or pass a TorchScript module"
        )
    return f"{module}:{qualname}"


def _import(path: str) -> Callable:
    module, _, qualname = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target
