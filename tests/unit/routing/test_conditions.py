"""The per-session conditions of a route, over the columns it receives."""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types
import json

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving import SchemaError
from merlin_torch_serving.routing import (
    AllItemsUnknown,
    FewerKnownItems,
    FilteredOut,
    Predicate,
)
from merlin_torch_serving.routing.conditions import condition_config, condition_from_config

ITEMS = ColumnSchema("item_id-list", tags=[Tags.ITEM, Tags.ID], dtype="int64", dims=(None, None))
SCHEMA = Schema(
    [
        ITEMS,
        ColumnSchema("category-list", dtype="int64", dims=(None, None)),
        ColumnSchema("filtered_out", dtype="bool", dims=(None,)),
    ]
)
# sessions: [5, 2, 7] (two known), [2] (none known), [] (empty), [9, 9, 4, 1] (three known)
TABLE = TensorTable(
    {
        "item_id-list": (
            np.array([5, 2, 7, 2, 9, 9, 4, 1]),
            np.array([0, 3, 4, 4, 8], dtype=np.int32),
        ),
        "category-list": (np.zeros(8, dtype=np.int64), np.array([0, 3, 4, 4, 8], dtype=np.int32)),
        "filtered_out": np.array([False, False, True, False]),
    },
    _unsafe=True,
)


def test_fewer_known_items_counts_the_items_that_are_not_padding_null_or_unknown():
    bound = FewerKnownItems(2).bind("route", SCHEMA)
    assert bound.evaluate(TABLE).tolist() == [False, True, True, False]
    assert FewerKnownItems(3).bind("route", SCHEMA).evaluate(TABLE).tolist() == [
        True,
        True,
        True,
        False,
    ]


def test_fewer_known_items_reads_fixed_length_lists_padded_with_zeros():
    dense = TensorTable({"items": np.array([[0, 0, 5, 8], [0, 0, 0, 2]])}, _unsafe=True)
    schema = Schema([ColumnSchema("items", dtype="int64", dims=(None, 4))])
    bound = FewerKnownItems(2, column="items").bind("route", schema)
    assert bound.evaluate(dense).tolist() == [False, True]


def test_all_items_unknown_holds_for_empty_sessions_and_sessions_of_unknown_items_only():
    bound = AllItemsUnknown().bind("route", SCHEMA)
    assert bound.evaluate(TABLE).tolist() == [False, True, True, False]


def test_filtered_out_reads_the_workflows_mark_and_never_holds_without_one():
    assert FilteredOut().bind("route", SCHEMA).evaluate(TABLE).tolist() == [
        False,
        False,
        True,
        False,
    ]
    unfiltered = TensorTable({"item_id-list": TABLE["item_id-list"]}, _unsafe=True)
    assert FilteredOut().bind("route", SCHEMA).evaluate(unfiltered).tolist() == [False] * 4


class LongSession(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        offsets = inputs["item_id-list__offsets"]
        return (offsets[1:] - offsets[:-1]) >= 3


def long_session(arrays):
    return np.diff(arrays["item_id-list__offsets"]) >= 3


def test_a_predicate_in_torchscript_or_python_gets_the_wire_arrays_of_its_columns():
    for function in (LongSession(), long_session):
        bound = Predicate(function, ["item_id-list"]).bind("route", SCHEMA)
        assert bound.evaluate(TABLE).tolist() == [True, False, False, True]


def test_a_predicate_that_does_not_answer_one_bool_per_session_is_an_error():
    wrong = Predicate(lambda arrays: np.array([True]), ["item_id-list"])
    with pytest.raises(ValueError, match=r"one bool per session: shape \[4\], got \[1\]"):
        wrong.evaluate(TABLE)


def test_conditions_name_the_route_and_the_column_they_miss():
    with pytest.raises(SchemaError, match=r"column 'items' at the input of route: expected an int"):
        FewerKnownItems(1, column="items").bind("route", SCHEMA)
    untagged = Schema([ColumnSchema("a", dtype="int64", dims=(None, None))])
    with pytest.raises(SchemaError, match=r"one list column tagged as item ids.*got 0.*name it"):
        AllItemsUnknown().bind("route", untagged)
    with pytest.raises(SchemaError, match=r"column 'session_length' at the input of route"):
        Predicate(long_session, ["session_length"]).bind("route", SCHEMA)


def test_every_condition_is_rebuilt_from_its_saved_form(tmp_path):
    conditions = [
        FilteredOut(),
        FewerKnownItems(2, unknown_ids=[0, 1, 2, 3]).bind("route", SCHEMA),
        AllItemsUnknown().bind("route", SCHEMA),
        Predicate(LongSession(), ["item_id-list"]),
        Predicate(long_session, ["item_id-list"]),
    ]
    for position, condition in enumerate(conditions):
        condition.save_artifacts(str(tmp_path), f"rule_{position}")
        saved = json.loads(json.dumps(condition_config(condition)))
        loaded = condition_from_config(saved, str(tmp_path), f"rule_{position}")
        assert type(loaded) is type(condition)
        assert condition_config(loaded) == condition_config(condition)
        np.testing.assert_array_equal(loaded.evaluate(TABLE), condition.evaluate(TABLE))


def test_a_python_predicate_that_cannot_be_imported_by_the_server_is_refused_at_export():
    with pytest.raises(ValueError, match=r"<lambda>. cannot be exported by its import path"):
        condition_config(Predicate(lambda arrays: arrays, ["item_id-list"]))
