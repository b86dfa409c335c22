"""LookupFeatures: features of each key (an item, a session, a user) from a table exported with the
repository, so the common case needs no service beside Triton.

The table is held as sorted keys and one array per feature (a list feature as values and offsets),
written into the step's folder as one ``.npz`` without pickle: the served step needs nothing of the
machine that exported it. A key the table lacks gets each feature's declared default and is counted
(``mts_missing_entities_total``); a lookup is one binary search and one gather per feature.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage.feature_specs import (
    FeatureSpec,
    gather,
    parse_features,
    to_config,
)
from merlin_torch_serving.multistage.lookup import FeatureLookup

TABLE_FILE = "features.npz"
_KEYS = "__keys__"


class LookupFeatures(FeatureLookup):
    """The features of each row's key, from a table.

    Parameters
    ----------
    table
        A DataFrame, a parquet file, or a dict of columns: one row per key, a column per feature;
        list features as lists (a column of lists or arrays).
    key
        The table's key column (e.g. ``"item_id"``).
    column
        The input column holding the keys, one per row (e.g. ``UnrollCandidates``' candidate ids);
        by default ``key``.
    features
        The features to answer: names (dtypes as the table has them), or ``{name: dtype}``
        (``"float32"``, ``"list[int64]"``, ...) to convert them. By default every column but
        the key.
    defaults
        ``{name: value}`` for keys the table lacks; 0 (an empty list) for features left out.
    prefix
        Put before each output column's name (the features' names otherwise).
    name
        How metrics and messages call this lookup (default: ``key``'s table).
    """

    def __init__(
        self,
        table: pd.DataFrame | str | os.PathLike | Mapping[str, Any],
        *,
        key: str,
        column: str | None = None,
        features: Sequence[str] | Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        prefix: str = "",
        name: str | None = None,
    ):
        super().__init__()
        self.key = key
        self.column = column or key
        self.prefix = prefix
        self.name = name or f"{key} features"
        frame = _frame(table)
        if key not in frame.columns:
            raise ValueError(
                f"LookupFeatures: the table has no key column {key!r} (its columns:"
                f" {', '.join(map(repr, frame.columns))})"
            )
        if features is None:
            features = [c for c in frame.columns if c != key]
        declared = (
            dict(features)
            if isinstance(features, Mapping)
            else {name: _table_dtype(frame, name, self.name) for name in features}
        )
        self.specs = parse_features(declared, defaults, f"LookupFeatures({self.name!r})")
        self.keys, self.arrays = _sorted_arrays(frame, key, self.specs, self.name)
        text_keys = self.keys.dtype.kind == "U"
        self.key_kinds = ("string",) if text_keys else ("int",)
        self.key_dtype = self.keys.dtype

    @property
    def label(self) -> str:
        return f"LookupFeatures({self.name!r})"

    def key_description(self) -> str:
        kind = "text" if self.keys.dtype.kind == "U" else "int"
        return f"one {kind} key per row, as the table's {self.key!r}"

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        wanted = np.asarray(transformable[self.column].values)
        if self.keys.dtype.kind == "U":
            wanted = wanted.astype(str)
        positions = np.searchsorted(self.keys, wanted)
        clipped = np.minimum(positions, len(self.keys) - 1)
        rows = np.where(self.keys[clipped] == wanted, clipped, -1)
        metrics.count(metrics.MISSING_ENTITIES, int((rows < 0).sum()), lookup=self.name)
        columns = {
            self.prefix + spec.name: gather(spec, *self.arrays[spec.name], rows)
            for spec in self.specs
        }
        return TensorTable(columns, _unsafe=True)

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "column": self.column,
            "prefix": self.prefix,
            "name": self.name,
            **to_config(self.specs),
        }

    def save_artifacts(self, artifact_path=None) -> None:
        arrays = {_KEYS: self.keys}
        for name, (values, offsets) in self.arrays.items():
            arrays[f"{name}.values"] = values
            if offsets is not None:
                arrays[f"{name}.offsets"] = offsets
        np.savez(os.path.join(artifact_path, TABLE_FILE), **arrays)

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        with np.load(os.path.join(artifact_path, TABLE_FILE), allow_pickle=False) as saved:
            table: dict[str, Any] = {config["key"]: saved[_KEYS]}
            for name, dtype in config["features"].items():
                values = saved[f"{name}.values"]
                if dtype.startswith("list["):
                    offsets = saved[f"{name}.offsets"]
                    table[name] = [values[a:b] for a, b in itertools.pairwise(offsets)]
                else:
                    table[name] = values
        return {**config, "table": table}


def _frame(table) -> pd.DataFrame:
    if isinstance(table, pd.DataFrame):
        return table
    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        if not path.exists():
            raise FileNotFoundError(f"LookupFeatures: no feature table at {str(path)!r}")
        return pd.read_parquet(path)
    if isinstance(table, Mapping):
        columns = {
            name: list(values) if _holds_lists(values) else np.asarray(values)
            for name, values in table.items()
        }
        return pd.DataFrame(columns)
    raise TypeError(
        "LookupFeatures: table must be a DataFrame, a parquet file or a dict of columns, got"
        f" {type(table).__name__}"
    )


def _holds_lists(values) -> bool:
    return len(values) > 0 and isinstance(values[0], (list, tuple, np.ndarray))


def _table_dtype(frame: pd.DataFrame, name: str, lookup: str) -> str:
    if name not in frame.columns:
        raise ValueError(
            f"LookupFeatures({lookup!r}): the table has no feature {name!r} (its columns:"
            f" {', '.join(map(repr, frame.columns))})"
        )
    series = frame[name]
    if series.dtype == np.dtype(object):
        first = next(
            (v for v in series if isinstance(v, (list, tuple, np.ndarray)) and len(v)), None
        )
        if first is not None:
            return f"list[{np.asarray(first).dtype.name}]"
    return series.dtype.name if series.dtype != np.dtype(object) else "object"


def _sorted_arrays(
    frame: pd.DataFrame, key: str, specs: list[FeatureSpec], lookup: str
) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray | None]]]:
    """The keys, sorted, and each feature's values (and offsets, for lists) in that order."""
    keys = frame[key].to_numpy()
    if keys.dtype == np.dtype(object):
        keys = keys.astype(str)
    elif keys.dtype.kind not in "iuU":
        raise ValueError(
            f"LookupFeatures({lookup!r}): keys must be integers or text, the table's {key!r} holds"
            f" {keys.dtype}"
        )
    else:
        keys = keys.astype(np.int64) if keys.dtype.kind in "iu" else keys
    if len(keys) == 0:
        raise ValueError(f"LookupFeatures({lookup!r}): the table has no rows")
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    repeated = keys[1:][keys[1:] == keys[:-1]]
    if len(repeated):
        raise ValueError(
            f"LookupFeatures({lookup!r}): key {repeated[0]!r} appears more than once in {key!r};"
            " a feature table has one row per key"
        )
    arrays: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for spec in specs:
        column = frame[spec.name].to_numpy()[order]
        if not spec.is_list:
            arrays[spec.name] = (column.astype(spec.dtype), None)
            continue
        lists = [np.asarray([] if v is None else v, dtype=spec.dtype).reshape(-1) for v in column]
        lengths = np.array([len(v) for v in lists], dtype=np.int64)
        values = np.concatenate(lists) if lists else np.zeros(0, spec.dtype)
        arrays[spec.name] = (
            values.astype(spec.dtype),
            wire.offsets_from_lengths(lengths, np.int64),
        )
    return keys, arrays
