"""BlockList: a block list kept in a store, read while a graph serves, so that items out of stock
or withdrawn leave the answers within a second of being blocked, with no reload and no new
export. ``FilterCandidates(block_list=...)`` and ``TopK(block_list=...)`` read one.

Items are blocked by their raw ids (what a catalogue knows); with the workflow's vocabulary the
list answers the encoded ids the graph ranks. An operator reads the list at most every
``refresh_s`` (one store call, off every other request's path); a store that fails leaves the
last list read in force and fails no request.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from merlin_torch_serving.live.encoding import RawIdEncoder
from merlin_torch_serving.stores import (
    GuardedStore,
    Refreshed,
    StoreSettings,
    settings_from_config,
    store_settings,
)


class BlockList:
    """The items of block list ``name`` in ``store``, as a serving operator reads them.

    Parameters
    ----------
    store
        A folder (the embedded store), a Redis URL, or store settings.
    name
        The list's name in the store (``merlin-torch-serving rules block --list NAME``).
    vocabulary
        A fitted ``nvtabular.Workflow``, a ``CategoryVocabulary`` or a ``RawIdEncoder``: raw ids
        in the list become the encoded ids the graph ranks (ids it does not know are dropped).
        None: the list holds the ids the operator sees.
    column
        The raw column whose vocabulary is used (with a workflow).
    refresh_s
        The most an answer may lag a change of the list (plus one store call).
    retry_after_s
        After a failed read, requests skip the store this long (the last list stays in force).
    """

    def __init__(
        self,
        store: str | StoreSettings,
        name: str = "blocked",
        *,
        vocabulary=None,
        column: str = "item_id",
        refresh_s: float = 0.5,
        retry_after_s: float = 1.0,
    ):
        self.settings = store_settings(store)
        self.name = name
        self.column = column
        self.refresh_s = float(refresh_s)
        self.retry_after_s = float(retry_after_s)
        self.encoder = (
            RawIdEncoder.from_vocabulary(vocabulary, column) if vocabulary is not None else None
        )
        self.guard = GuardedStore(self.settings, retry_after_s=self.retry_after_s, label="rules")
        self._ids = Refreshed(
            self.guard,
            lambda store: store.blocked(self.name),
            self._as_ids,
            np.zeros(0, dtype=np.int64),
            self.refresh_s,
        )

    def ids(self) -> np.ndarray:
        """The blocked ids (int64, sorted), read again when the last read is ``refresh_s`` old;
        one caller reads while the others keep the list they have."""
        return self._ids.value()

    def _as_ids(self, items: list[str]) -> np.ndarray:
        if self.encoder is not None:
            found = self.encoder.ids_of(items)
            return np.unique(found[found >= 0])
        return np.unique(np.asarray([int(i) for i in items if _is_int(i)], dtype=np.int64))

    def services(self) -> list[dict[str, str]]:
        return [{"name": f"rules store ({self.settings.kind})", "url": self.settings.describe()}]

    def config(self) -> dict[str, Any]:
        return {
            "store": self.settings.config(),
            "name": self.name,
            "column": self.column,
            "refresh_s": self.refresh_s,
            "retry_after_s": self.retry_after_s,
            "encoded": self.encoder is not None,
        }

    def save(self, folder: str | os.PathLike) -> None:
        """Write the vocabulary it encodes with (if any) into ``folder``."""
        if self.encoder is not None:
            self.encoder.save(folder)

    @classmethod
    def load(cls, config: dict[str, Any], folder: str | os.PathLike) -> BlockList:
        return cls(
            settings_from_config(config["store"]),
            config["name"],
            vocabulary=RawIdEncoder.load(config["column"], folder) if config["encoded"] else None,
            column=config["column"],
            refresh_s=config["refresh_s"],
            retry_after_s=config["retry_after_s"],
        )


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
