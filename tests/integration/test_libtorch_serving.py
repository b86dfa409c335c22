"""Mixed repositories on the real tritonserver: the workflow on the python backend, the model with
its TopK (and, for the XLNet, DecodeItemIds) compiled into one libtorch model on Triton's pytorch
backend, which TritonServer lays out beside the python backend once it is built for this torch.

Three models (tests/session_models.py): a trained Transformers4Rec XLNet, an untrained seeded
Transformers4Rec GPT2 and a plain TorchScript model. Requests of 1, 7 and 64 sessions hold an
over-long, a single-click session and unseen items, rows shuffled. Served answers equal in-process
answers bit for bit over gRPC and HTTP, the in-process run using the torch threads served models
run with (one, ModelOptions' default; see ``session_models.torch_threads``), and equal the eager
model within ``session_models.SCORE_TOLERANCE``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import (
    BackendNotAvailableError,
    Client,
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
    TritonServer,
)
from merlin_torch_serving.backends import bundled_backend_directory
from merlin_torch_serving.backends.bundle import (
    CACHE_ENV_VAR,
    bundled_tritonserver,
    libtritonserver,
    tritonserver_version,
)
from tests import toy_session
from tests.session_models import (
    RESERVED_IDS,
    SERVED_TORCH_THREADS,
    assert_same_recommendations,
    eager_top_k,
    request_rows,
    torch_threads,
)

pytestmark = pytest.mark.integration

TOP_K = 10
SESSION_COUNTS = (1, 7, 64)


@dataclass(frozen=True)
class ServedMixed:
    name: str
    ensemble: Ensemble
    eager: torch.nn.Module
    decoded: bool


def top_k_graph(workflow, session_model):
    """Raw clicks in; per session its id and the k best encoded item ids not yet clicked."""
    session_features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    top = (
        session_features
        >> PredictPytorch(session_model.served, backend="pytorch", **session_model.predict_kwargs)
        >> TopK(TOP_K, seen_items=session_features["item_id-list"], exclude_ids=RESERVED_IDS)
    )
    return session_features["session_id"] + top


@pytest.fixture(scope="module", params=["xlnet", "gpt2", "torchscript_model"])
def served(request, pytorch_backend, triton_server, session_workflow) -> ServedMixed:
    session_model = request.getfixturevalue(request.param)
    decoded = session_model.name == "xlnet"
    graph = (
        recommendation_graph(session_workflow, session_model.served, k=TOP_K, backend="pytorch")
        if decoded
        else top_k_graph(session_workflow, session_model)
    )
    ensemble = Ensemble(graph, session_workflow.input_schema)
    name = f"mixed-{session_model.name}"
    ensemble.export(triton_server.repository, name)
    triton_server.load(name)
    return ServedMixed(name, ensemble, session_model.eager, decoded)


def test_the_model_its_top_k_and_decoding_run_in_one_libtorch_model_behind_the_python_workflow(
    served, triton_server
):
    manifest = json.loads(
        (Path(triton_server.repository) / served.name / "1" / "manifest.json").read_text()
    )
    steps = [(step["backend"], step["fused_operators"]) for step in manifest["steps"]]
    libtorch_ops = ["PredictPytorch[pytorch]", f"TopK(k={TOP_K})"] + (
        ["DecodeItemIds('item_id')"] if served.decoded else []
    )
    assert steps == [("python", ["TransformWorkflow"]), ("pytorch", libtorch_ops)]
    libtorch_step = manifest["steps"][1]["model"]
    assert (
        f"Intra op thread count is set to {SERVED_TORCH_THREADS} for model instance"
        f" '{libtorch_step}'" in triton_server.logs()
    )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_mixed_ensemble_equals_in_process_exactly(
    served, triton_server, session_split, protocol, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=n_sessions)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url

    answer = Client(url, protocol=protocol).infer(served.name, rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = served.ensemble.transform(rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    assert answer["session_id"].tolist() == in_process["session_id"].tolist()
    for column in ("item_ids", "item_scores"):
        served_values, local_values = np.stack(answer[column]), np.stack(in_process[column])
        assert served_values.dtype == local_values.dtype, column
        np.testing.assert_array_equal(served_values, local_values, err_msg=column)


@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_mixed_ensemble_equals_the_eager_model(
    served, triton_server, session_workflow, session_split, n_sessions
):
    _, held_out = session_split
    rows = request_rows(held_out, n_sessions, seed=100 + n_sessions)

    answer = Client(triton_server.grpc_url).infer(served.name, rows)

    assert answer["item_ids"].map(len).eq(TOP_K).all()
    expected = eager_top_k(session_workflow, served.eager, rows, TOP_K, decoded=served.decoded)
    assert_same_recommendations(answer, expected, session_workflow, decoded=served.decoded)


class IndexNamedOutputs(torch.nn.Module):
    """Returns (scores, lengths), declared as outputs ``scores__0`` and ``lengths__1``."""

    def forward(self, inputs: dict[str, torch.Tensor]):
        items = inputs["item_id-list"]
        return items.to(torch.float32) * 0.5, (items != 0).sum(1)


def test_outputs_named_with_their_index_are_served_from_that_index(
    pytorch_backend, triton_server, toy_workflow
):
    # Triton's pytorch backend matches outputs by the index their names end in when all of them do.
    items = toy_workflow.output_schema.select_by_name(["item_id-list"])
    outputs = Schema(
        [ColumnSchema("scores__0", dtype="float32"), ColumnSchema("lengths__1", dtype="int64")]
    )
    session_features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    graph = session_features >> PredictPytorch(
        torch.jit.script(IndexNamedOutputs()), items, outputs, backend="pytorch"
    )
    ensemble = Ensemble(graph, toy_workflow.input_schema)
    ensemble.export(triton_server.repository, "index-named")
    triton_server.load("index-named")
    rows = toy_session.interactions(7, seed=4, first_session=7000)

    answer = Client(triton_server.grpc_url).infer("index-named", rows)
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = ensemble.transform(rows)

    for column in ("scores__0", "lengths__1"):
        np.testing.assert_array_equal(
            np.stack(answer[column]), np.stack(in_process[column]), err_msg=column
        )


def test_bundled_server_lays_out_the_pytorch_backend_beside_the_python_backend(
    pytorch_backend, triton_server
):
    assert triton_server.backends() == ["ensemble", "python", "pytorch"]
    pytorch = bundled_backend_directory() / "pytorch"
    assert (pytorch / "libtriton_pytorch.so").read_bytes() == pytorch_backend.library.read_bytes()
    # the names the library was linked against, found beside it ($ORIGIN)
    assert (pytorch / "libtritonserver.so").resolve() == libtritonserver().resolve()
    assert (pytorch / "libtorch.so").resolve() == (
        Path(torch.__file__).parent / "lib" / "libtorch.so"
    ).resolve()
    assert "TRITONBACKEND_Initialize: pytorch" in triton_server.logs()


def test_a_libtorch_model_names_the_build_command_when_no_backend_is_built_for_this_torch(
    toy_workflow, toy_model, tmp_path, monkeypatch
):
    Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"),
        toy_workflow.input_schema,
    ).export(tmp_path / "repository", "needs-libtorch")
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "empty-cache"))  # no build in this cache

    with pytest.raises(BackendNotAvailableError) as caught:
        TritonServer(tmp_path / "repository").start()

    message = str(caught.value)
    assert "model 'needs-libtorch-1-predictpytorch_topk' needs backend 'pytorch'" in message
    assert "(it has: ensemble, python)" in message
    assert "run `merlin-torch-serving build-backend pytorch --sources PATH`" in message
    assert caught.value.missing == {"needs-libtorch-1-predictpytorch_topk": "pytorch"}


def test_builds_are_keyed_by_the_version_the_running_server_reports(pytorch_backend, triton_server):
    import tritonclient.http as httpclient

    reported = httpclient.InferenceServerClient(triton_server.http_url).get_server_metadata()[
        "version"
    ]
    assert (
        tritonserver_version(bundled_tritonserver())
        == reported
        == pytorch_backend.tritonserver_version
    )
