"""The session example compiled ahead of time (``compiled="package"``): the all-libtorch export
(its workflow, model, top k and decoding) as one AOTInductor package, served by a tritonserver
whose backend folder holds the pytorch backend alone, and the mixed export (workflow on the python
backend, the rest one package) on a server with both backends.

Requests of 1, 7 and 64 sessions hold an over-long and a single-click session and unseen items,
rows shuffled. Served answers equal in-process answers bit for bit over gRPC and HTTP (both run
the same package), and both are within the packages' tolerance of the eager model on NVTabular's
own transform. A request without clicks is answered with no sessions; one whose columns differ in
length is refused naming the column, in-process and served.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import Client, Ensemble, InputError
from merlin_torch_serving.aot.tolerance import SCORE_TOLERANCE
from tests.served import assert_frames_equal, raw_infer
from tests.session_models import (
    SERVED_TORCH_THREADS,
    assert_same_recommendations,
    eager_top_k,
    request_rows,
    torch_threads,
)

pytestmark = pytest.mark.integration

TOP_K = 10
SESSION_COUNTS = (1, 7, 64)
NAME = "compiled-xlnet"
MIXED = "compiled-xlnet-mixed"


@pytest.fixture(scope="module")
def ensembles(session_workflow, xlnet) -> dict[str, Ensemble]:
    return {
        NAME: Ensemble(
            recommendation_graph(
                session_workflow,
                xlnet.served,
                k=TOP_K,
                backend="pytorch",
                workflow_backend="pytorch",
                compiled="package",
            ),
            session_workflow.input_schema,
        ),
        MIXED: Ensemble(
            recommendation_graph(
                session_workflow, xlnet.served, k=TOP_K, backend="pytorch", compiled="package"
            ),
            session_workflow.input_schema,
        ),
    }


@pytest.fixture(scope="module")
def served(pytorch_only_server, triton_server, ensembles) -> dict:
    exported = {}
    for name, server in ((NAME, pytorch_only_server), (MIXED, triton_server)):
        exported[name] = (server, ensembles[name].export(server.repository, name))
        server.load(name)
    return exported


def _steps(server, name: str) -> list[dict]:
    manifest = json.loads((Path(server.repository) / name / "1" / "manifest.json").read_text())
    return manifest["steps"]


def test_the_all_libtorch_export_is_one_package_on_a_server_without_python(served):
    server, result = served[NAME]
    assert server.backends() == ["ensemble", "pytorch"]
    [step] = _steps(server, NAME)
    assert (step["backend"], step["compiled"]) == ("pytorch", "package")
    assert step["fused_operators"] == [
        "TransformWorkflow",
        "PredictPytorch[pytorch]",
        f"TopK(k={TOP_K})",
        "DecodeItemIds('item_id')",
    ]
    model_dir = Path(server.repository) / step["model"] / "1"
    assert sorted(path.name for path in model_dir.iterdir()) == ["model.pt2"]
    assert result.warnings == []


def test_the_mixed_export_makes_the_model_and_what_follows_it_one_package(served):
    server, result = served[MIXED]
    steps = _steps(server, MIXED)
    assert [(step["backend"], step.get("compiled")) for step in steps] == [
        ("python", None),
        ("pytorch", "package"),
    ]
    assert result.warnings == []


@pytest.mark.parametrize("name", [NAME, MIXED])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_answer_equals_in_process_exactly(
    served, ensembles, session_split, name, protocol, n_sessions
):
    server, _ = served[name]
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)
    url = server.grpc_url if protocol == "grpc" else server.http_url

    answer = Client(url, protocol=protocol).infer(name, rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = ensembles[name].transform(rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert_frames_equal(answer, in_process)


@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_answers_are_within_the_tolerance_of_the_eager_model(
    ensembles, session_workflow, xlnet, session_split, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=100 + n_sessions)
    with torch_threads(SERVED_TORCH_THREADS):
        answer = ensembles[NAME].transform(rows)
    expected = eager_top_k(session_workflow, xlnet.eager, rows, TOP_K, decoded=True)

    assert sorted(answer["session_id"]) == sorted(expected.index)
    assert_same_recommendations(
        answer, expected, session_workflow, decoded=True, tolerance=SCORE_TOLERANCE
    )


def test_a_request_without_clicks_is_answered_with_no_sessions(served, ensembles, session_workflow):
    server, _ = served[NAME]
    rows = pd.DataFrame(
        {name: np.array([], dtype=np.int64) for name in session_workflow.input_schema.column_names}
    )
    answer = Client(server.grpc_url).infer(NAME, rows)
    assert len(answer) == 0
    assert_frames_equal(answer, ensembles[NAME].transform(rows))


def test_a_request_with_a_column_short_of_rows_is_refused_naming_it(served, ensembles):
    import tritonclient.grpc

    server, _ = served[NAME]
    arrays = {
        "session_id": np.array([1, 1, 2], dtype=np.int64),
        "item_id": np.array([5, 6], dtype=np.int64),
        "category": np.array([1, 1, 1], dtype=np.int64),
        "timestamp": np.array([1, 2, 3], dtype=np.int64),
    }
    with pytest.raises(Exception, match=r"input column 'item_id': expected as many rows as '"):
        raw_infer(tritonclient.grpc, server.grpc_url, NAME, arrays, ["item_ids"])
    as_lists = {name: list(array) for name, array in arrays.items()}
    with pytest.raises(InputError, match="item_id"):
        Client(server.grpc_url).infer(NAME, as_lists)
    with pytest.raises(InputError, match="item_id"):
        ensembles[NAME].transform(as_lists)
    # and the server goes on
    assert all(model.healthy for model in server.health())
