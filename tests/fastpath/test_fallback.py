"""Operators without a kernel run through NVTabular.

They say so once, and still give NVTabular's result.
"""

from __future__ import annotations

import logging

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest
from merlin.dag import ColumnSelector

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import assert_wire_equal, fit, oracle

# fitting ShiftedLog takes the log of a negative training price
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in log:RuntimeWarning")

TRAIN = pd.DataFrame(
    {
        "item": [3, 1, 3, 2],
        "price": [1.5, np.nan, -2.0, 8.0],
        "session": [1, 1, 2, 2],
        "t": [1, 2, 3, 4],
    }
)


class ReverseLists(nvt.ops.Operator):
    """A user operator with its own transform: reverses every list (on pandas object columns)."""

    def transform(self, col_selector: ColumnSelector, df: pd.DataFrame) -> pd.DataFrame:
        for name in col_selector.names:
            df[name] = df[name].apply(lambda row: list(row)[::-1])
        return df


class ShiftedLog(nvt.ops.LogOp):
    """A subclass of a compiled operator that changes what transform does."""

    def transform(self, col_selector: ColumnSelector, df: pd.DataFrame) -> pd.DataFrame:
        return super().transform(col_selector, df) + 1


def fast_path_messages(caplog) -> list[str]:
    return [
        record.getMessage() for record in caplog.records if record.name == "merlin_torch_serving"
    ]


def test_operators_without_a_kernel_run_through_nvtabular_and_log_one_line_each(tmp_path, caplog):
    items = ["item"] >> nvt.ops.Categorify(out_path=str(tmp_path))
    prices = (
        ["price"]
        >> nvt.ops.FillMissing(fill_val=0.5)
        >> nvt.ops.Clip(min_value=0.0)
        >> nvt.ops.Bucketize([1.0])
    )
    workflow = fit(items + prices, TRAIN[["item", "price"]])
    with caplog.at_level(logging.WARNING, logger="merlin_torch_serving"):
        compiled = compile_workflow(workflow)
    assert compiled.fallbacks == [
        ("Clip", "Clip has no compiled kernel"),
        ("Bucketize", "Bucketize has no compiled kernel"),
    ]
    assert fast_path_messages(caplog) == [
        "fast path: operator 'Clip' runs through NVTabular: Clip has no compiled kernel",
        "fast path: operator 'Bucketize' runs through NVTabular: Bucketize has no compiled kernel",
    ]
    request = {"item": np.array([3, 7, 1]), "price": np.array([np.nan, -1.0, 2.5])}
    got = compiled.transform(request)
    np.testing.assert_array_equal(got["price"], [0, 0, 1])  # filled 0.5, clipped 0.0, 2.5
    assert_wire_equal(got, oracle(workflow, request))


def test_subclass_that_overrides_transform_is_not_taken_for_its_parent():
    workflow = fit(["price"] >> ShiftedLog(), TRAIN[["price"]])
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == [("ShiftedLog", "ShiftedLog has no compiled kernel")]
    request = {"price": np.array([0.0, np.nan, 3.0])}
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


def test_user_operator_on_session_lists_runs_through_nvtabular_between_compiled_steps(tmp_path):
    items = ["item"] >> nvt.ops.Categorify(out_path=str(tmp_path))
    sessions = (["session", "t"] + items) >> nvt.ops.Groupby(
        groupby_cols=["session"], sort_cols=["t"], aggs={"item": ["list"]}, name_sep="-"
    )
    reversed_items = sessions["item-list"] >> ReverseLists() >> nvt.ops.ListSlice(2)
    workflow = fit(reversed_items + sessions["session"], TRAIN[["item", "session", "t"]])
    compiled = compile_workflow(workflow)
    assert [label for label, _ in compiled.fallbacks] == ["ReverseLists"]
    request = {
        "item": np.array([3, 1, 2, 9, 3]),
        "session": np.array([5, 5, 5, 6, 6]),
        "t": np.array([1, 2, 3, 1, 2]),
    }
    got = compiled.transform(request)
    # session 5 in time order is items 3, 1, 2 (labels 3, 4, 5); reversed and cut to two: 5, 4
    np.testing.assert_array_equal(got["item-list__values"][:2], [5, 4])
    assert_wire_equal(got, oracle(workflow, request))


def test_data_a_kernel_does_not_reproduce_runs_through_nvtabular_for_that_request(tmp_path, caplog):
    workflow = fit(
        ["item"] >> nvt.ops.Categorify(out_path=str(tmp_path)),
        TRAIN.assign(item=["a", "b", "a", "c"])[["item"]],
    )
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == []
    # numbers cannot be compared with a vocabulary of strings; NVTabular decides what they become
    request = {"item": np.array([1, 2])}
    with caplog.at_level(logging.DEBUG, logger="merlin_torch_serving"):
        got = compiled.transform(request)
    assert any(
        "Categorify runs through NVTabular for this request" in m
        for m in fast_path_messages(caplog)
    )
    assert_wire_equal(got, oracle(workflow, request))
