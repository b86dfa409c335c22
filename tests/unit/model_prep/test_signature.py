import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import SchemaError
from merlin_torch_serving.model_prep.signature import (
    DictCall,
    bind_arguments,
    needs_adapter,
    read_signature,
)
from tests import any_models


def columns(*names):
    return Schema([ColumnSchema(name, dtype="float32") for name in names])


class Positional(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | None = None):
        return a + b if scale is None else (a + b) * scale


class PositionalWithUnionSyntax(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | None = None):
        return a + b if scale is None else (a + b) * scale


class LikeTransformers4Rec(torch.nn.Module):
    def forward(self, inputs, targets=None, training=False, **kwargs):
        return inputs["a"]


@pytest.mark.parametrize("script", [False, True])
def test_positional_arguments_are_bound_to_columns_of_the_same_name(script):
    model = torch.jit.script(Positional()) if script else Positional()
    assert bind_arguments(read_signature(model), columns("b", "a"), "op") == {"a": "a", "b": "b"}


@pytest.mark.parametrize(
    "model", [Positional(), PositionalWithUnionSyntax()], ids=["Optional", "union"]
)
def test_an_optional_argument_is_bound_when_a_column_has_its_name(model):
    assert bind_arguments(read_signature(model), columns("a", "b", "scale"), "op") == {
        "a": "a",
        "b": "b",
        "scale": "scale",
    }


def test_positional_arguments_follow_tritons_name_index_convention_when_names_differ():
    signature = read_signature(torch.jit.script(Positional()))
    assert bind_arguments(signature, columns("INPUT__1", "INPUT__0"), "op") == {
        "a": "INPUT__0",
        "b": "INPUT__1",
    }


@pytest.mark.parametrize(
    "model",
    [any_models.DictScores(), LikeTransformers4Rec(), torch.jit.script(any_models.DictScores())],
)
def test_a_forward_taking_one_dict_gets_the_whole_dict(model):
    assert bind_arguments(read_signature(model), columns("a", "x"), "op") is None


def test_an_unbound_required_argument_is_named_with_the_columns_there_are():
    with pytest.raises(
        SchemaError,
        match=(
            r"column 'b' at the input of op: expected an input column named like the argument 'b'"
            r" of forward\(a, b, scale=...\).*got input columns 'a', 'c'"
        ),
    ):
        bind_arguments(read_signature(Positional()), columns("a", "c"), "op")


def test_a_column_no_argument_takes_is_named():
    with pytest.raises(
        SchemaError,
        match=(
            r"column 'extra'.*an argument of forward\(a, b, scale=...\) named like the column, got"
            r" no such argument"
        ),
    ):
        bind_arguments(read_signature(Positional()), columns("a", "b", "extra"), "op")


def test_dict_call_returns_dict_outputs_as_a_tuple_in_output_schema_order():
    call = DictCall(any_models.DictScores(), None, ["largest", "total"])
    largest, total = call({"x": torch.tensor([[1.0, 5.0], [2.0, 3.0]])})
    assert largest.tolist() == [5.0, 3.0]
    assert total.tolist() == [6.0, 5.0]


def test_dict_call_names_an_output_the_model_does_not_return():
    call = DictCall(any_models.DictScores(), None, ["total", "score"])
    with pytest.raises(
        KeyError, match="without the output 'score' \\(it has 'total', 'largest'\\)"
    ):
        call({"x": torch.ones(2, 2)})


def test_dict_call_passes_inputs_by_argument_name():
    call = DictCall(Positional(), {"a": "INPUT__0", "b": "INPUT__1"}, ["OUTPUT__0"])
    assert call({"INPUT__0": torch.tensor([1.0]), "INPUT__1": torch.tensor([2.0])}).tolist() == [
        3.0
    ]


def test_scripted_signature_reads_argument_kinds_and_the_result_kind():
    signature = read_signature(torch.jit.script(any_models.PositionalScorer()))
    assert [(a.name, a.required, a.kind) for a in signature.arguments] == [
        ("price", True, "tensor"),
        ("clicks", True, "tensor"),
    ]
    assert signature.returns == "tuple"
    assert read_signature(torch.jit.script(any_models.DictScores())).returns == "dict"


def test_eager_signature_reads_annotations():
    signature = read_signature(any_models.DictScores())
    assert [(a.name, a.kind) for a in signature.arguments] == [("inputs", "dict")]
    assert [
        (a.name, a.required, a.kind) for a in read_signature(LikeTransformers4Rec()).arguments
    ] == [
        ("inputs", True, "unknown"),
        ("targets", False, "unknown"),
        ("training", False, "unknown"),
    ]


def test_a_dict_of_tensors_argument_annotated_in_typing_is_a_dict():
    class Typed(torch.nn.Module):
        def forward(self, features: dict[str, torch.Tensor]):
            return features["a"]

    assert read_signature(Typed()).arguments[0].kind == "dict"


def test_a_single_result_in_a_tuple_or_list_comes_back_as_its_tensor():
    class OneTuple(torch.nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor]:
            return (inputs["x"] * 2,)

    scripted = torch.jit.script(OneTuple())
    signature = read_signature(scripted)
    assert signature.returns == "one-tuple"
    assert needs_adapter(signature, None)
    assert DictCall(scripted, None, ["doubled"])({"x": torch.ones(2)}).tolist() == [2.0, 2.0]
