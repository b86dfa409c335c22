"""The features a store holds for the example: per item its category, price bucket, popularity and
tags (a list), per session its device, made from the training clicks and the fitted workflow.

Items carry their raw ids (the workflow's vocabulary), as a feature store keys them; the category is
the workflow's encoded category, the id the ranker embeds. Price buckets, tags and devices are
seeded draws: the synthetic clicks do not depend on them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from examples.session_based import features as session_features
from examples.session_based.features import OUT_OF_VOCABULARY_ID
from merlin_torch_serving import CategoryVocabulary

PRICE_BUCKETS, TAG_IDS, DEVICES = 5, 16, 3


def item_table(workflow, train: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per item of the workflow's vocabulary: item_id (raw), category (encoded),
    price_bucket, popularity (log of 1 + its training clicks, float32), tags (0 to 3 ids)."""
    raw_ids = session_features.item_id_lookup(workflow)
    items = np.flatnonzero(raw_ids >= 0)
    raw = raw_ids[items].astype(np.int64)
    category_of = train.drop_duplicates("item_id").set_index("item_id")["category"]
    encoded_category = _encoder(workflow, "category")
    clicks = train["item_id"].value_counts()
    rng = np.random.default_rng(seed)
    tag_counts = rng.integers(0, 4, len(raw))
    return pd.DataFrame(
        {
            "item_id": raw,
            "category": encoded_category(category_of.reindex(raw).to_numpy()),
            "price_bucket": rng.integers(0, PRICE_BUCKETS, len(raw)).astype(np.int64),
            "popularity": np.log1p(clicks.reindex(raw).fillna(0).to_numpy()).astype(np.float32),
            "tags": [rng.integers(1, TAG_IDS, n).astype(np.int64) for n in tag_counts],
        }
    )


def session_table(sessions: np.ndarray, seed: int = 0) -> pd.DataFrame:
    """One row per session id: its device (0 to 2)."""
    rng = np.random.default_rng(seed)
    sessions = np.unique(np.asarray(sessions, dtype=np.int64))
    return pd.DataFrame(
        {"session_id": sessions, "device": rng.integers(0, DEVICES, len(sessions)).astype(np.int64)}
    )


def category_count(workflow) -> int:
    """How many encoded categories there are (the ranker's embedding size)."""
    return int(workflow.output_schema["category-list"].properties["domain"]["max"]) + 1


def _encoder(workflow, column: str):
    """Raw values of ``column`` to the workflow's encoded ids (out of vocabulary for others)."""
    vocabulary = CategoryVocabulary.from_workflow(workflow, column)
    lookup = {
        int(value): encoded
        for encoded, (value, is_item) in enumerate(
            zip(vocabulary.raw_values, vocabulary.is_item, strict=True)
        )
        if is_item
    }

    def encode(values: np.ndarray) -> np.ndarray:
        return np.array(
            [
                lookup.get(int(v), OUT_OF_VOCABULARY_ID) if v == v else OUT_OF_VOCABULARY_ID
                for v in values
            ],
            dtype=np.int64,
        )

    return encode
