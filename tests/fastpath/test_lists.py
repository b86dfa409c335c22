"""The compiled ListSlice: python slice bounds on every row, padding of python-list rows only."""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import (
    OFFSETS,
    VALUES,
    assert_wire_equal,
    fit,
    oracle,
    request_frame,
    run_module,
    scripted_module,
)

SLICES = [
    {"start": -20},
    {"start": 2},
    {"start": 1, "end": 4},
    {"start": -5, "end": -1},
    {"start": -4, "end": 2},
    {"start": -3, "pad": True},
    {"start": 1, "end": 4, "pad": True, "pad_value": -1},
    {"start": 5, "pad": True, "pad_value": 0.5},
]


def sliced_sessions(**slice_options) -> nvt.Workflow:
    """Groupby lists (python lists, as NVTabular makes them) sliced by one ListSlice."""
    groupby = ["k", "v"] >> nvt.ops.Groupby(groupby_cols=["k"], aggs={"v": ["list"]}, name_sep="-")
    sliced = groupby["v-list"] >> nvt.ops.ListSlice(**slice_options)
    return fit(sliced + groupby["k"], pd.DataFrame({"k": [1, 1, 2], "v": [5, 6, 7]}))


@pytest.fixture(
    scope="module",
    params=SLICES,
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def sliced(request):
    return sliced_sessions(**request.param)


@st.composite
def session_rows(draw):
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    keys = np.repeat(np.arange(len(lengths)), lengths)
    order = np.array(draw(st.permutations(range(len(keys)))))
    return {"k": keys[order], "v": np.arange(len(keys), dtype=np.int64) * 10}


@settings(max_examples=40, deadline=None)
@given(request=session_rows())
def test_list_slice_equals_nvtabular_for_every_kind_of_bound(sliced, request):
    expected = oracle(sliced, request)
    assert_wire_equal(compile_workflow(sliced).transform(request), expected)
    assert_wire_equal(run_module(scripted_module(sliced), request), expected)


def test_list_slice_keeps_python_slice_semantics_for_a_hand_checked_row():
    workflow = sliced_sessions(start=-5, end=-1)
    request = {"k": np.zeros(7, dtype=np.int64), "v": np.arange(7)}
    # [0..6][-5:-1] == [2, 3, 4, 5]
    np.testing.assert_array_equal(
        compile_workflow(workflow).transform(request)["v-list__values"], [2, 3, 4, 5]
    )


def test_list_slice_pads_short_rows_at_the_end_with_the_pad_value():
    workflow = sliced_sessions(start=0, end=4, pad=True, pad_value=-1)
    request = {"k": np.array([1, 2, 2, 2, 2, 2]), "v": np.array([9, 1, 2, 3, 4, 5])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["v-list"], [[9, -1, -1, -1], [1, 2, 3, 4]])
    assert_wire_equal(got, oracle(workflow, request))


@pytest.fixture(scope="module")
def sliced_ragged_input():
    train = pd.DataFrame({"tags": [[1, 2, 3], [4], [5, 6]]})
    return fit(["tags"] >> nvt.ops.ListSlice(1, 3), train)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-5, 5), max_size=6), min_size=1, max_size=8))
def test_list_slice_of_a_ragged_request_column_equals_nvtabular(sliced_ragged_input, rows):
    request = {
        "tags" + VALUES: np.array([value for row in rows for value in row], dtype=np.int64),
        "tags" + OFFSETS: np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(
            np.int32
        ),
    }
    got = compile_workflow(sliced_ragged_input).transform(request)
    assert_wire_equal(got, oracle(sliced_ragged_input, request))
    assert_wire_equal(run_module(scripted_module(sliced_ragged_input), request), got)


def test_list_slice_pad_leaves_ragged_request_rows_unpadded_like_nvtabular():
    workflow = fit(
        ["tags"] >> nvt.ops.ListSlice(0, 3, pad=True), pd.DataFrame({"tags": [[1, 2, 3], [4]]})
    )
    request = {"tags" + VALUES: np.array([1, 2, 3, 4]), "tags" + OFFSETS: np.array([0, 3, 4])}
    # NVTabular pads only rows held as python lists; a request's rows are numpy arrays
    nvtabular_rows = workflow.transform(request_frame(request, workflow.input_schema))["tags"]
    assert [len(row) for row in nvtabular_rows] == [3, 1]
    with pytest.raises(
        ValueError, match=r"'tags' is a list of 3 values per row .* rows hold \[1, 3\] values"
    ):
        compile_workflow(workflow).transform(request)
    with pytest.raises(Exception, match=r"'tags' is a list of 3 values per row .* a row holds 1"):
        run_module(scripted_module(workflow), request)
