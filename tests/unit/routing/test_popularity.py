"""The most-popular fallback: popularity fitted on training clicks, and the items it recommends."""

import json

import numpy as np
import pandas as pd
import pytest
from merlin.table import TensorTable

from merlin_torch_serving import CategoryVocabulary, ItemPopularity, MostPopular
from tests import toy_session


@pytest.fixture(scope="module")
def clicks():
    return toy_session.interactions()  # what the workflow was fitted on


@pytest.fixture(scope="module")
def encoded(clicks, filtered_toy_workflow):
    """The clicks with their encoded item and category ids, as the workflow encodes them."""
    frame = clicks.copy()
    for column in ("item_id", "category"):
        vocabulary = CategoryVocabulary.from_workflow(filtered_toy_workflow, column)
        ids = np.flatnonzero(vocabulary.is_item)
        lookup = dict(zip(vocabulary.raw_values[ids].tolist(), ids.tolist(), strict=True))
        frame[column] = frame[column].map(lookup)
    return frame


def ranked(counts: pd.Series) -> list[int]:
    """Ids by count, most first, ties by id."""
    frame = counts.rename("clicks").reset_index()
    frame.columns = ["id", "clicks"]
    return frame.sort_values(["clicks", "id"], ascending=[False, True])["id"].tolist()


def test_popularity_ranks_the_workflows_encoded_items_by_their_training_clicks(
    clicks, encoded, filtered_toy_workflow
):
    popularity = ItemPopularity.fit(clicks, filtered_toy_workflow)
    assert popularity.items_column == "item_id-list"
    assert popularity.categories_column == "category-list"
    assert popularity.item_ids.tolist() == ranked(encoded["item_id"].value_counts())
    counts = encoded["item_id"].value_counts()
    assert popularity.item_clicks.tolist() == counts[popularity.item_ids].tolist()
    for category, items in encoded.groupby("category")["item_id"]:
        start, end = popularity.category_offsets[category : category + 2]
        assert popularity.category_item_ids[start:end].tolist() == ranked(items.value_counts())


def test_a_window_counts_only_the_latest_clicks(clicks, encoded, filtered_toy_workflow):
    window = 2_000
    popularity = ItemPopularity.fit(clicks, filtered_toy_workflow, window=window)
    recent = encoded[clicks["timestamp"] > clicks["timestamp"].max() - window]
    assert 0 < len(recent) < len(clicks)
    assert popularity.item_ids.tolist() == ranked(recent["item_id"].value_counts())


def test_without_a_category_the_popularity_is_the_catalogs(clicks, filtered_toy_workflow):
    popularity = ItemPopularity.fit(clicks, filtered_toy_workflow, category=None, depth=2)
    assert popularity.categories_column is None
    assert popularity.category_offsets.tolist() == [0]


def session(items, categories) -> TensorTable:
    offsets = np.array([0, len(items)], dtype=np.int32)
    return TensorTable(
        {
            "item_id-list": (np.array(items, dtype=np.int64), offsets),
            "category-list": (np.array(categories, dtype=np.int64), offsets),
        },
        _unsafe=True,
    )


def test_most_popular_takes_the_last_items_category_then_the_catalog_leaving_out_its_items(
    clicks, filtered_toy_workflow
):
    popularity = ItemPopularity.fit(clicks, filtered_toy_workflow, depth=3)
    category = 4
    start, end = popularity.category_offsets[category : category + 2]
    of_category = popularity.category_item_ids[start:end].tolist()
    seen = [of_category[0], popularity.item_ids[0]]
    answer = MostPopular(popularity, 6).transform(None, session(seen, [0, category]))
    ids = answer["item_ids"].values[0].tolist()
    expected = of_category[1:] + [i for i in popularity.item_ids if i not in seen + of_category]
    assert ids == expected[:6]
    assert len(set(ids)) == 6
    assert not set(ids) & set(seen)
    total = popularity.category_item_clicks[start:end].sum()
    np.testing.assert_allclose(
        answer["item_scores"].values[0][:2],
        popularity.category_item_clicks[start + 1 : start + 3] / total,
        rtol=1e-6,
    )


def test_an_empty_session_gets_the_catalogs_most_popular_and_padding_past_the_catalog(
    clicks, filtered_toy_workflow
):
    popularity = ItemPopularity.fit(clicks, filtered_toy_workflow)
    items = len(popularity.item_ids)
    answer = MostPopular(popularity, items + 2).transform(None, session([], []))
    ids, scores = answer["item_ids"].values[0], answer["item_scores"].values[0]
    assert ids[:items].tolist() == popularity.item_ids.tolist()
    assert ids[items:].tolist() == [-1, -1]
    assert np.isneginf(scores[items:]).all()
    np.testing.assert_allclose(scores[:items].sum(), 1.0, rtol=1e-5)


def test_most_popular_is_rebuilt_from_its_saved_form(clicks, filtered_toy_workflow, tmp_path):
    op = MostPopular(ItemPopularity.fit(clicks, filtered_toy_workflow), 4)
    op.save_artifacts(str(tmp_path))
    loaded = MostPopular.load(json.loads(json.dumps(op.config())), str(tmp_path))
    request = session([5, 9], [2, 3])
    got, expected = loaded.transform(None, request), op.transform(None, request)
    for column in ("item_ids", "item_scores"):
        np.testing.assert_array_equal(got[column].values, expected[column].values)
