"""FeastFeatures against a real Feast feature server (``feast serve`` over the sqlite online store,
in Feast's own environment; no tritonserver): scalar and list (multi-hot) features exactly as the
feature repository's source tables hold them, defaults for keys the store lacks and for a server
that does not answer, each counted, and the URL taken from the environment where it is set."""

from __future__ import annotations

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from examples.multi_stage.feature_store import ITEM_FEATURES, ITEM_VIEW
from merlin_torch_serving import Ensemble
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage import FeastFeatures
from tests.multistage_fixtures import feature_store_free_url

pytestmark = pytest.mark.integration

REQUEST = Schema([ColumnSchema("item_id", dtype="int64", dims=(None,))])
UNKNOWN_ITEM = 5


def item_features(url, **kwargs) -> Ensemble:
    op = FeastFeatures(
        url,
        view=ITEM_VIEW,
        entity="item_id",
        features=ITEM_FEATURES,
        defaults={"popularity": -1.0, "tags": [0, 0]},
        **kwargs,
    )
    return Ensemble(op.as_node(), REQUEST)


def looked_up(ensemble, keys):
    table = TensorTable({"item_id": np.asarray(keys, dtype=np.int64)})
    with metrics.collecting() as counted:
        return ensemble.run(table), counted.totals


def test_scalar_and_list_features_come_back_as_the_store_holds_them(
    feature_server, multistage_tables
):
    items = multistage_tables.items
    keys = items["item_id"].to_numpy()[[4, 0, 9, 4]].tolist() + [UNKNOWN_ITEM]

    found, counted = looked_up(item_features(feature_server.url), keys)

    rows = items.set_index("item_id").loc[keys[:-1]]
    np.testing.assert_array_equal(found["popularity"].values[:-1], rows["popularity"].to_numpy())
    assert found["popularity"].values.dtype == np.float32
    assert found["popularity"].values[-1] == np.float32(-1.0)
    np.testing.assert_array_equal(found["category"].values[:-1], rows["category"].to_numpy())
    tags = [list(t) for t in rows["tags"]] + [[0, 0]]
    np.testing.assert_array_equal(found["tags"].values, [t for row in tags for t in row])
    np.testing.assert_array_equal(found["tags"].offsets, np.cumsum([0] + [len(t) for t in tags]))
    assert counted[(metrics.MISSING_ENTITIES, (("lookup", ITEM_VIEW),))] == 1


def test_a_feature_server_that_does_not_answer_gives_every_key_its_defaults():
    ensemble = item_features(feature_store_free_url(), timeout_s=0.2)

    found, counted = looked_up(ensemble, [1, 2, 2])

    np.testing.assert_array_equal(found["popularity"].values, np.float32([-1, -1, -1]))
    np.testing.assert_array_equal(found["tags"].offsets, [0, 2, 4, 6])
    assert counted[(metrics.FEATURE_SERVER_ERRORS, (("lookup", ITEM_VIEW),))] == 1
    assert counted[(metrics.UNANSWERED_ENTITIES, (("lookup", ITEM_VIEW),))] == 2
    assert not ensemble.plan.calls[0].op.health().reachable


def test_the_url_comes_from_the_environment_where_it_is_set(
    feature_server, multistage_tables, monkeypatch
):
    monkeypatch.setenv("MTS_TEST_FEAST_URL", feature_server.url)
    ensemble = item_features(feature_store_free_url(), url_env="MTS_TEST_FEAST_URL")

    found, counted = looked_up(ensemble, multistage_tables.items["item_id"][:3])

    assert (metrics.FEATURE_SERVER_ERRORS, (("lookup", ITEM_VIEW),)) not in counted
    np.testing.assert_array_equal(
        found["popularity"].values, multistage_tables.items["popularity"][:3].to_numpy()
    )
    assert ensemble.plan.calls[0].op.health().reachable
