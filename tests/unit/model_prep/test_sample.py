import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import SchemaError
from merlin_torch_serving.model_prep.sample import input_schema_of, named_inputs, output_schema_of
from tests import any_models


def test_a_tuple_sample_takes_forward_argument_names_in_order():
    inputs = named_inputs(any_models.PositionalScorer(), (torch.ones(2, 3), np.array([1, 2])), "op")
    assert list(inputs) == ["price", "clicks"]
    assert inputs["clicks"].dtype == torch.int64


def test_a_single_tensor_sample_takes_the_only_argument_name():
    class One(torch.nn.Module):
        def forward(self, features: torch.Tensor):
            return features.sum(1)

    assert list(named_inputs(torch.jit.script(One()), torch.ones(2, 5), "op")) == ["features"]


def test_input_schema_has_a_variable_batch_and_the_samples_other_dims():
    schema = input_schema_of(
        {"price": torch.ones(2, 3), "clicks": torch.ones(2, dtype=torch.int64)}
    )
    assert schema == Schema(
        [
            ColumnSchema("price", dtype="float32", dims=(None, 3)),
            ColumnSchema("clicks", dtype="int64", dims=(None,)),
        ]
    )


def test_outputs_are_named_tritons_way_or_by_the_keys_of_a_dict():
    inputs = {"price": torch.ones(2, 3), "clicks": torch.ones(2, dtype=torch.int64)}
    tuple_names = output_schema_of(
        any_models.PositionalScorer(), inputs, input_schema_of(inputs), "op"
    ).column_names
    assert tuple_names == ["OUTPUT__0", "OUTPUT__1"]
    x = {"x": torch.ones(2, 4)}
    assert output_schema_of(any_models.DictScores(), x, input_schema_of(x), "op").column_names == [
        "total",
        "largest",
    ]


def test_a_sample_without_a_batch_dimension_is_refused():
    with pytest.raises(
        SchemaError,
        match=r"column 'x'.*a sample with a batch dimension.*got a 0-dimensional tensor",
    ):
        named_inputs(any_models.DictScores(), {"x": torch.tensor(1.0)}, "op")


def test_an_unnamed_sample_for_a_dict_forward_asks_for_a_dict():
    with pytest.raises(SchemaError, match="a dict of tensors keyed by input name"):
        named_inputs(any_models.DictScores(), (torch.ones(2, 4),), "op")
