"""MostPopular: a fallback recommender that answers any session, even one no model can: the most
clicked items of the category of the session's last item, then of the whole catalog, leaving out
the session's own items.

It returns what ``TopK`` returns (``item_ids`` in the workflow's encoded ids, ``item_scores``), so
the same ``DecodeItemIds`` after it gives raw ids and a route can merge its answers with a model's.
A score is the item's share of the clicks of the list it was taken from (its category's, or the
catalog's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import tables
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import check_seen_items, ranked_items_schema
from merlin_torch_serving.routing.popularity import ItemPopularity


class MostPopular(ServingOperator):
    """Per session, the ``k`` most popular items it has not seen (see the module's docstring).

    Parameters
    ----------
    popularity
        An ``ItemPopularity`` fitted on the training clicks (``ItemPopularity.fit(clicks,
        workflow)``); it names the workflow outputs this operator reads (the session's items and,
        when fitted per category, their categories).
    k
        How many items to return per session. A session that has seen almost the whole catalog
        gets id -1 scored -inf in the places left, as ``TopK`` pads.
    ids_column, scores_column
        Names of the two outputs (``TopK``'s by default).
    """

    def __init__(
        self,
        popularity: ItemPopularity,
        k: int,
        *,
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
    ):
        super().__init__()
        if int(k) < 1:
            raise ValueError(f"k must be at least 1, got {k!r}")
        self.popularity = popularity
        self.k = int(k)
        self.ids_column = ids_column
        self.scores_column = scores_column
        self._global_scores = _shares(popularity.item_clicks)
        offsets, clicks = popularity.category_offsets, popularity.category_item_clicks
        totals = np.add.reduceat(clicks, offsets[:-1]) if len(clicks) else np.zeros(0)
        lengths = np.diff(offsets)
        per_click = np.repeat(np.where(lengths > 0, totals, 1).astype(np.float64), lengths)
        self._category_scores = (clicks / np.maximum(per_click, 1)).astype(np.float32)

    @property
    def label(self) -> str:
        return f"MostPopular(k={self.k})"

    def _columns(self) -> list[str]:
        columns = [self.popularity.items_column]
        if self.popularity.categories_column is not None:
            columns.append(self.popularity.categories_column)
        return columns

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        for name in self._columns():
            if name not in input_schema.column_names:
                raise SchemaError(
                    self.label,
                    name,
                    "the workflow output the popularity was fitted for",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
        return input_schema.select_by_name(self._columns())

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        for name in self._columns():
            check_seen_items(self.label, input_schema[name])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return ranked_items_schema(
            self.k, self.popularity.catalog, "float32", self.ids_column, self.scores_column
        )

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        rows = tables.num_rows(transformable)
        items = _lists(transformable[self.popularity.items_column])
        categories = (
            _lists(transformable[self.popularity.categories_column])
            if self.popularity.categories_column is not None
            else None
        )
        ids = np.full((rows, self.k), -1, dtype=np.int64)
        scores = np.full((rows, self.k), -np.inf, dtype=np.float32)
        for row in range(rows):
            last = categories[row][-1] if categories is not None and len(categories[row]) else -1
            found_ids, found_scores = self._best(items[row], int(last))
            ids[row, : len(found_ids)] = found_ids
            scores[row, : len(found_scores)] = found_scores
        return TensorTable({self.ids_column: ids, self.scores_column: scores}, _unsafe=True)

    def _best(self, seen: np.ndarray, category: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` first items of the category's list, then the catalog's, not in ``seen``."""
        popularity = self.popularity
        wanted = self.k + len(seen)
        parts_ids, parts_scores = [], []
        if 0 <= category < len(popularity.category_offsets) - 1:
            start, end = popularity.category_offsets[category : category + 2]
            end = min(end, start + wanted)
            parts_ids.append(popularity.category_item_ids[start:end])
            parts_scores.append(self._category_scores[start:end])
            wanted += end - start  # the catalog's list may repeat all of them
        parts_ids.append(popularity.item_ids[:wanted])
        parts_scores.append(self._global_scores[:wanted])
        candidates = np.concatenate(parts_ids)
        candidate_scores = np.concatenate(parts_scores)
        _, first = np.unique(candidates, return_index=True)
        keep = np.zeros(len(candidates), dtype=bool)
        keep[first] = True
        keep &= ~np.isin(candidates, seen)
        chosen = np.flatnonzero(keep)[: self.k]
        return candidates[chosen], candidate_scores[chosen]

    def config(self) -> dict[str, Any]:
        return {
            "popularity": self.popularity.config(),
            "k": self.k,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        self.popularity.save(str(artifact_path))

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        return {
            **config,
            "popularity": ItemPopularity.load(config["popularity"], artifact_path),
        }


def _shares(clicks: np.ndarray) -> np.ndarray:
    return (clicks / max(int(clicks.sum()), 1)).astype(np.float32)


def _lists(column) -> list[np.ndarray]:
    """The rows of a list column (ragged, or fixed-length padded with 0 at the end or start)."""
    values = np.asarray(column.values)
    if column.offsets is None:
        return [row[row != 0] for row in values.reshape(len(values), -1)]
    offsets = np.asarray(column.offsets)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
