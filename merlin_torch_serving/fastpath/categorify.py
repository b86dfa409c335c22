"""Compiled NVTabular ``Categorify``: each vocabulary is read once and looked up with searchsorted.

Encoding (nvtabular 23.08): 0 is padding, 1 a null value, 2 a value outside the vocabulary, then
the vocabulary, most frequent first, under the label ``vocabulary.read_labels`` gives each value
(the same reader DecodeItemIds uses). A vocabulary of ``split_out > 1`` is compiled when NVTabular
wrote it as one file.
"""

from __future__ import annotations

import numpy as np
from merlin.dag import ColumnSelector
from nvtabular.ops import Categorify

from merlin_torch_serving.data.vocabulary import is_single_file, read_labels
from merlin_torch_serving.fastpath.batch import ARRAY_CELLS, Batch, Column, null_mask
from merlin_torch_serving.fastpath.errors import Delegate, NotCompiled
from merlin_torch_serving.graph import metrics

NULL_LABEL = 1
OOV_LABEL = 2


class Vocabulary:
    """A column's vocabulary sorted by value, with the label of each value beside it."""

    def __init__(self, values: np.ndarray, labels: np.ndarray):
        if values.dtype.kind not in "iufbO":
            raise NotCompiled(f"a vocabulary of dtype {values.dtype} is not compiled")
        self.dtype = values.dtype
        # Nulls never match (NVTabular drops the null row before writing the vocabulary).
        present = ~null_mask(values)
        order = np.argsort(values[present], kind="stable")
        self.values = values[present][order]
        self.labels = labels[present][order].astype(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Labels of keys (already cast to the vocabulary's dtype); OOV_LABEL where absent."""
        if len(self.values) == 0:
            return np.full(len(keys), OOV_LABEL, dtype=np.int64)
        try:
            positions = np.searchsorted(self.values, keys)
        except TypeError as error:
            raise Delegate(
                f"values that cannot be compared with the vocabulary ({error})"
            ) from None
        np.minimum(positions, len(self.values) - 1, out=positions)
        found = self.values[positions] == keys
        return np.where(found, self.labels[positions], OOV_LABEL)

    def encode(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels of the values, and where they were null.

        Nulls and non-finite floats get OOV_LABEL.
        """
        nulls = null_mask(values)
        keys, unmatchable = self._as_keys(values, nulls)
        labels = self.lookup(keys)
        labels[unmatchable] = OOV_LABEL
        return labels, nulls

    def _as_keys(self, values: np.ndarray, nulls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The values cast to the vocabulary's dtype, as NVTabular casts them before its merge."""
        kind = values.dtype.kind
        vocab_kind = self.dtype.kind
        if vocab_kind == "O" or kind == "O":
            if kind != vocab_kind:
                raise Delegate(
                    f"values of dtype {values.dtype} against a vocabulary of {self.dtype}"
                )
            keys = values
            if nulls.any():
                # placeholder for nulls so that searchsorted compares like with like
                keys = values.copy()
                keys[nulls] = self.values[0] if len(self.values) else ""
            return keys, nulls
        if kind not in "iufb":
            raise Delegate(f"values of dtype {values.dtype}")
        unmatchable = nulls
        if vocab_kind in "iub" and kind == "f":
            # pandas refuses to cast NaN or inf to an integer; encode them as null (NaN) or
            # out-of-vocabulary (inf) instead of failing the request.
            unmatchable = ~np.isfinite(values)
            values = np.where(unmatchable, 0, values)
        return values.astype(self.dtype, copy=False), unmatchable


class CategorifyKernel:
    """One Categorify node over single columns, with one vocabulary per column."""

    def __init__(self, op: Categorify, selection: ColumnSelector):
        mapping = op.column_mapping(selection)
        if getattr(op, "single_table", False):
            raise NotCompiled("single_table=True shares one label range across columns")
        if op.search_sorted:
            raise NotCompiled("search_sorted=True")
        self.dtype = np.dtype(op.output_dtype)
        self.vocabularies: dict[str, Vocabulary] = {}
        for name, sources in mapping.items():
            if list(sources) != [name]:
                raise NotCompiled(
                    f"column group {list(sources)!r} is encoded jointly ({op.encode_type})"
                )
            storage_name = op.storage_name.get(name, name)
            if storage_name != name:
                raise NotCompiled(f"column {name!r} shares the vocabulary {storage_name!r}")
            buckets = op.num_buckets
            if buckets and (isinstance(buckets, int) or storage_name in buckets):
                raise NotCompiled(f"num_buckets hashes out-of-vocabulary values of {name!r}")
            if not is_single_file(op, storage_name):
                raise NotCompiled(
                    f"the vocabulary of {name!r} is a folder of several files (split_out)"
                )
            self.vocabularies[name] = Vocabulary(*read_labels(op, storage_name))

    def __call__(self, batch: Batch) -> Batch:
        encoded = {}
        for name, vocabulary in self.vocabularies.items():
            column = batch[name]
            labels, nulls = vocabulary.encode(column.values)
            if metrics.is_collecting():
                metrics.count(
                    metrics.OOV_IDS, np.count_nonzero((labels == OOV_LABEL) & ~nulls), column=name
                )
            if column.is_list:
                # Inside lists NVTabular only ever merges, so a null element is simply absent
                # from the vocabulary: it gets the out-of-vocabulary label, not the null label.
                encoded[name] = Column(labels.astype(self.dtype), column.offsets, ARRAY_CELLS)
            else:
                labels[nulls] = NULL_LABEL
                encoded[name] = Column(labels.astype(self.dtype))
        return batch.with_columns(encoded)
