import logging

import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import ModelPreparationError
from merlin_torch_serving.model_prep.prepare import prepare_model
from tests import any_models

X = any_models.SIGNED_INPUTS


def prepare(model, schema=X, names=("out",), **options):
    return prepare_model(model, schema, list(names), label="PredictPytorch", **options)


def test_a_scriptable_eager_model_is_scripted_and_keeps_its_branches(caplog):
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        prepared = prepare(
            any_models.PositionalScorer(), any_models.POSITIONAL_INPUTS, ["score", "weighted"]
        )
    assert prepared.execution == "torchscript"
    assert (
        "model PositionalScorer runs as TorchScript (scripted; equal to the eager module on 8 probe"
        " inputs)" in caplog.text
    )
    price = torch.tensor([[-4.0, 1.0, 0.0]])
    score, _ = prepared.module({"price": price, "clicks": torch.tensor([0])})
    assert score.tolist() == [3.0]  # |-2 - 1| : the branch ran, not a recorded path


def test_a_trace_that_answers_wrong_values_is_refused_and_the_model_runs_eagerly(caplog):
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        prepared = prepare(any_models.BatchSignBranch())
    assert prepared.execution == "eager"
    (record,) = [r for r in caplog.records if "BatchSignBranch" in r.getMessage()]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "runs eagerly on the python backend (torch.jit.script failed" in message
    assert "the trace differs from the eager module on probe" in message
    assert "torch warned while tracing: Converting a tensor to a Python boolean" in message
    negative = -torch.ones(2, 4)
    assert prepared.module({"x": negative}).tolist() == [4.0, 4.0]


def test_the_row_by_row_branch_runs_eagerly_and_answers_like_the_eager_model(caplog):
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        prepared = prepare(any_models.SignedRowSum())
    assert prepared.execution == "eager"
    assert "model SignedRowSum runs eagerly on the python backend" in caplog.text
    rows = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [1.0, 2.0, 0.0, 0.0]])
    assert prepared.module({"x": rows}).tolist() == [4.0, 3.0]


def test_a_mismatching_trace_is_an_error_when_torchscript_is_required():
    with pytest.raises(
        ModelPreparationError,
        match=(
            r"model 'BatchSignBranch': cannot become TorchScript .*the trace differs from the eager"
            r" module on probe '[^']+' \(output 'out': \d+ value\(s\) differ; at \[\d+\] the eager"
            r" module gives"
        ),
    ):
        prepare(any_models.BatchSignBranch(), require_torchscript=True)


def test_a_trace_that_warned_but_answers_right_is_kept_and_the_warning_logged(caplog):
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        prepared = prepare(any_models.CheckedInput())
    assert prepared.execution == "torchscript"
    (record,) = [r for r in caplog.records if "CheckedInput" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert (
        "traced; equal to the eager module on 8 probe inputs; torch warned while tracing:"
        " Converting a tensor" in record.getMessage()
    )
    assert prepared.module({"x": torch.tensor([[-1.0, 0.0, 2.0, 5.0]])}).tolist() == [
        [-3.0, 0.0, 6.0, 15.0]
    ]


def test_tracer_warnings_do_not_leak_to_the_caller():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare(any_models.CheckedInput())
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]


def test_execution_eager_skips_compiling(caplog):
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        prepared = prepare(
            any_models.PositionalScorer(),
            any_models.POSITIONAL_INPUTS,
            ["score", "weighted"],
            execution="eager",
        )
    assert prepared.execution == "eager"
    assert "runs eagerly on the python backend (as asked: execution='eager')" in caplog.text


def test_a_given_torchscript_with_positional_arguments_keeps_its_control_flow_behind_the_adapter():
    scripted = torch.jit.script(any_models.PositionalScorer())
    prepared = prepare(scripted, any_models.POSITIONAL_INPUTS, ["score", "weighted"])
    assert isinstance(prepared.module, torch.jit.ScriptModule)
    score, weighted = prepared.module(
        {"price": torch.tensor([[-4.0, 1.0, 0.0]]), "clicks": torch.tensor([0])}
    )
    assert score.tolist() == [3.0]
    assert weighted.tolist() == [[-2.0, -1.0, 0.0]]


def test_a_given_torchscript_returning_a_dict_returns_a_tuple_in_output_order():
    prepared = prepare(torch.jit.script(any_models.DictScores()), X, ["largest", "total"])
    largest, total = prepared.module({"x": torch.tensor([[1.0, 2.0, 3.0, 4.0]])})
    assert largest.tolist() == [4.0]
    assert total.tolist() == [10.0]


def test_a_model_that_fails_on_inputs_built_from_its_schema_says_so():
    narrow = Schema(
        [ColumnSchema("x", dtype="float32", dims=(None, 3))]
    )  # the model wants 4 values
    from merlin_torch_serving import SchemaError

    class NeedsFour(torch.nn.Module):
        def forward(self, inputs):
            return inputs["x"].view(-1, 4).sum(1)

    with pytest.raises(
        SchemaError,
        match=(
            "a model that runs on inputs built from its input schema, got a model that fails on"
            " them"
        ),
    ):
        prepare(NeedsFour(), narrow)


def test_a_model_that_rewrites_its_input_dict_is_compared_on_unchanged_probes():
    class Rewrites(torch.nn.Module):  # as Transformers4Rec's Model casts and pads in place
        def forward(self, inputs):
            inputs["x"] = inputs["x"] * 2
            return inputs["x"]

    prepared = prepare(Rewrites())
    assert prepared.execution == "torchscript"
    assert prepared.module({"x": torch.ones(1, 4)}).tolist() == [[2.0, 2.0, 2.0, 2.0]]
