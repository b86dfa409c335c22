"""The check at a step's entry: wire arrays that break the format are refused, naming the tensor."""

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_torch_serving import InputError
from merlin_torch_serving.graph.plan import REQUEST, Ref
from merlin_torch_serving.graph.validation import EntryCheck

SCHEMA = Schema(
    [
        ColumnSchema("session_id", dtype="int64"),
        ColumnSchema("items", dtype="int64", dims=(None, None)),
        ColumnSchema("weights", dtype="float32", dims=(None, 2)),
    ]
)
CHECK = EntryCheck(SCHEMA, (("session_id", "items", "weights"),))


def arrays(**overrides):
    data = {
        "session_id": np.array([7, 8], dtype=np.int64),
        "items__values": np.array([3, 4, 5, 6], dtype=np.int64),
        "items__offsets": np.array([0, 3, 4], dtype=np.int32),
        "weights": np.ones((2, 2), dtype=np.float32),
    }
    data.update(overrides)
    return data


def test_a_well_formed_request_passes():
    CHECK.check(arrays())


def test_a_request_with_no_rows_passes():
    CHECK.check(
        arrays(
            session_id=np.zeros(0, np.int64),
            items__values=np.zeros(0, np.int64),
            items__offsets=np.zeros(1, np.int32),
            weights=np.zeros((0, 2), np.float32),
        )
    )


@pytest.mark.parametrize(
    ("offsets", "got"),
    [
        ([1, 3, 4], "a first offset of 1"),
        ([0, 3, 3], "a last offset of 3"),  # ends before the values
        ([0, 3, 5], "a last offset of 5"),  # ends past them
        ([0, 4, 2, 4], "offsets going back from 4 to 2 at row 1"),
        ([], "no offsets"),
    ],
)
def test_offsets_that_do_not_describe_the_values_are_refused(offsets, got):
    with pytest.raises(
        InputError,
        match=rf"input column 'items__offsets': expected offsets from 0 up to .*, got {got}",
    ):
        CHECK.check(arrays(items__offsets=np.array(offsets, dtype=np.int32)))


def test_offsets_of_the_wrong_length_are_refused_as_a_row_count_mismatch():
    # [0, 1, 3, 4] describes the values but says 3 rows where the other columns have 2
    with pytest.raises(
        InputError,
        match=r"input column 'items': expected 2 rows, like 'session_id', 'weights', got 3 rows",
    ):
        CHECK.check(arrays(items__offsets=np.array([0, 1, 3, 4], dtype=np.int32)))


def test_columns_of_different_row_counts_are_refused_naming_the_odd_one():
    with pytest.raises(
        InputError, match=r"'session_id': expected 2 rows, like 'items', 'weights', got 3 rows"
    ):
        CHECK.check(arrays(session_id=np.array([1, 2, 3], dtype=np.int64)))


def test_columns_of_different_producers_may_differ_in_rows():
    check = EntryCheck(SCHEMA, (("session_id",), ("items", "weights")))
    check.check(arrays(session_id=np.array([1, 2, 3], dtype=np.int64)))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"session_id": np.array([7, 8], dtype=np.int32)},
            r"'session_id': expected int64 tensor of dims \[-1\], got int32 values",
        ),
        (
            {"weights": np.ones((2, 3), np.float32)},
            r"'weights': expected float32 tensor of dims \[-1, 2\], got shape \[2, 3\]",
        ),
        ({"extra": np.zeros(2)}, r"'extra': expected no such input"),
        ({"session_id": [7, 8]}, r"'session_id': .*got a list"),
    ],
)
def test_wrong_dtype_shape_name_or_type_is_refused(override, message):
    with pytest.raises(InputError, match=message):
        CHECK.check(arrays(**override))


def test_a_missing_tensor_is_named():
    data = arrays()
    del data["items__offsets"]
    with pytest.raises(
        InputError,
        match=r"'items__offsets': expected int32 tensor .* for column 'items', got no such tensor",
    ):
        CHECK.check(data)


def test_more_rows_than_the_limit_are_refused_counting_list_values():
    check = EntryCheck(SCHEMA, CHECK.row_groups, max_rows=3)
    with pytest.raises(
        InputError,
        match=r"'items__values': expected at most 3 rows per request, got 4; send fewer rows",
    ):
        check.check(arrays())


def test_nulls_in_grouping_keys_and_id_columns_are_refused():
    schema = Schema(
        [
            ColumnSchema("session_id", dtype="float64"),
            ColumnSchema("item", dtype="str", tags=[Tags.ID]),
        ]
    )
    check = EntryCheck.for_entry(
        schema, {"session_id": Ref(REQUEST, "session_id"), "item": Ref(REQUEST, "item")}, []
    )
    assert check.non_null == {"item"}
    with pytest.raises(
        InputError,
        match=r"'item': expected no missing values .*, got a missing \(null\) value at row 1",
    ):
        check.check(
            {"session_id": np.array([1.0, 2.0]), "item": np.array(["a", None], dtype=object)}
        )
    keyed = EntryCheck(schema, check.row_groups, frozenset({"session_id"}))
    with pytest.raises(InputError, match=r"'session_id': expected no missing values"):
        keyed.check(
            {"session_id": np.array([1.0, np.nan]), "item": np.array(["a", "b"], dtype=object)}
        )


def test_the_session_key_and_the_raw_item_id_of_a_session_workflow_must_not_be_null(
    toy_workflow, toy_model
):
    from merlin_torch_serving import Ensemble
    from tests import toy_session

    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    assert ensemble.plan.request_groups() == ["session_id"]
    requests = {name: Ref(REQUEST, name) for name in toy_workflow.input_schema.column_names}
    # item_id feeds 'item_id-list', tagged as the item id; category is a feature that may be null
    check = EntryCheck.for_entry(toy_workflow.input_schema, requests, ensemble.plan.calls)
    assert check.non_null == {"session_id", "item_id"}
