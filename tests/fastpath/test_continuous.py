"""The compiled FillMissing, LogOp, Normalize and NormalizeMinMax.

They give the same bits as NVTabular's pandas arithmetic.
"""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving.fastpath import compile_workflow
from merlin_torch_serving.scripted_workflow import ScriptedWorkflow
from tests.fastpath.helpers import (
    OFFSETS,
    VALUES,
    assert_wire_equal,
    fit,
    has_torchscript_form,
    oracle,
    run_module,
    scripted_module,
)

# NVTabular's own log of negative numbers warns; the results (NaN, -inf) are compared exactly
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in log:RuntimeWarning")

TRAIN = pd.DataFrame(
    {
        "x": [0.5, 2.0, np.nan, 10.25, -0.75, 3.0],
        "n": [1, 5, 2, 8, 3, 3],
        "x32": np.array([1.5, 2.5, 0.0, 7.0, 1.0, 2.0], dtype=np.float32),
    }
)
GRAPHS = {
    "fill_missing": lambda columns: columns >> nvt.ops.FillMissing(fill_val=-1.5),
    "fill_missing_flagged": lambda columns: columns >> nvt.ops.FillMissing(add_binary_cols=True),
    "fill_then_normalize": lambda columns: columns >> nvt.ops.FillMissing() >> nvt.ops.Normalize(),
    "log": lambda columns: columns >> nvt.ops.LogOp(),
    "normalize": lambda columns: columns >> nvt.ops.Normalize(),
    "normalize_minmax": lambda columns: columns >> nvt.ops.NormalizeMinMax(),
}


@pytest.fixture(scope="module", params=sorted(GRAPHS))
def continuous(request):
    return fit(GRAPHS[request.param](["x", "n", "x32"]), TRAIN)


@settings(max_examples=60, deadline=None)
@given(
    x=st.lists(
        st.one_of(st.floats(-1e3, 1e6), st.just(np.nan), st.just(-1.0), st.just(0.0)),
        min_size=1,
        max_size=30,
    ),
    data=st.data(),
)
def test_continuous_operators_equal_nvtabular(continuous, x, data):
    rows = len(x)
    request = {
        "x": np.array(x),
        "n": np.array(
            data.draw(st.lists(st.integers(-(10**6), 10**6), min_size=rows, max_size=rows)),
            dtype=np.int64,
        ),
        "x32": np.array(
            data.draw(st.lists(st.floats(-1e4, 1e4, width=32), min_size=rows, max_size=rows)),
            dtype=np.float32,
        ),
    }
    compiled = compile_workflow(continuous)
    assert compiled.fallbacks == []
    expected = oracle(continuous, request)
    assert_wire_equal(compiled.transform(request), expected)
    if has_torchscript_form(continuous):  # LogOp stays with python (see the test below)
        assert_wire_equal(run_module(scripted_module(continuous), request), expected)


def test_log_op_has_no_torchscript_form_and_says_why():
    workflow = fit(["x"] >> nvt.ops.LogOp(), TRAIN[["x"]])
    [(operator, reason)] = ScriptedWorkflow(workflow).uncompiled
    assert operator == "LogOp"
    assert "numpy's float32 log" in reason


def test_every_other_continuous_operator_has_a_torchscript_form():
    for name, graph in GRAPHS.items():
        if name != "log":
            workflow = fit(graph(["x", "n", "x32"]), TRAIN)
            assert ScriptedWorkflow(workflow).uncompiled == [], name


def test_log_op_computes_log1p_in_float32():
    workflow = fit(["x"] >> nvt.ops.LogOp(), TRAIN[["x"]])
    got = compile_workflow(workflow).transform({"x": np.array([0.0, np.e - 1])})
    assert got["x"].dtype == np.float32
    np.testing.assert_allclose(got["x"], [0.0, 1.0], rtol=1e-6)


@pytest.fixture(scope="module")
def ragged_log():
    return fit(["prices"] >> nvt.ops.LogOp(), pd.DataFrame({"prices": [[1.0, 2.0], [3.0]]}))


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.floats(0, 1e3), max_size=5), min_size=1, max_size=6))
def test_log_op_of_a_ragged_request_column_equals_nvtabular(ragged_log, rows):
    request = {
        "prices" + VALUES: np.array([value for row in rows for value in row], dtype=np.float64),
        "prices" + OFFSETS: (
            np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int32)
        ),
    }
    assert_wire_equal(compile_workflow(ragged_log).transform(request), oracle(ragged_log, request))


def test_fill_missing_with_a_value_float32_cannot_hold_equals_nvtabular():
    # pandas moves such a column to float64 when it has a NaN to fill; the kernel leaves it to
    # NVTabular
    workflow = fit(["x32"] >> nvt.ops.FillMissing(fill_val=0.1), TRAIN[["x32"]])
    request = {"x32": np.array([np.nan, 1.0], dtype=np.float32)}
    assert_wire_equal(compile_workflow(workflow).transform(request), oracle(workflow, request))
