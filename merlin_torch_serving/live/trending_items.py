"""TrendingItems: ``MostPopular`` over what is clicked now. Per session, the ``k`` items clicked
most over the trending window (``Trending``), as ``SessionHistory`` counted them into the store
while clicks arrived, leaving out the session's own items; what ``TopK`` returns (encoded ids,
scores), so a ``DecodeItemIds`` after it gives raw ids and a route can use it as its fallback.

A score is the item's share of the window's (decayed) clicks. The ranking is read from the store
at most every ``refresh_s``; a store that fails leaves the last ranking in force (none before the
first read: sessions then get -1 ids scored -inf, as ``TopK`` pads).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import tables
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.live.encoding import RawIdEncoder
from merlin_torch_serving.live.trending import Trending
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import check_seen_items, ranked_items_schema
from merlin_torch_serving.stores import (
    GuardedStore,
    Refreshed,
    StoreSettings,
    settings_from_config,
    store_settings,
)


class TrendingItems(ServingOperator):
    """Per session, the ``k`` trending items it has not seen (see the module's docstring).

    Parameters
    ----------
    store
        The store ``SessionHistory`` counts into: a folder, a Redis URL, or store settings.
    trending
        The same ``Trending`` the ``SessionHistory`` of the graph counts with.
    workflow
        The fitted workflow (its vocabulary of ``trending.item`` encodes the counted raw ids;
        items it does not know are left out), or that ``CategoryVocabulary`` or ``RawIdEncoder``.
    k
        How many items per session.
    seen_items
        The workflow output holding the session's (encoded) items, left out of its answer.
    refresh_s
        The most the ranking may lag the clicks (plus one store call).
    """

    def __init__(
        self,
        store: str | StoreSettings,
        trending: Trending,
        workflow,
        k: int,
        *,
        seen_items: str = "item_id-list",
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
        refresh_s: float = 0.5,
        retry_after_s: float = 1.0,
    ):
        super().__init__()
        if int(k) < 1:
            raise ValueError(f"k must be at least 1, got {k!r}")
        self.settings = store_settings(store)
        self.trending = trending
        self.k = int(k)
        self.seen_items = seen_items
        self.ids_column = ids_column
        self.scores_column = scores_column
        self.refresh_s = float(refresh_s)
        self.retry_after_s = float(retry_after_s)
        self.encoder = RawIdEncoder.from_vocabulary(workflow, trending.item)
        self.guard = GuardedStore(self.settings, retry_after_s=self.retry_after_s, label="trending")
        self._ranking = Refreshed(
            self.guard,
            lambda store: store.trending_counts(trending.name, trending.window),
            lambda counts: self._encoded(*trending.ranked(counts)),
            (np.zeros(0, np.int64), np.zeros(0, np.float32)),
            self.refresh_s,
        )

    @property
    def label(self) -> str:
        return f"TrendingItems(k={self.k})"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        if self.seen_items not in input_schema.column_names:
            raise SchemaError(
                self.label,
                self.seen_items,
                "the workflow's list of the session's items",
                f"no such column (it receives {', '.join(map(repr, input_schema.column_names))})",
                "name it with seen_items=",
            )
        return input_schema.select_by_name([self.seen_items])

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        check_seen_items(self.label, input_schema[self.seen_items])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return ranked_items_schema(
            self.k, self.encoder.size, "float32", self.ids_column, self.scores_column
        )

    def services(self) -> list[dict[str, str]]:
        return [{"name": f"trending store ({self.settings.kind})", "url": self.settings.describe()}]

    # ---- running -----------------------------------------------------------------------------

    def ranking(self) -> tuple[np.ndarray, np.ndarray]:
        """(encoded ids, scores) of the trending items, best first, read again when ``refresh_s``
        old."""
        return self._ranking.value()

    def _encoded(self, items: list[str], weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        known = self.encoder.ids_of(items)
        keep = known >= 0
        shares = weights[keep] / max(float(weights[keep].sum()), 1e-300)
        return known[keep], shares.astype(np.float32)

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        rows = tables.num_rows(transformable)
        seen = transformable[self.seen_items]
        values, offsets = np.asarray(seen.values), seen.offsets
        ranked_ids, ranked_scores = self.ranking()
        ids = np.full((rows, self.k), -1, dtype=np.int64)
        scores = np.full((rows, self.k), -np.inf, dtype=np.float32)
        for row in range(rows):
            if offsets is None:
                own = values.reshape(rows, -1)[row]
            else:
                own = values[int(offsets[row]) : int(offsets[row + 1])]
            candidates = ranked_ids[: self.k + len(own)]
            chosen = np.flatnonzero(~np.isin(candidates, own))[: self.k]
            ids[row, : len(chosen)] = candidates[chosen]
            scores[row, : len(chosen)] = ranked_scores[chosen]
        return TensorTable({self.ids_column: ids, self.scores_column: scores}, _unsafe=True)

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "store": self.settings.config(),
            "trending": self.trending.config(),
            "k": self.k,
            "seen_items": self.seen_items,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
            "refresh_s": self.refresh_s,
            "retry_after_s": self.retry_after_s,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        self.encoder.save(str(artifact_path))

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        trending = Trending.from_config(config["trending"])
        return {
            **config,
            "store": settings_from_config(config["store"]),
            "trending": trending,
            "workflow": RawIdEncoder.load(trending.item, artifact_path),
        }
