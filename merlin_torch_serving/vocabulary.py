"""The raw values behind a Categorify-encoded column, read from a fitted NVTabular workflow.

NVTabular 23.08 encodes 0 as padding, 1 as null, 2 (up to 2 + num_buckets) as out-of-vocabulary,
then the vocabulary; this turns encoded ids back into raw ids and names the ids that are not items.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from merlin.dag import postorder_iter_nodes


@dataclass(frozen=True)
class CategoryVocabulary:
    """Encoded id -> raw value for one column; ``raw_values[i]`` is the raw value of id ``i``."""

    column: str
    raw_values: np.ndarray
    is_item: np.ndarray  # False for padding, null and out-of-vocabulary ids

    @classmethod
    def from_workflow(cls, workflow, column: str) -> "CategoryVocabulary":
        """The vocabulary of ``column`` from the workflow's fitted Categorify operator."""
        from nvtabular.ops import Categorify

        for node in postorder_iter_nodes(workflow.output_node):
            op = node.op
            if isinstance(op, Categorify) and column in getattr(op, "categories", {}):
                return cls.from_parquet(column, op.categories[column])
        found = sorted(
            name
            for node in postorder_iter_nodes(workflow.output_node)
            if isinstance(node.op, Categorify)
            for name in node.op.categories
        )
        raise ValueError(
            f"the workflow has no fitted Categorify vocabulary for {column!r} "
            f"(it has: {', '.join(map(repr, found)) or 'none'})"
        )

    @classmethod
    def from_parquet(cls, column: str, path: str | os.PathLike) -> "CategoryVocabulary":
        """Read NVTabular's ``unique.<column>.parquet``: its index is the encoded id."""
        frame = pd.read_parquet(path)
        values = frame[column]
        size = int(frame.index.max()) + 1 if len(frame) else 0
        is_item = np.zeros(size, dtype=bool)
        present = values.notna().to_numpy()
        is_item[frame.index.to_numpy()[present]] = True
        if values.dtype.kind in "iub":
            raw_values = np.full(size, -1, dtype=np.int64)
            raw_values[frame.index.to_numpy()[present]] = values.to_numpy()[present].astype(np.int64)
        elif values.dtype.kind == "f":
            raw_values = np.full(size, np.nan, dtype=np.float64)
            raw_values[frame.index.to_numpy()[present]] = values.to_numpy()[present]
        else:
            raw_values = np.full(size, None, dtype=object)
            raw_values[frame.index.to_numpy()[present]] = values.to_numpy()[present]
        return cls(column, raw_values, is_item)

    @property
    def size(self) -> int:
        """Number of encoded ids, reserved ones included (the model's catalog size)."""
        return len(self.raw_values)

    @property
    def reserved_ids(self) -> list[int]:
        """Ids that are not items: padding, null and out-of-vocabulary buckets."""
        return np.flatnonzero(~self.is_item).tolist()

    @property
    def missing_value(self):
        """What ``decode`` returns for a reserved or unknown id: -1, NaN or None by dtype."""
        kind = self.raw_values.dtype.kind
        return -1 if kind in "iu" else (np.nan if kind == "f" else None)

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """Raw values of encoded ``ids`` (any shape); reserved or out-of-range ids give
        ``missing_value``."""
        ids = np.asarray(ids)
        inside = (ids >= 0) & (ids < self.size)
        safe = np.where(inside, ids, 0)
        decoded = self.raw_values[safe]
        known = inside & self.is_item[safe]
        if not known.all():
            decoded = decoded.copy()
            decoded[~known] = self.missing_value
        return decoded
