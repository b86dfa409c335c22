"""The operator contract (``ops.base``): one constructor path, declared backends, TorchScript forms
the exporter compiles without knowing the operator, and an exporter that names no operator."""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

import merlin_torch_serving
from merlin_torch_serving import (
    DecodeItemIds,
    Ensemble,
    ExportError,
    PredictPytorch,
    ServingOperator,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.export.partition import partition
from merlin_torch_serving.ops.filtered import BlankFilteredRows
from tests.repository_runner import run_repository

SCORES = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 6))])


def negate(scores: torch.Tensor) -> torch.Tensor:
    return -scores


class NegateModule(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return negate(inputs["scores"])


class Negate(ServingOperator):
    """A libtorch operator of its own: the scores negated."""

    backend = "pytorch"

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return Schema([input_schema["scores"]])

    def transform(self, col_selector, transformable):
        scores = torch.from_numpy(np.asarray(transformable["scores"].values))
        return TensorTable({"scores": negate(scores).numpy()}, _unsafe=True)

    def torchscript(self, input_schema):
        return NegateModule()


def test_operators_are_built_by_init_only_so_overriding_load_is_refused():
    with pytest.raises(TypeError, match=r"Patched overrides ServingOperator\.load.*load_arguments"):

        class Patched(ServingOperator):
            @classmethod
            def load(cls, config, artifact_path):
                return cls.__new__(cls)


@pytest.fixture(scope="module")
def built_ins(toy_workflow, toy_model):
    scripted, input_schema, output_schema = toy_model
    return [
        TransformWorkflow(toy_workflow),
        PredictPytorch(scripted, input_schema, output_schema, backend="python"),
        TopK(3, seen_items="item_id-list", exclude_ids=[2, 0]),
        DecodeItemIds(toy_workflow),
        BlankFilteredRows("filtered_out", ["item_ids", "item_scores"]),
    ]


def test_every_built_in_operator_is_rebuilt_from_its_saved_form_through_init(built_ins, tmp_path):
    for position, op in enumerate(built_ins):
        folder = tmp_path / str(position)
        folder.mkdir()
        op.save_artifacts(str(folder))
        config = json.loads(json.dumps(op.config()))  # as step.json holds it
        loaded = type(op).load(config, str(folder))
        assert type(loaded) is type(op)
        assert loaded.config() == op.config(), op.label
    topk = type(built_ins[2]).load(built_ins[2].config(), str(tmp_path))
    assert topk.seen_column == "item_id-list"
    assert topk.exclude_ids == [0, 2]


def test_a_new_pytorch_operator_starts_a_libtorch_step_that_later_torchscript_operators_join(
    tmp_path,
):
    ensemble = Ensemble(["scores"] >> Negate() >> TopK(2), SCORES)
    result = ensemble.export(tmp_path, "negated")
    assert result.fused == {"negated-0-negate_topk": ["Negate", "TopK(k=2)"]}
    request = {
        "scores": np.array([[0.5, 0.1, 0.9, 0.3, 0.2, 0.7], [1, 2, 3, 4, 5, 6]], dtype=np.float32)
    }
    served = run_repository(tmp_path, "negated", request)
    expected = ensemble.run(TensorTable(request, _unsafe=True))
    np.testing.assert_array_equal(served["item_ids"], expected["item_ids"].values)
    np.testing.assert_array_equal(served["item_scores"], expected["item_scores"].values)
    assert served["item_ids"].tolist() == [[1, 4], [0, 1]]


def test_chains_exported_in_one_process_keep_their_own_forward(tmp_path):
    request = {"scores": np.array([[0.5, 0.1, 0.9, 0.3, 0.2, 0.7]], dtype=np.float32)}
    top = ["scores"] >> Negate() >> TopK(2)
    # (TorchScript's cache of module types would hand the third chain the second one's forward)
    for name, graph in (("both", top), ("ids_only", top["item_ids"]), ("both_again", top)):
        ensemble = Ensemble(graph, SCORES)
        ensemble.export(tmp_path / name, name)
        served = run_repository(tmp_path / name, name, request)
        expected = ensemble.run(TensorTable(request, _unsafe=True))
        assert list(served) == list(expected.columns)
        for column in expected.columns:
            np.testing.assert_array_equal(served[column], expected[column].values)


class Unknown(Negate):
    backend = "tensorflow"


class NoTorchScript(Negate):
    def torchscript(self, input_schema):
        return None


class Uncompilable(Negate):
    def torchscript(self, input_schema):
        return Untyped()


class Untyped(torch.nn.Module):
    def forward(self, inputs):  # no annotation: TorchScript takes `inputs` for a Tensor
        return inputs["scores"]


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (
            Unknown(),
            (
                r"operator Unknown declares backend 'tensorflow'; an operator runs on one of"
                r" python, pytorch"
            ),
        ),
        (
            NoTorchScript(),
            r"operator NoTorchScript declares backend 'pytorch' but has no TorchScript form",
        ),
        (
            Uncompilable(),
            r"the TorchScript form of operator Uncompilable \(Untyped\) does not compile",
        ),
    ],
    ids=["unknown backend", "pytorch without torchscript", "torchscript that does not compile"],
)
def test_an_operator_that_breaks_the_contract_is_an_export_error_naming_it(op, message, tmp_path):
    with pytest.raises(ExportError, match=message):
        Ensemble(["scores"] >> op, SCORES).export(tmp_path, "broken")


def test_a_torchscript_operator_after_a_python_step_stays_on_python():
    plan = Ensemble(["scores"] >> TopK(2), SCORES).plan
    (step,) = partition(plan, "e")
    assert step.backend == "python"
    assert step.torchscript == {}


def operator_classes() -> set[str]:
    """Names of every ServingOperator subclass the package defines."""
    names, pending = set(), [ServingOperator]
    for module in Path(merlin_torch_serving.__file__).parent.joinpath("ops").glob("*.py"):
        __import__(f"merlin_torch_serving.ops.{module.stem}")
    while pending:
        for cls in pending.pop().__subclasses__():
            if cls.__module__.startswith("merlin_torch_serving."):
                names.add(cls.__name__)
            pending.append(cls)
    return names


def test_the_exporter_names_no_operator_class():
    classes = operator_classes()
    assert {
        "TransformWorkflow",
        "PredictPytorch",
        "TopK",
        "DecodeItemIds",
        "BlankFilteredRows",
    } <= classes
    export = Path(inspect.getfile(partition)).parent
    pattern = re.compile(r"\b(" + "|".join(sorted(classes)) + r")\b")
    named = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(export.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert named == []
