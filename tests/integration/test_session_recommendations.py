"""The session-based example served on the real tritonserver, all on the python backend: the
trained Transformers4Rec XLNet behind its NVTabular workflow, queried with raw clicks.

Served ids equal the eager model's top-k (tests/session_models.py states the reference and its
tolerance); served and in-process answers of the library itself are equal exactly, the in-process
run using the torch threads served models run with (see ``session_models.torch_threads``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from examples.session_based.demo import MODEL_NAME, TOP_K, recommendation_graph
from merlin_torch_serving import Client, Ensemble
from tests.served import assert_async_client_answers_as_client
from tests.session_models import (
    MAX_SEQUENCE_LENGTH,
    SERVED_TORCH_THREADS,
    assert_same_recommendations,
    eager_top_k,
    request_rows,
    torch_threads,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ensemble(triton_server, session_workflow, xlnet):
    ensemble = Ensemble(
        recommendation_graph(session_workflow, xlnet.served, backend="python"),
        session_workflow.input_schema,
    )
    ensemble.export(triton_server.repository, MODEL_NAME)
    triton_server.load(MODEL_NAME)
    return ensemble


@pytest.fixture(scope="module")
def client(triton_server, ensemble):
    return Client(triton_server.grpc_url)


@pytest.mark.parametrize("n_sessions", [1, 7, 64])
def test_served_top_k_equals_eager_model_top_k(
    client, ensemble, session_workflow, xlnet, session_split, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)

    answer = client.infer(MODEL_NAME, rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert answer["item_ids"].map(len).eq(TOP_K).all()
    expected = eager_top_k(session_workflow, xlnet.eager, rows, TOP_K, decoded=True)
    assert_same_recommendations(answer, expected, session_workflow, decoded=True)


def test_recommendations_leave_out_clicked_items_and_reserved_ids(client, ensemble, session_split):
    _, held_out = session_split
    rows = request_rows(held_out, 7, seed=5)
    answer = client.infer(MODEL_NAME, rows)
    clicked = rows.groupby("session_id")["item_id"].apply(set)
    for session_id, ids in zip(answer["session_id"], answer["item_ids"], strict=True):
        repeated = set(ids) & clicked[session_id]
        # only clicks older than the model's window may come back
        recent = set(
            rows[rows.session_id == session_id]
            .sort_values("timestamp")["item_id"]
            .tail(MAX_SEQUENCE_LENGTH)
        )
        assert not (repeated & recent)
        assert -1 not in set(ids)  # reserved ids decode to -1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_answer_equals_in_process_answer_exactly(
    triton_server, ensemble, session_split, protocol
):
    _, held_out = session_split
    rows = request_rows(held_out, 32, seed=2)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url

    with Client(url, protocol=protocol) as client:
        served = client.infer(MODEL_NAME, rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = ensemble.transform(rows)

    assert served["session_id"].tolist() == in_process["session_id"].tolist()
    for name in ("item_ids", "item_scores"):
        np.testing.assert_array_equal(
            np.stack(served[name]), np.stack(in_process[name]), err_msg=name
        )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_async_client_answers_what_client_answers(triton_server, ensemble, session_split, protocol):
    _, held_out = session_split
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    requests = [request_rows(held_out, sessions, seed=sessions) for sessions in (1, 7, 64)]
    assert_async_client_answers_as_client(url, protocol, MODEL_NAME, requests)


def test_merlin_systems_client_helper_gets_the_same_answer(
    triton_server, client, ensemble, session_workflow, session_split
):
    from merlin.systems.triton.utils import send_triton_request

    _, held_out = session_split
    rows = request_rows(held_out, 7, seed=3)
    outputs = client.schemas(MODEL_NAME).response_names

    merlin_answer = send_triton_request(
        session_workflow.input_schema,
        rows[session_workflow.input_schema.column_names],
        list(outputs.values()),
        endpoint=triton_server.grpc_url,
        triton_model=MODEL_NAME,
    )
    ours = client.infer(MODEL_NAME, rows)

    assert merlin_answer[outputs["session_id"]].tolist() == ours["session_id"].tolist()
    np.testing.assert_array_equal(merlin_answer[outputs["item_ids"]], np.stack(ours["item_ids"]))
    np.testing.assert_array_equal(
        merlin_answer[outputs["item_scores"]], np.stack(ours["item_scores"])
    )
