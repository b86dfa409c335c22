"""The live-sessions example's graph and replay on a real Redis: a held-out session sent one click
per request answers as the stateless graph answers its whole history, until an item is blocked,
which then leaves every answer. In-process: served live graphs are checked against in-process ones
in tests/integration/test_live_sessions_serving.py (the example's ``main`` serves this graph on two
tritonservers)."""

from __future__ import annotations

import numpy as np

from examples.live_sessions import demo
from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import Ensemble, RedisSettings
from tests.redis_fixtures import unique_prefix


class InProcess:
    """What ``replay`` asks of a client, answered by the graph in this process."""

    def __init__(self, graph: Ensemble):
        self.graph = graph

    def infer(self, model: str, frame):
        assert model == demo.MODEL_NAME
        return self.graph.transform(frame)


def test_a_session_replayed_click_by_click_answers_as_its_whole_history_until_an_item_is_blocked(
    redis_server, session_workflow, xlnet, session_split
):
    store = RedisSettings(redis_server.url, key_prefix=unique_prefix("example"))
    live = demo.live_graph(session_workflow, xlnet.served, store)
    held_out = session_split[1]
    lengths = held_out.groupby("session_id")["session_id"].transform("size")
    session_id = held_out.loc[lengths >= 5, "session_id"].iloc[0]
    session = held_out[held_out["session_id"] == session_id].sort_values("timestamp").iloc[:5]
    answers = demo.replay([InProcess(live)], session, store, block_at=3)

    stateless = Ensemble(
        recommendation_graph(session_workflow, xlnet.served, k=demo.TOP_K),
        session_workflow.input_schema,
    )
    for position in range(3):
        whole = stateless.transform(session.iloc[: position + 1])
        np.testing.assert_array_equal(answers[position]["item_ids"][0], whole["item_ids"][0])
        np.testing.assert_array_equal(answers[position]["item_scores"][0], whole["item_scores"][0])
    blocked = int(answers[2]["item_ids"][0][0])
    for answer in answers[3:]:
        assert blocked not in answer["item_ids"][0]
        assert len(answer["item_ids"][0]) == demo.TOP_K
