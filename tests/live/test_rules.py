"""Block lists kept in a store, read while a graph runs: TopK and FilterCandidates leave blocked
items out at the next read, raw ids encoded through the workflow's vocabulary, and a store that
fails leaves the last list in force."""

from __future__ import annotations

import numpy as np
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import BlockList, Ensemble, FilterCandidates
from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.stores import open_store
from tests.live_graphs import clicks_of, live_ensemble
from tests.redis_fixtures import fresh_redis_server


def test_topk_leaves_out_items_blocked_while_it_runs(store, toy_workflow, toy_model):
    live = live_ensemble(toy_workflow, toy_model, store, block_list=True, block_refresh_s=0.0)
    vocabulary = CategoryVocabulary.from_workflow(toy_workflow, "item_id")
    new = clicks_of(4, 50_000).groupby("session_id").head(3)
    before = live.transform(new)
    best = int(np.asarray(before["item_ids"].iloc[0])[0])
    raw = str(vocabulary.decode(np.array([best]))[0])
    with open_store(store) as opened:
        opened.block("blocked", [raw, "no-such-item"])
        after = live.transform(new)  # the same clicks: the history does not change
        assert best not in np.concatenate(after["item_ids"].to_numpy())
        np.testing.assert_array_equal(
            np.asarray(after["item_ids"].iloc[0])[:2], np.asarray(before["item_ids"].iloc[0])[1:]
        )
        opened.unblock("blocked", [raw])
    np.testing.assert_array_equal(
        np.stack(live.transform(new)["item_ids"]), np.stack(before["item_ids"])
    )


def test_filter_candidates_drops_blocked_ids_and_keeps_the_last_list_when_the_store_fails(
    tmp_path,
):
    request = Schema([ColumnSchema("candidate_ids", dtype="int64", dims=(None, 4))])
    table = TensorTable({"candidate_ids": np.array([[5, 6, 7, 8], [8, 9, 5, 1]])})
    with fresh_redis_server(tmp_path) as server:
        blocked = BlockList(server.url, "stock", refresh_s=0.0, retry_after_s=0.0)
        graph = Ensemble(["candidate_ids"] >> FilterCandidates(block_list=blocked), request)
        with open_store(server.url) as opened:
            opened.block("stock", ["5", "9"])
        kept = graph.run(table)
        np.testing.assert_array_equal(kept["candidate_ids"].values, [6, 7, 8, 8, 1])
    # the server is gone: the list read last stays in force, the request is answered
    again = graph.run(table)
    np.testing.assert_array_equal(again["candidate_ids"].values, [6, 7, 8, 8, 1])
    assert not blocked.guard.state.reachable


def test_a_block_list_without_a_vocabulary_holds_the_ids_the_operator_sees(store):
    with open_store(store) as opened:
        opened.block("ids", ["3", "12", "not-an-id"])
    assert BlockList(store, "ids").ids().tolist() == [3, 12]


def test_a_block_list_comes_back_from_an_export(toy_workflow, tmp_path):
    blocked = BlockList(tmp_path / "store", "l", vocabulary=toy_workflow, refresh_s=0.0)
    blocked.save(tmp_path)
    loaded = BlockList.load(blocked.config(), tmp_path)
    with open_store(tmp_path / "store") as opened:
        opened.block("l", ["500", "501"])
    assert loaded.ids().tolist() == blocked.ids().tolist()
    assert len(loaded.ids()) == 2
