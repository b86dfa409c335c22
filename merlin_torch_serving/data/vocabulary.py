"""The raw values behind a Categorify-encoded column, read from a fitted NVTabular workflow.

NVTabular 23.08 encodes 0 as padding, 1 as null, 2 (up to 2 + num_buckets) as out-of-vocabulary,
then the vocabulary; this turns encoded ids back into raw ids and names the ids that are not items.
``read_labels`` is the one reader of the vocabulary files, for encoding and decoding alike.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from merlin.dag import postorder_iter_nodes

logger = logging.getLogger("merlin_torch_serving")

NULL_ID = 1  # 0 is padding; out-of-vocabulary ids follow the null id


@dataclass(frozen=True)
class CategoryVocabulary:
    """Encoded id -> raw value for one column; ``raw_values[i]`` is the raw value of id ``i``."""

    column: str
    raw_values: np.ndarray
    is_item: np.ndarray  # False for padding, null and out-of-vocabulary ids

    @classmethod
    def from_workflow(cls, workflow, column: str) -> CategoryVocabulary:
        """The vocabulary of ``column`` from the workflow's fitted Categorify operator."""
        from nvtabular.ops import Categorify

        for node in postorder_iter_nodes(workflow.output_node):
            op = node.op
            if isinstance(op, Categorify) and column in getattr(op, "categories", {}):
                return cls.from_labels(column, *read_labels(op, column))
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
    def from_labels(cls, column: str, values: np.ndarray, labels: np.ndarray) -> CategoryVocabulary:
        """From raw values and the encoded id of each, as ``read_labels`` gives them.

        Null values are left out.
        """
        present = ~pd.isna(values)
        size = int(labels.max()) + 1 if len(labels) else 0
        is_item = np.zeros(size, dtype=bool)
        is_item[labels[present]] = True
        if values.dtype.kind in "iub":
            raw_values = np.full(size, -1, dtype=np.int64)
        elif values.dtype.kind == "f":
            raw_values = np.full(size, np.nan, dtype=np.float64)
        else:
            raw_values = np.full(size, None, dtype=object)
        raw_values[labels[present]] = values[present]
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
        """Raw values of encoded ``ids``, of any shape.

        Reserved or out-of-range ids give ``missing_value``.
        """
        ids = np.asarray(ids)
        inside = (ids >= 0) & (ids < self.size)
        safe = np.where(inside, ids, 0)
        decoded = self.raw_values[safe]
        known = inside & self.is_item[safe]
        if not known.all():
            decoded = decoded.copy()
            decoded[~known] = self.missing_value
        return decoded


def read_labels(op, column: str) -> tuple[np.ndarray, np.ndarray]:
    """The raw values of a fitted Categorify's vocabulary of ``column`` and the id NVTabular
    encodes each one as: ``(values, labels)``, in the order NVTabular stored them.

    The id is the stored row index. NVTabular 23.08 writes that index from the first id after the
    reserved ones (3 without hashed buckets); a vocabulary written with an index from 0 (by cudf,
    or by hand) is shifted past the reserved ids when NVTabular encodes with ``split_out=1`` and a
    category cache (its defaults), and used as stored otherwise. Encoding and decoding both read
    vocabularies here, so they always agree.
    """
    storage_name = op.storage_name.get(column, column)
    path = op.categories.get(storage_name)
    if not path:
        return np.array([], dtype=object), np.array([], dtype=np.int64)
    frame = _read_frame(path, storage_name)
    values = frame[storage_name].to_numpy()
    labels = np.asarray(frame.index, dtype=np.int64)
    reserved = NULL_ID + 1 + _oov_buckets(op, storage_name)
    if len(labels) and labels[0] < reserved:
        if _split_out(op, storage_name) == 1 and op.cat_cache is not None:
            labels = labels + reserved
        else:
            logger.warning(
                "the Categorify vocabulary of %r stores ids from %d, below the %d reserved ids, and"
                " NVTabular encodes with them as stored (split_out > 1 or cat_cache=None): its"
                " values share ids with padding, null and out-of-vocabulary; refit the workflow"
                " with NVTabular 23.08 to separate them",
                column,
                labels[0],
                reserved,
            )
    return values, labels


def is_single_file(op, column: str) -> bool:
    """Whether NVTabular wrote the vocabulary of ``column`` as one parquet file.

    The other way is a folder of parts.
    """
    path = op.categories.get(op.storage_name.get(column, column))
    return not path or not os.path.isdir(path)


def _read_frame(path: str, column: str) -> pd.DataFrame:
    if not os.path.isdir(path):
        return pd.read_parquet(path, columns=[column])
    # split_out > 1 over several partitions: one file per part, each with its own stored index
    parts = sorted(
        (name for name in os.listdir(path) if name.endswith(".parquet")),
        key=lambda name: int("".join(filter(str.isdigit, name)) or 0),
    )
    return pd.concat(
        [pd.read_parquet(os.path.join(path, name), columns=[column]) for name in parts]
    )


def _oov_buckets(op, column: str) -> int:
    buckets = op.num_buckets
    if isinstance(buckets, int) and buckets:
        return buckets
    if isinstance(buckets, dict) and column in buckets:
        return int(buckets[column])
    return 1


def _split_out(op, column: str) -> int:
    return op.split_out.get(column, 1) if isinstance(op.split_out, dict) else int(op.split_out)
