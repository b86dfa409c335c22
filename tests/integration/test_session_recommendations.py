"""The session-based example served on the real tritonserver: a trained Transformers4Rec XLNet
model behind its NVTabular workflow, queried with raw clicks.

The reference is the eager model on NVTabular's own transform, computed here independently of the
library: pad each session's last clicks, score the whole catalog, leave out the session's items and
the reserved ids, take the top 10, map encoded ids back to raw ids. Served ids must equal it; scores
agree within SCORE_TOLERANCE (the eager model scores a different batch, and XLNet's float32 matmuls
round differently with the batch's shape: ~1e-6 measured). Served and in-process answers of the
library itself must be equal exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from examples.session_based import data, features, model
from examples.session_based.demo import MODEL_NAME, RESERVED_IDS, TOP_K, recommendation_graph
from merlin_torch_serving import Client, Ensemble

pytestmark = pytest.mark.integration

MAX_SEQUENCE_LENGTH = 20
SCORE_TOLERANCE = 1e-4
UNSEEN_ITEM_ID = 900_000_000  # raw ids from here on never occur in training


@pytest.fixture(scope="module")
def clicks():
    return data.generate_interactions(n_sessions=1500, n_items=400, n_categories=20, seed=11)


@pytest.fixture(scope="module")
def split(clicks):
    return data.split_by_time(clicks, held_out_fraction=0.2)


@pytest.fixture(scope="module")
def workflow(split, tmp_path_factory):
    train, _ = split
    return features.fit_workflow(train, tmp_path_factory.mktemp("session_workflow"), max_sequence_length=MAX_SEQUENCE_LENGTH)


@pytest.fixture(scope="module")
def session_model(workflow, split):
    train, _ = split
    xlnet = model.build_model(workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=32)
    model.train(xlnet, features.transform(workflow, train), epochs=2, progress=False)
    return xlnet.eval()


@pytest.fixture(scope="module")
def ensemble(triton_server, workflow, session_model):
    ensemble = Ensemble(recommendation_graph(workflow, session_model), workflow.input_schema)
    ensemble.export(triton_server.repository, MODEL_NAME)
    triton_server.load(MODEL_NAME)
    return ensemble


@pytest.fixture(scope="module")
def client(triton_server, ensemble):
    return Client(triton_server.grpc_url)


def request_rows(held_out: pd.DataFrame, n_sessions: int, seed: int) -> pd.DataFrame:
    """Raw clicks of ``n_sessions`` held-out sessions, shuffled: the longest session (longer than
    the model's maximum length) and a single-click one always among them, and about one click in
    five replaced by an item never seen in training."""
    rng = np.random.default_rng(seed)
    lengths = held_out.groupby("session_id").size()
    longest, single = lengths.idxmax(), lengths[lengths == 1].index[0]
    assert lengths[longest] > MAX_SEQUENCE_LENGTH
    others = lengths.index.difference([longest, single]).to_numpy()
    chosen = [longest, single][:n_sessions] + list(rng.choice(others, max(n_sessions - 2, 0), replace=False))
    rows = held_out[held_out["session_id"].isin(chosen)].copy()
    unseen = rng.random(len(rows)) < 0.2
    rows.loc[unseen, "item_id"] = UNSEEN_ITEM_ID + np.arange(unseen.sum())
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def eager_top_k(workflow, session_model, rows: pd.DataFrame) -> pd.DataFrame:
    """Per session (sorted by id): encoded and raw top-k ids, their scores, and all scores."""
    sessions = features.transform(workflow, rows)
    inputs = model.padded_inputs(sessions, max_sequence_length=MAX_SEQUENCE_LENGTH)
    with torch.no_grad():
        scores = session_model(inputs).numpy()
    masked = scores.copy()
    masked[:, list(RESERVED_IDS)] = -np.inf
    for row, seen in enumerate(sessions["item_id-list"]):
        masked[row, np.asarray(seen, dtype=np.int64)] = -np.inf
    encoded = np.argsort(-masked, axis=1, kind="stable")[:, :TOP_K]
    raw = features.item_id_lookup(workflow)[encoded]
    return pd.DataFrame(
        {
            "encoded_ids": list(encoded),
            "item_ids": list(raw),
            "item_scores": list(np.take_along_axis(scores, encoded, axis=1)),
            "all_scores": list(scores),
        },
        index=sessions["session_id"].to_numpy(),
    )


def assert_same_recommendations(answer: pd.DataFrame, expected: pd.DataFrame, workflow) -> None:
    """Same ids in the same order, except where two eager scores are closer than the tolerance
    (a near tie may swap); scores within the tolerance."""
    encode = {int(raw): encoded for encoded, raw in enumerate(features.item_id_lookup(workflow)) if raw >= 0}
    for session_id, ids, scores in zip(answer["session_id"], answer["item_ids"], answer["item_scores"]):
        want = expected.loc[session_id]
        np.testing.assert_allclose(scores, want["item_scores"], rtol=0, atol=SCORE_TOLERANCE, err_msg=f"session {session_id}")
        for position, (got, wanted) in enumerate(zip(ids, want["item_ids"])):
            if got != wanted:
                eager_score_of_got = want["all_scores"][encode[int(got)]]
                assert abs(eager_score_of_got - want["item_scores"][position]) <= SCORE_TOLERANCE, (
                    f"session {session_id}, rank {position + 1}: served item {got}, eager item {wanted}"
                )


@pytest.mark.parametrize("n_sessions", [1, 7, 64])
def test_served_top_k_equals_eager_model_top_k(client, ensemble, workflow, session_model, split, n_sessions):
    _, held_out = split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)

    answer = client.infer(MODEL_NAME, rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert answer["item_ids"].map(len).eq(TOP_K).all()
    assert_same_recommendations(answer, eager_top_k(workflow, session_model, rows), workflow)


def test_recommendations_leave_out_clicked_items_and_reserved_ids(client, ensemble, split):
    _, held_out = split
    rows = request_rows(held_out, 7, seed=5)
    answer = client.infer(MODEL_NAME, rows)
    clicked = rows.groupby("session_id")["item_id"].apply(set)
    for session_id, ids in zip(answer["session_id"], answer["item_ids"]):
        repeated = set(ids) & clicked[session_id]
        # only clicks older than the model's window may come back
        recent = set(rows[rows.session_id == session_id].sort_values("timestamp")["item_id"].tail(MAX_SEQUENCE_LENGTH))
        assert not (repeated & recent)
        assert -1 not in set(ids)  # reserved ids decode to -1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_answer_equals_in_process_answer_exactly(triton_server, ensemble, split, protocol):
    _, held_out = split
    rows = request_rows(held_out, 32, seed=2)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url

    with Client(url, protocol=protocol) as client:
        served = client.infer(MODEL_NAME, rows)
    in_process = ensemble.transform(rows)

    assert served["session_id"].tolist() == in_process["session_id"].tolist()
    for name in ("item_ids", "item_scores"):
        np.testing.assert_array_equal(np.stack(served[name]), np.stack(in_process[name]), err_msg=name)


def test_merlin_systems_client_helper_gets_the_same_answer(triton_server, client, ensemble, workflow, split):
    from merlin.systems.triton.utils import send_triton_request

    _, held_out = split
    rows = request_rows(held_out, 7, seed=3)
    outputs = client.schemas(MODEL_NAME).response_names

    merlin_answer = send_triton_request(
        workflow.input_schema,
        rows[workflow.input_schema.column_names],
        list(outputs.values()),
        endpoint=triton_server.grpc_url,
        triton_model=MODEL_NAME,
    )
    ours = client.infer(MODEL_NAME, rows)

    assert merlin_answer[outputs["session_id"]].tolist() == ours["session_id"].tolist()
    np.testing.assert_array_equal(merlin_answer[outputs["item_ids"]], np.stack(ours["item_ids"]))
    np.testing.assert_array_equal(merlin_answer[outputs["item_scores"]], np.stack(ours["item_scores"]))
