"""An all-libtorch export batched without a python step (``export.libtorch_feeder``): the session
counter before the step, the configs that wire them, and the merged step answering a batch, what
Triton hands it, exactly as the step answers each request alone (requests that share a session id,
and a request of no clicks, included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from merlin_torch_serving import Ensemble, ModelOptions, PredictPytorch, TopK, TransformWorkflow
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.libtorch_batching import _merged_inputs, flat_batch
from merlin_torch_serving.export.libtorch_feeder import FEEDER_SUFFIX
from tests import toy_session
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

STEP = "reco-0-transformworkflow_predictpytorch_topk_blankfilteredrows"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, toy_model):
    workflow = toy_session.fitted_workflow(
        tmp_path_factory.mktemp("feeder_vocabularies"), minimum_clicks=2
    )
    scripted, input_schema, output_schema = toy_model
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow, backend="pytorch")
    graph = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="pytorch")
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    ensemble = Ensemble(graph, workflow.input_schema)
    repository = tmp_path_factory.mktemp("feeder_repository")
    result = ensemble.export(repository, "reco", options=ModelOptions(batching=True))
    return ensemble, repository, result


def _config(repository, model):
    return configs.from_pbtxt((repository / model / "config.pbtxt").read_text())


def test_the_session_counter_runs_before_the_step_and_feeds_it(exported):
    _, repository, result = exported
    feeder = STEP + FEEDER_SUFFIX
    assert result.models == [feeder, STEP, "reco"]
    assert result.warnings == []
    counter = _config(repository, feeder)
    assert counter.max_batch_size == 0  # one request at a time
    assert all(list(tensor.dims) == [1, -1] for tensor in [*counter.input, *counter.output])
    step = _config(repository, STEP)
    assert step.max_batch_size > 0
    assert step.batch_output
    [first, second] = _config(repository, "reco").ensemble_scheduling.step
    assert first.model_name == feeder
    assert second.model_name == STEP
    assert second.input_map[configs.ROWS_TENSOR] == first.output_map[configs.ROWS_TENSOR]
    assert {second.input_map[t.name] for t in step.input} <= set(first.output_map.values())
    manifest = json.loads((repository / "reco" / "1" / "manifest.json").read_text())
    assert manifest["steps"][0]["model"] == feeder
    assert manifest["steps"][0]["feeds"] == STEP


def test_the_session_counter_answers_one_byte_per_session_and_every_tensor_padded(exported):
    _, repository, _ = exported
    counter = torch.jit.load(str(repository / (STEP + FEEDER_SUFFIX) / "1" / "model.pt"))
    request = {
        "session_id": torch.tensor([[7, 3, 7, 7, 9]]),
        "item_id": torch.tensor([[500, 501, 502, 503, 504]]),
        "category": torch.tensor([[1, 2, 3, 4, 5]]),
        "timestamp": torch.tensor([[5, 4, 3, 2, 1]]),
    }
    rows, *padded = counter(request)
    assert rows.shape == (1, 3)
    assert rows.dtype == torch.uint8
    assert all(tensor.shape == (1, 6) for tensor in padded)
    empty = counter({name: tensor[:, :0] for name, tensor in request.items()})
    assert empty[0].shape == (1, 0)
    assert all(tensor.shape == (1, 1) for tensor in empty[1:])


def test_the_merged_step_answers_a_batch_as_each_request_alone(exported):
    ensemble, repository, _ = exported
    merged = torch.jit.load(str(repository / STEP / "1" / "model.pt"))
    names = ensemble.input_schema.column_names
    clicks = toy_session.interactions(n_sessions=8, seed=12, first_session=50)
    sessions = clicks.session_id.unique()
    parts = [
        clicks[clicks.session_id.isin(sessions[:1])],
        clicks[clicks.session_id.isin(sessions[1:6])],
        clicks.iloc[:0],  # no clicks: no rows
        clicks[clicks.session_id.isin(sessions[6:])],
    ]
    requests = [{name: part[name].to_numpy() for name in names} for part in parts]
    batches = {
        "distinct sessions": requests,
        "a session id twice": requests + [requests[1]],  # answered one request at a time
    }
    with torch_threads(SERVED_TORCH_THREADS), torch.inference_mode():
        alone = [
            merged.inner({n: torch.from_numpy(a) for n, a in request.items()})
            for request in requests
        ]
        for label, batch in batches.items():
            flat = flat_batch(batch, key="session_id")
            answers = merged({n: torch.from_numpy(a) for n, a in flat.items()})
            own = alone + alone[1:2] if len(batch) > len(requests) else alone
            bounds = np.cumsum([0] + [len(np.unique(r["session_id"])) for r in batch])
            for position, answer in enumerate(answers):
                assert answer.shape[0] == bounds[-1], label
                for start, stop, outputs in zip(bounds[:-1], bounds[1:], own, strict=True):
                    torch.testing.assert_close(
                        answer[start:stop], outputs[position], rtol=0, atol=0, equal_nan=True
                    )


def test_merged_inputs_shift_ragged_offsets_by_each_requests_own_rows():
    # two requests: 2 sessions each (ROWS), a ragged input of 3 rows and then of 1 row
    flat_offsets = torch.tensor([0, 1, 1, 3, 0, 0, 2, 0], dtype=torch.int32)  # each + a pad
    inputs = {
        "__rows__count": torch.tensor([2, 2], dtype=torch.int32),
        "tags__offsets": flat_offsets,
        "tags__offsets__count": torch.tensor([5, 3], dtype=torch.int32),
        "tags__values": torch.tensor([5, 6, 7, 0, 8, 9, 0]),
        "tags__values__count": torch.tensor([4, 3], dtype=torch.int32),
    }
    merged, rows = torch.jit.script(_merged_inputs)(
        inputs, {"tags__offsets": [], "tags__values": []}
    )
    assert rows == 4
    assert merged["tags__values"].tolist() == [5, 6, 7, 8, 9]
    assert merged["tags__offsets"].tolist() == [0, 1, 1, 3, 5]
