"""Item popularity fitted from training clicks: clicks per item over the catalog and per category,
in the workflow's encoded ids, optionally over a recent time window. The data behind
``MostPopular``, saved with the export as arrays (no pickle)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.ops.workflow import derived_columns

logger = logging.getLogger("merlin_torch_serving")

POPULARITY_FILE = "popularity.npz"


@dataclass(frozen=True)
class ItemPopularity:
    """Items ranked by their clicks (most first, ties by id), over the catalog and per category.

    ``items_column`` and ``categories_column`` name the workflow's output lists that hold a
    session's items and their categories (encoded); category ``c``'s ranked items are
    ``category_item_ids[category_offsets[c]:category_offsets[c + 1]]``. Ids are the workflow's
    Categorify ids, so a ``DecodeItemIds`` of the same workflow turns them back into raw ids.
    """

    items_column: str
    categories_column: str | None
    catalog: int  # encoded item ids are below it (the model's catalog)
    item_ids: np.ndarray
    item_clicks: np.ndarray
    category_offsets: np.ndarray
    category_item_ids: np.ndarray
    category_item_clicks: np.ndarray

    @classmethod
    def fit(
        cls,
        clicks: pd.DataFrame,
        workflow,
        *,
        item: str = "item_id",
        category: str | None = "category",
        timestamp: str = "timestamp",
        window=None,
        depth: int = 100,
    ) -> ItemPopularity:
        """Count ``clicks`` (raw rows, as the workflow was fitted on) per item.

        ``item`` and ``category`` are the raw columns; per-category lists are kept when the
        workflow turns ``category`` into a list output (set ``category=None`` for the catalog
        only), each its ``depth`` most clicked items. With ``window`` (a number in the units of
        ``timestamp``, or a ``pd.Timedelta`` for datetimes) only the clicks of that span before
        the latest one count. Clicks of items the workflow's vocabulary lacks are left out.
        """
        if window is not None:
            if timestamp not in clicks.columns:
                raise ValueError(
                    f"a popularity window needs the clicks' time: no column {timestamp!r} (it has"
                    f" {', '.join(map(repr, clicks.columns))}); pass timestamp=<column>"
                )
            times = clicks[timestamp]
            clicks = clicks[times > times.max() - window]
        items_column = _list_output(workflow, item, required=True)
        assert items_column is not None
        vocabulary = CategoryVocabulary.from_workflow(workflow, item)
        ids = _encoded(vocabulary, clicks[item])
        known = ids >= 0
        if not known.all():
            logger.info(
                "ItemPopularity: %d of %d clicks are of items the workflow does not know; they"
                " are left out",
                int((~known).sum()),
                len(ids),
            )
        item_ids, item_clicks = _ranked(ids[known])
        categories_column = _list_output(workflow, category) if category is not None else None
        offsets = np.zeros(1, dtype=np.int64)
        category_ids = category_clicks = np.zeros(0, dtype=np.int64)
        if categories_column is not None:
            assert category is not None
            categories = _encoded(
                CategoryVocabulary.from_workflow(workflow, category), clicks[category]
            )
            offsets, category_ids, category_clicks = _per_category(
                categories[known], ids[known], depth
            )
        return cls(
            items_column,
            categories_column,
            vocabulary.size,
            item_ids,
            item_clicks,
            offsets,
            category_ids,
            category_clicks,
        )

    def save(self, folder: str | os.PathLike) -> None:
        np.savez(
            os.path.join(folder, POPULARITY_FILE),
            item_ids=self.item_ids,
            item_clicks=self.item_clicks,
            category_offsets=self.category_offsets,
            category_item_ids=self.category_item_ids,
            category_item_clicks=self.category_item_clicks,
        )

    def config(self) -> dict:
        return {
            "items_column": self.items_column,
            "categories_column": self.categories_column,
            "catalog": self.catalog,
        }

    @classmethod
    def load(cls, config: dict, folder: str | os.PathLike) -> ItemPopularity:
        with np.load(os.path.join(folder, POPULARITY_FILE), allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
        return cls(
            config["items_column"], config["categories_column"], int(config["catalog"]), **arrays
        )


def _list_output(workflow, raw: str, required: bool = False) -> str | None:
    """The workflow's one list output computed from request column ``raw`` (e.g. item_id-list)."""
    found = [
        name for name in derived_columns(workflow, raw) if workflow.output_schema[name].is_list
    ]
    if len(found) == 1:
        return found[0]
    if required or found:
        raise ValueError(
            f"ItemPopularity needs the one list output of the workflow made from {raw!r}; it"
            f" makes {found or 'none'}"
        )
    logger.info("ItemPopularity: the workflow has no list of %r; popularity is global only", raw)
    return None


def _encoded(vocabulary: CategoryVocabulary, raw: pd.Series) -> np.ndarray:
    """The encoded id of each raw value; -1 for values outside the vocabulary."""
    ids = np.flatnonzero(vocabulary.is_item)
    positions = pd.Index(vocabulary.raw_values[ids]).get_indexer(raw.to_numpy())
    return np.where(positions >= 0, ids[positions], -1).astype(np.int64)


def _ranked(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``ids`` by their count, most first (ties by id), and the counts."""
    distinct, counts = np.unique(ids, return_counts=True)
    order = np.lexsort((distinct, -counts))
    return distinct[order].astype(np.int64), counts[order].astype(np.int64)


def _per_category(
    categories: np.ndarray, ids: np.ndarray, depth: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets by category id, and each category's ``depth`` most clicked items (ties by id) and
    their clicks; clicks of an unknown category are left out."""
    known = categories >= 0
    categories, ids = categories[known], ids[known]
    size = int(categories.max()) + 1 if len(categories) else 0
    stride = int(ids.max()) + 1 if len(ids) else 1
    pairs, counts = np.unique(categories * stride + ids, return_counts=True)
    category, item = pairs // stride, pairs % stride
    order = np.lexsort((item, -counts, category))
    category, item, counts = category[order], item[order], counts[order]
    starts = np.searchsorted(category, np.arange(size))
    kept = np.arange(len(category)) - starts[category] < depth
    category, item, counts = category[kept], item[kept], counts[kept]
    offsets = np.searchsorted(category, np.arange(size + 1)).astype(np.int64)
    return offsets, item.astype(np.int64), counts.astype(np.int64)
