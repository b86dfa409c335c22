"""A new operator is one class: ``Temperature``, defined only here, compiles into the libtorch step
of the model whose scores it divides (between the model and its TopK) and serves on the real
tritonserver with Triton's pytorch backend, equal to the in-process answer bit for bit. Without a
TorchScript form the same operator runs in a python step, rebuilt from its ``config()``."""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    Client,
    Ensemble,
    PredictPytorch,
    ServingOperator,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.data import frames, wire
from tests import toy_session
from tests.repository_runner import response_arrays, run_repository

pytestmark = pytest.mark.integration


def divide(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    return scores / temperature


class TemperatureModule(torch.nn.Module):
    column: str
    temperature: float

    def __init__(self, column: str, temperature: float):
        super().__init__()
        self.column = column
        self.temperature = temperature

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return divide(inputs[self.column], self.temperature)


class Temperature(ServingOperator):
    """Scores divided by a temperature, for sharper or flatter rankings.

    It runs in-process and in TorchScript.
    """

    def __init__(self, temperature: float, column: str = "next-item"):
        super().__init__()
        self.temperature = float(temperature)
        self.column = column

    @property
    def label(self) -> str:
        return f"Temperature({self.temperature:g})"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return input_schema.select_by_name([self.column])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([input_schema[self.column]])

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        scores = torch.from_numpy(np.asarray(transformable[self.column].values))
        return TensorTable({self.column: divide(scores, self.temperature).numpy()}, _unsafe=True)

    def config(self) -> dict:
        return {"temperature": self.temperature, "column": self.column}

    def torchscript(self, input_schema: Schema) -> torch.nn.Module:
        return TemperatureModule(self.column, self.temperature)


class PythonTemperature(Temperature):
    """The same operator without a TorchScript form."""

    def torchscript(self, input_schema: Schema) -> None:
        return None


def tempered_graph(workflow, model, temperature: Temperature, k: int = 5):
    scripted, input_schema, output_schema = model
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    top = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="pytorch")
        >> temperature
        >> TopK(k, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    return features["session_id"] + top


def test_a_test_only_operator_compiles_into_the_libtorch_step_and_serves_like_in_process(
    pytorch_backend, triton_server, toy_workflow, toy_model
):
    ensemble = Ensemble(
        tempered_graph(toy_workflow, toy_model, Temperature(0.25)), toy_workflow.input_schema
    )
    result = ensemble.export(triton_server.repository, "tempered")
    assert result.fused == {
        "tempered-0-transformworkflow": ["TransformWorkflow"],
        "tempered-1-predictpytorch_temperature_topk": [
            "PredictPytorch[pytorch]",
            "Temperature(0.25)",
            "TopK(k=5)",
        ],
    }
    manifest = json.loads((Path(result.path) / "tempered" / "1" / "manifest.json").read_text())
    assert [step["backend"] for step in manifest["steps"]] == ["python", "pytorch"]
    assert manifest["steps"][1]["operators"][1]["parameters"] == {
        "temperature": 0.25,
        "column": "next-item",
    }
    triton_server.load("tempered")

    rows = toy_session.interactions(9, seed=41, first_session=7300).sample(frac=1.0, random_state=5)
    expected = ensemble.transform(rows)  # with one torch thread, as the served models run
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with Client(url, protocol) as client:
            answer = client.infer("tempered", rows)
        assert (
            list(answer.columns)
            == list(expected.columns)
            == ["session_id", "item_ids", "item_scores"]
        )
        assert answer["session_id"].tolist() == expected["session_id"].tolist()
        for column in ("item_ids", "item_scores"):
            served, local = np.stack(answer[column]), np.stack(expected[column])
            assert served.dtype == local.dtype, column
            np.testing.assert_array_equal(served, local, err_msg=f"{protocol}: {column}")
    # the temperature really applies: scores are the untempered ones divided by it
    plain = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, k=5), toy_workflow.input_schema
    ).transform(rows)
    np.testing.assert_allclose(
        np.stack(expected["item_scores"]), np.stack(plain["item_scores"]) / 0.25, rtol=1e-6
    )


def test_without_a_torchscript_form_the_operator_runs_in_a_python_step_rebuilt_from_its_config(
    toy_workflow, toy_model, tmp_path
):
    ensemble = Ensemble(
        tempered_graph(toy_workflow, toy_model, PythonTemperature(2.0)), toy_workflow.input_schema
    )
    result = ensemble.export(tmp_path, "tempered")
    assert result.fused == {
        "tempered-0-transformworkflow": ["TransformWorkflow"],
        "tempered-1-predictpytorch": ["PredictPytorch[pytorch]"],
        "tempered-2-pythontemperature_topk": ["Temperature(2)", "TopK(k=5)"],
    }
    request = frames.frame_to_table(
        toy_session.interactions(7, seed=43, first_session=7400)[
            toy_workflow.input_schema.column_names
        ]
    )
    served = run_repository(tmp_path, "tempered", wire.to_wire(request))
    expected = response_arrays(ensemble.run(request), ensemble.input_schema.column_names)
    assert sorted(served) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(served[name], array, err_msg=name)
