"""Raw item ids as a store keeps them (text) turned into the encoded ids a graph ranks, through a
fitted workflow's Categorify vocabulary; saved with an export as plain arrays (no pickle)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.stores import text_key

ENCODER_FILE = "raw_item_ids.npz"


class RawIdEncoder:
    """``text_key(raw id) -> encoded id`` of one column's vocabulary; ``size`` is the number of
    encoded ids (the model's catalog)."""

    def __init__(self, column: str, encoded: dict[str, int], size: int):
        self.column = column
        self.encoded = encoded
        self.size = int(size)

    @classmethod
    def from_vocabulary(cls, vocabulary, column: str) -> RawIdEncoder:
        """From a ``CategoryVocabulary`` or a fitted ``nvtabular.Workflow`` (its ``column``); an
        encoder is returned as it is."""
        if isinstance(vocabulary, RawIdEncoder):
            return vocabulary
        if not isinstance(vocabulary, CategoryVocabulary):
            vocabulary = CategoryVocabulary.from_workflow(vocabulary, column)
        ids = np.flatnonzero(vocabulary.is_item)
        encoded = {text_key(vocabulary.raw_values[i]): int(i) for i in ids}
        return cls(column, encoded, vocabulary.size)

    def ids_of(self, items: Sequence[str]) -> np.ndarray:
        """The encoded id of each raw id (text); -1 for ids the vocabulary does not hold."""
        return np.array([self.encoded.get(item, -1) for item in items], dtype=np.int64)

    def save(self, folder: str | os.PathLike) -> None:
        items = sorted(self.encoded, key=self.encoded.__getitem__)
        np.savez(
            os.path.join(folder, ENCODER_FILE),
            items=np.array(items, dtype=str),
            ids=np.array([self.encoded[item] for item in items], dtype=np.int64),
            size=np.array(self.size, dtype=np.int64),
        )

    @classmethod
    def load(cls, column: str, folder: str | os.PathLike) -> RawIdEncoder:
        with np.load(os.path.join(folder, ENCODER_FILE), allow_pickle=False) as saved:
            items, ids, size = saved["items"], saved["ids"], int(saved["size"])
        return cls(column, dict(zip(items.tolist(), ids.tolist(), strict=True)), size)
