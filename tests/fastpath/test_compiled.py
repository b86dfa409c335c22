"""How compiled steps feed each other: NVTabular's executor rules, kept even where they surprise."""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import assert_wire_equal, fit, oracle

TRAIN = pd.DataFrame({"a": [1.5, -2.0, 3.0], "b": [1, 2, 3]})

# fitting LogOp takes the log of a negative training value
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in log:RuntimeWarning")


def test_branches_with_fewer_rows_are_filled_with_nulls_like_nvtabular():
    # pandas concatenates the branches side by side and fills the shorter one with NaN
    workflow = fit((["a"] >> nvt.ops.Filter(f=lambda df: df["a"] > 0)) + ["b"], TRAIN)
    request = {"a": np.array([-1.0, 2.0, -3.0, 4.0]), "b": np.array([10, 20, 30, 40])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["a"], [2.0, 4.0, np.nan, np.nan])
    np.testing.assert_array_equal(got["b"], [10, 20, 30, 40])
    assert_wire_equal(got, oracle(workflow, request))


def test_later_branch_wins_when_two_branches_produce_the_same_column():
    workflow = fit(
        (["a"] >> nvt.ops.LogOp()) + (["a"] >> nvt.ops.LambdaOp(lambda col: col * 2)), TRAIN
    )
    request = {"a": np.array([1.0, 3.0])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["a"], [2.0, 6.0])
    assert_wire_equal(got, oracle(workflow, request))


def test_steps_after_a_filter_that_keeps_nothing_return_no_rows_where_nvtabular_fails(
    rich_session_workflow,
):
    request = {
        "session_id": np.array([1, 2]),
        "timestamp": np.array([10, 20]),
        "item_id": np.array(["x", "y"], dtype=object),
        "category": np.array([1, 2]),
        "price": np.array([1.0, 2.0]),
    }
    # every session has one row, the filter keeps none, and later steps find no list columns
    with pytest.raises(KeyError):
        oracle(rich_session_workflow, request)
    got = compile_workflow(rich_session_workflow).transform(request)
    assert got["session_id"].shape == (0,)
    assert got["item_id-list"].shape == (0, 20)  # padded lists keep their width
    np.testing.assert_array_equal(got["category-list__offsets"], [0])


def test_every_operator_running_through_nvtabular_also_returns_no_rows_after_such_a_filter(
    rich_session_workflow,
):
    request = {
        "session_id": np.array([1, 2, 2]),
        "timestamp": np.array([10, 20, 30]),
        "item_id": np.array(["x", "y", "z"], dtype=object),
        "category": np.array([1, 2, 2]),
        "price": np.array([1.0, 2.0, 3.0]),
    }
    unfiltered = compile_workflow(rich_session_workflow, kernels=False).transform(request)
    assert_wire_equal(unfiltered, oracle(rich_session_workflow, request))
    single_clicks = {name: values[:2] for name, values in request.items()}
    assert compile_workflow(rich_session_workflow, kernels=False).transform(single_clicks)[
        "session_id"
    ].shape == (0,)


def test_schema_only_operators_compile_and_pass_data_through():
    from merlin.schema import Tags

    tagged = ["a"] >> nvt.ops.AddProperties(properties={"unit": "eur"}) >> nvt.ops.TagAsItemID()
    renamed = (
        ["b"]
        >> nvt.ops.Rename(f=lambda name: name + "_renamed")
        >> nvt.ops.AddTags(tags=[Tags.USER])
    )
    # subtracting a plain column list fails in NVTabular 23.08 itself; subtract a node instead
    kept = (["a", "b"] >> nvt.ops.AddMetadata(tags=[Tags.CONTINUOUS])) - (
        ["b"] >> nvt.ops.AddTags([Tags.ID])
    )
    workflow = fit(tagged + renamed + (kept >> nvt.ops.Rename(postfix="_kept")), TRAIN)
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == []
    request = {"a": np.array([0.5, -1.0]), "b": np.array([7, 8])}
    got = compiled.transform(request)
    assert sorted(got) == ["a", "a_kept", "b_renamed"]
    np.testing.assert_array_equal(got["b_renamed"], [7, 8])
    assert_wire_equal(got, oracle(workflow, request))
