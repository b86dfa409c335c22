"""The session example with its workflow compiled to TorchScript (``TransformWorkflow(...,
backend="pytorch")``): one libtorch model from raw clicks to raw item ids and scores, served by a
tritonserver whose backend folder holds the pytorch backend alone (no python backend at all).

Requests of 1, 7 and 64 sessions hold an over-long and a single-click session and unseen items,
rows shuffled. Served answers equal in-process answers bit for bit over gRPC and HTTP, and both
equal what NVTabular's own ``workflow.transform`` followed by the model gives. The batched export
(a small libtorch model counts each request's sessions before it) answers many concurrent
requests, each its own answer, and Triton forms batches of several of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import (
    Client,
    DecodeItemIds,
    Ensemble,
    InputError,
    ModelOptions,
    PredictPytorch,
    TopK,
)
from merlin_torch_serving.export.libtorch_feeder import FEEDER_SUFFIX
from tests.served import assert_frames_equal, batches_formed, concurrent_answers, frames_equal
from tests.session_models import RESERVED_IDS, SERVED_TORCH_THREADS, request_rows, torch_threads

pytestmark = pytest.mark.integration

TOP_K = 10
SESSION_COUNTS = (1, 7, 64)
NAME = "scripted-xlnet"
BATCHED = "scripted-xlnet-batched"
STEP = "-0-transformworkflow_predictpytorch_topk_decodeitemids"


@pytest.fixture(scope="module")
def ensemble(session_workflow, xlnet) -> Ensemble:
    graph = recommendation_graph(
        session_workflow, xlnet.served, k=TOP_K, backend="pytorch", workflow_backend="pytorch"
    )
    return Ensemble(graph, session_workflow.input_schema)


@pytest.fixture(scope="module")
def served(pytorch_only_server, ensemble) -> dict:
    results = {
        NAME: ensemble.export(pytorch_only_server.repository, NAME),
        BATCHED: ensemble.export(
            pytorch_only_server.repository, BATCHED, options=ModelOptions(batching=True)
        ),
    }
    for name in results:
        pytorch_only_server.load(name)
    return results


def test_the_whole_graph_is_one_libtorch_model_on_a_server_without_python(
    served, pytorch_only_server
):
    assert pytorch_only_server.backends() == ["ensemble", "pytorch"]
    manifest = json.loads(
        (Path(pytorch_only_server.repository) / NAME / "1" / "manifest.json").read_text()
    )
    assert [(step["backend"], step["fused_operators"]) for step in manifest["steps"]] == [
        (
            "pytorch",
            [
                "TransformWorkflow",
                "PredictPytorch[pytorch]",
                f"TopK(k={TOP_K})",
                "DecodeItemIds('item_id')",
            ],
        )
    ]
    assert served[NAME].warnings == []
    # batched: the session counter before it, and no warning that a step answers alone
    assert served[BATCHED].models == [BATCHED + STEP + FEEDER_SUFFIX, BATCHED + STEP, BATCHED]
    assert served[BATCHED].warnings == []


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_answer_equals_in_process_exactly(
    served, pytorch_only_server, ensemble, session_split, protocol, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)
    url = pytorch_only_server.grpc_url if protocol == "grpc" else pytorch_only_server.http_url

    answer = Client(url, protocol=protocol).infer(NAME, rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = ensemble.transform(rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert_frames_equal(answer, in_process)


@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_in_process_answer_equals_nvtabular_then_the_model(
    ensemble, session_workflow, xlnet, session_split, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=50 + n_sessions)
    # the reference: NVTabular's own transform, then the model, its top k and the decoding
    features = session_workflow.transform(rows[session_workflow.input_schema.column_names])
    model_schema = session_workflow.output_schema
    after_workflow = Ensemble(
        model_schema.column_names
        >> PredictPytorch(xlnet.served, backend="pytorch")
        >> TopK(TOP_K, seen_items="item_id-list", exclude_ids=RESERVED_IDS)
        >> DecodeItemIds(session_workflow, source_column="item_id"),
        model_schema,
    )
    with torch_threads(SERVED_TORCH_THREADS):
        reference = after_workflow.transform(features).set_index(features["session_id"])
        in_process = ensemble.transform(rows).set_index("session_id")

    assert sorted(in_process.index) == sorted(reference.index)
    assert_frames_equal(in_process.loc[reference.index], reference)


def test_a_request_without_clicks_is_answered_with_no_sessions(
    served, pytorch_only_server, ensemble, session_workflow
):
    rows = pd.DataFrame(
        {name: np.array([], dtype=np.int64) for name in session_workflow.input_schema.column_names}
    )
    answer = Client(pytorch_only_server.grpc_url).infer(NAME, rows)
    assert len(answer) == 0
    assert_frames_equal(answer, ensemble.transform(rows))


def test_a_request_with_a_column_short_of_rows_is_refused_naming_it(served, pytorch_only_server):
    import tritonclient.grpc

    from tests.served import raw_infer

    arrays = {
        "session_id": np.array([1, 1, 2], dtype=np.int64),
        "item_id": np.array([5, 6], dtype=np.int64),
        "category": np.array([1, 1, 1], dtype=np.int64),
        "timestamp": np.array([1, 2, 3], dtype=np.int64),
    }
    with pytest.raises(Exception, match=r"input column 'item_id': expected 3 rows"):
        raw_infer(tritonclient.grpc, pytorch_only_server.grpc_url, NAME, arrays, ["item_ids"])
    with pytest.raises(InputError, match="item_id"):
        Client(pytorch_only_server.grpc_url).infer(
            NAME, {name: list(array) for name, array in arrays.items()}
        )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_batched_answers_to_concurrent_requests_equal_in_process(
    served, pytorch_only_server, ensemble, session_split, session_workflow, protocol
):
    _, held_out = session_split
    requests = [request_rows(held_out, n, seed=n) for n in (1, 7, 64, 2, 3)]
    for i, rows in enumerate(requests):
        rows["session_id"] += i * 1_000_000
    requests.append(held_out.iloc[:0][session_workflow.input_schema.column_names].copy())
    first = requests[1][requests[1]["session_id"] == requests[1]["session_id"].iloc[0]]
    requests.append(first.iloc[::-1].reset_index(drop=True))  # a session id another request has
    with torch_threads(SERVED_TORCH_THREADS):
        expected = [ensemble.transform(rows) for rows in requests]
    url = pytorch_only_server.grpc_url if protocol == "grpc" else pytorch_only_server.http_url

    answers = concurrent_answers(url, protocol, BATCHED, requests, rounds=3, threads=12)

    wrong = [index for index, answer in answers if not frames_equal(answer, expected[index])]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers differ, e.g. request {wrong[0]}"


def test_triton_batches_requests_to_the_libtorch_model(served, pytorch_only_server, session_split):
    _, held_out = session_split
    requests = [request_rows(held_out, 1, seed=seed) for seed in range(4)]
    for i, rows in enumerate(requests):
        rows["session_id"] += i * 1_000_000

    concurrent_answers(
        pytorch_only_server.grpc_url, "grpc", BATCHED, requests, rounds=8, threads=16
    )

    formed = batches_formed(
        pytorch_only_server.http_url, BATCHED + STEP, pytorch_only_server.admin_key
    )
    assert max(formed) > 1, f"batch sizes formed: {formed}"
