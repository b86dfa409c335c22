"""The session example compiled ahead of time (``compiled="package"``): the all-libtorch export
(its workflow, model, top k and decoding) as one AOTInductor package, served by a tritonserver
whose backend folder holds the pytorch backend alone. The ensemble is the one the guide's block
(docs/guides/compiled-ahead-of-time.md) builds: the block runs as written on this session's
workflow and XLNet (it compiles the package, exports, serves and compares itself), and the tests
serve what it built, so the guide and the tests share one compile. Loaded, the export is warmed
end to end by the launcher, through its package.

Requests of 1, 7 and 64 sessions hold an over-long and a single-click session and unseen items,
rows shuffled. Served answers equal in-process answers bit for bit over gRPC and HTTP (both run
the same package), and both are within the packages' tolerance of the eager model on NVTabular's
own transform. A request without clicks is answered with no sessions; one whose columns differ in
length is refused naming the column, in-process and served. The mixed export (workflow on the
python backend, the rest one package) is served by the official end-to-end and ranking tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import merlin_torch_serving
from merlin_torch_serving import Client, Ensemble, InputError, ModelOptions
from merlin_torch_serving.aot.tolerance import SCORE_TOLERANCE
from tests.examples.test_readme import readme_example
from tests.served import assert_frames_equal, raw_infer, requests_answered_once
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
GUIDE = "Compiled ahead of time: AOTInductor packages"
#: the launcher's warm-up of an ensemble once it loads: warmup_count times over gRPC, once over HTTP
WARMUPS = ModelOptions().warmup_count + 1


@pytest.fixture(scope="module")
def guide(session_workflow, xlnet, session_split, tmp_path_factory) -> dict:
    """The guide's block run as written, on this session's workflow, XLNet and 3 held-out
    sessions, in the names the README's example gives them; its namespace after the run."""
    _, held_out = session_split
    namespace = {
        name: getattr(merlin_torch_serving, name)
        for name in (
            "Client",
            "DecodeItemIds",
            "Ensemble",
            "PredictPytorch",
            "TopK",
            "TransformWorkflow",
            "TritonServer",
        )
    }
    namespace.update(
        workflow=session_workflow,
        t4r_model=xlnet.served,
        request=request_rows(held_out, 3, seed=3),
        work=tmp_path_factory.mktemp("guide"),
    )
    with torch_threads(SERVED_TORCH_THREADS):
        exec(readme_example(GUIDE), namespace)  # the documentation's own block, as written
    return namespace


@pytest.fixture(scope="module")
def compiled(guide) -> Ensemble:
    return guide["compiled"]


@pytest.fixture(scope="module")
def served(pytorch_only_server, compiled):
    """(server, export result, requests each model had answered once loaded: the launcher's
    warm-up through the whole ensemble)."""
    result = compiled.export(pytorch_only_server.repository, NAME)
    pytorch_only_server.load(NAME)
    answered = requests_answered_once(
        pytorch_only_server.http_url, pytorch_only_server.admin_key, NAME, WARMUPS
    )
    return pytorch_only_server, result, answered


def _steps(server, name: str) -> list[dict]:
    manifest = json.loads((Path(server.repository) / name / "1" / "manifest.json").read_text())
    return manifest["steps"]


def test_the_guides_block_serves_what_it_computes_in_process(guide):
    # the block itself compares the item ids; the whole answers are equal bit for bit too
    assert len(guide["served"]) == 3
    assert_frames_equal(guide["served"], guide["in_process"])


def test_the_all_libtorch_export_is_one_package_on_a_server_without_python(served):
    server, result, answered = served
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
    # the launcher's warm-up went through the package on loading
    assert answered[NAME] == WARMUPS
    assert answered[step["model"]] >= WARMUPS


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_answer_equals_in_process_exactly(
    served, compiled, session_split, protocol, n_sessions
):
    server, _, _ = served
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)
    url = server.grpc_url if protocol == "grpc" else server.http_url

    answer = Client(url, protocol=protocol).infer(NAME, rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = compiled.transform(rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert_frames_equal(answer, in_process)


@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_answers_are_within_the_tolerance_of_the_eager_model(
    compiled, session_workflow, xlnet, session_split, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=100 + n_sessions)
    with torch_threads(SERVED_TORCH_THREADS):
        answer = compiled.transform(rows)
    expected = eager_top_k(session_workflow, xlnet.eager, rows, TOP_K, decoded=True)

    assert sorted(answer["session_id"]) == sorted(expected.index)
    assert_same_recommendations(
        answer, expected, session_workflow, decoded=True, tolerance=SCORE_TOLERANCE
    )


def test_a_request_without_clicks_is_answered_with_no_sessions(served, compiled, session_workflow):
    server, _, _ = served
    rows = pd.DataFrame(
        {name: np.array([], dtype=np.int64) for name in session_workflow.input_schema.column_names}
    )
    answer = Client(server.grpc_url).infer(NAME, rows)
    assert len(answer) == 0
    assert_frames_equal(answer, compiled.transform(rows))


def test_a_request_with_a_column_short_of_rows_is_refused_naming_it(served, compiled):
    import tritonclient.grpc

    server, _, _ = served
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
        compiled.transform(as_lists)
    # and the server goes on (other tests load models on this server that fail to load on purpose)
    assert all(model.healthy for model in server.health() if model.name.startswith(NAME))
