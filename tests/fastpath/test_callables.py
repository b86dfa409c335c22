"""Compiled LambdaOp and Filter.

They compile to numpy calls where those match pandas on probe data; otherwise NVTabular runs them.
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
from tests.fastpath.helpers import assert_wire_equal, fit, oracle, run_module, scripted_module

TRAIN = pd.DataFrame(
    {"a": [1, -2, 3, 40], "b": [0.5, np.nan, 2.0, -1.0], "s": ["x", "y", "zz", "x"]}
)


def rows(draw, count):
    return {
        "a": np.array(
            draw(st.lists(st.integers(-100, 100), min_size=count, max_size=count)), dtype=np.int64
        ),
        "b": np.array(
            draw(
                st.lists(
                    st.one_of(st.floats(-1e3, 1e3), st.just(np.nan)), min_size=count, max_size=count
                )
            )
        ),
        "s": np.array(
            draw(st.lists(st.text(max_size=3), min_size=count, max_size=count)), dtype=object
        ),
    }


@st.composite
def requests(draw):
    return rows(draw, draw(st.integers(1, 30)))


@pytest.fixture(scope="module")
def arithmetic_lambda():
    return fit(["a", "b"] >> nvt.ops.LambdaOp(lambda col: col * 2 + 1), TRAIN)


@pytest.fixture(scope="module")
def row_filter():
    kept = ["a", "b", "s"] >> nvt.ops.Filter(f=lambda df: (df["a"] > 0) & (df.b < 100))
    return fit(kept, TRAIN)


@settings(max_examples=50, deadline=None)
@given(request=requests())
def test_elementwise_lambda_is_compiled_and_equals_nvtabular(arithmetic_lambda, request):
    compiled = compile_workflow(arithmetic_lambda)
    assert compiled.fallbacks == []
    expected = oracle(arithmetic_lambda, request)
    assert_wire_equal(compiled.transform(request), expected)
    assert_wire_equal(run_module(scripted_module(arithmetic_lambda), request), expected)


@settings(max_examples=50, deadline=None)
@given(request=requests())
def test_filter_on_columns_is_compiled_and_equals_nvtabular(row_filter, request):
    compiled = compile_workflow(row_filter)
    assert compiled.fallbacks == []
    assert_wire_equal(compiled.transform(request), oracle(row_filter, request))


@pytest.mark.parametrize(
    "function",
    [
        lambda col: col // 3600,
        lambda col: -col % 7 + (col > 3),
        lambda col: (col * 0.5).astype("int64"),
        lambda col: abs(col - 2) ** 1,
        lambda col: np.floor(col / 3) + np.absolute(col) * np.ceil(col / 7) - np.trunc(col / 2.5),
        lambda col: (col >= 2) & ~(col == 5) | (col < -90),
    ],
    ids=[
        "floor-division",
        "modulo-and-comparison",
        "astype",
        "builtin-abs",
        "exact-ufuncs",
        "bits",
    ],
)
@settings(max_examples=30, deadline=None)
@given(request=requests())
def test_scripted_lambda_of_a_column_equals_nvtabular(function, request):
    workflow = fit(["a"] >> nvt.ops.LambdaOp(function), TRAIN)
    scripted = ScriptedWorkflow(workflow)
    if scripted.uncompiled:  # what the translation leaves to python, it says
        [(_, reason)] = scripted.uncompiled
        assert reason
        return
    assert_wire_equal(run_module(scripted_module(workflow), request), oracle(workflow, request))


@settings(max_examples=50, deadline=None)
@given(request=requests())
def test_scripted_filter_on_columns_equals_nvtabular(request):
    workflow = fit(
        ["a", "b"] >> nvt.ops.Filter(f=lambda df: ((df["a"] > 0) & (df.b < 100)) | (df.a == -7)),
        TRAIN,
    )
    expected = oracle(workflow, request)
    assert_wire_equal(run_module(scripted_module(workflow), request), expected)


@pytest.mark.parametrize(
    ("columns", "function", "reason"),
    [
        (["s"], lambda col: col.str.upper(), "holds strings"),
        (["b"], lambda col: col.fillna(0.0), "`.fillna` of a series"),
        (["b"], lambda col: np.log(col * col + 1), "'log'> has no exact TorchScript counterpart"),
        (["b"], lambda col: np.sqrt(col * col), "'sqrt'> has no exact TorchScript counterpart"),
    ],
    ids=["str-accessor", "fillna", "log", "sqrt"],
)
def test_lambda_without_a_torchscript_form_says_why(columns, function, reason):
    workflow = fit(columns >> nvt.ops.LambdaOp(function), TRAIN)
    [(operator, why)] = ScriptedWorkflow(workflow).uncompiled
    assert operator.startswith("LambdaOp") or "lambda" in operator
    assert reason in why


@pytest.mark.parametrize(
    ("columns", "function"),
    [
        (["s"], lambda col: col.str.upper()),
        (["b"], lambda col: col.fillna(0.0)),
        # pandas' mean skips NaN, numpy's does not: on numpy arrays the probe's NaN tells them apart
        (["b"], lambda col: col - col.mean()),
        (["a", "b"], lambda col: (col - col.min()) / (col.max() - col.min())),
    ],
    ids=["str-accessor", "fillna", "minus-mean", "batch-min-max"],
)
@settings(max_examples=30, deadline=None)
@given(request=requests())
def test_lambda_that_needs_pandas_is_called_on_series_and_equals_nvtabular(
    columns, function, request
):
    workflow = fit(columns >> nvt.ops.LambdaOp(function), TRAIN)
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == []
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


def test_lambda_of_the_whole_dataframe_runs_through_nvtabular():
    workflow = fit(
        ["b"] >> nvt.ops.LambdaOp(lambda col, df: col + df["a"], dependency=["a"]), TRAIN
    )
    compiled = compile_workflow(workflow)
    assert len(compiled.fallbacks) == 1
    assert compiled.fallbacks[0][1] == "the function takes the whole DataFrame as a second argument"
    request = {
        "a": np.array([1, 2]),
        "b": np.array([1.5, np.nan]),
        "s": np.array(["ab", "c"], dtype=object),
    }
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


SECONDS = pd.DataFrame(
    {"t": np.array([1_396_310_400, 1_396_400_000, 1_396_500_000, 0], dtype=np.int64)}
)


@st.composite
def timestamps(draw):
    count = draw(st.integers(1, 20))
    seconds = draw(st.lists(st.integers(-(10**9), 3 * 10**9), min_size=count, max_size=count))
    return {"t": np.array(seconds, dtype=np.int64)}


@pytest.fixture(scope="module")
def datetime_lambdas():
    """The end-to-end example's time features: to_datetime, weekday, a cyclical sine, days since
    the batch's first event (a function of the whole batch)."""
    event_time = (
        ["t"]
        >> nvt.ops.LambdaOp(lambda col: pd.to_datetime(col, unit="s"))
        >> nvt.ops.Rename(name="time")
    )
    weekday = (
        event_time >> nvt.ops.LambdaOp(lambda col: col.dt.weekday) >> nvt.ops.Rename(name="weekday")
    )
    weekday_sin = (
        weekday
        >> (lambda col: np.sin(2 * np.pi * ((col + 1 + 0.000001) / 7)))
        >> nvt.ops.Rename(name="sin")
    )
    day_index = (
        event_time
        >> nvt.ops.LambdaOp(lambda col: (col - col.min()).dt.days + 1)
        >> nvt.ops.Rename(name="day")
    )
    return fit(event_time + weekday + weekday_sin + day_index, SECONDS)


def test_datetime_lambdas_are_compiled(datetime_lambdas):
    assert compile_workflow(datetime_lambdas).fallbacks == []


@settings(max_examples=60, deadline=None)
@given(request=timestamps())
def test_datetime_lambdas_equal_nvtabular_per_request(datetime_lambdas, request):
    assert_wire_equal(
        compile_workflow(datetime_lambdas).transform(request), oracle(datetime_lambdas, request)
    )


def test_datetime_lambdas_have_a_torchscript_form_the_sine_of_weekdays_as_a_table(
    datetime_lambdas,
):
    scripted = ScriptedWorkflow(datetime_lambdas)
    assert scripted.uncompiled == []
    assert scripted.reduces_over_rows == [
        "nvt.ops.LambdaOp(lambda col: (col - col.min()).dt.days + 1)"
    ]


@settings(max_examples=60, deadline=None)
@given(request=timestamps())
def test_scripted_datetime_lambdas_equal_nvtabular_per_request(datetime_lambdas, request):
    got = run_module(scripted_module(datetime_lambdas), request)
    got["time"] = got["time"].view("datetime64[ns]")  # held as int64 nanoseconds in TorchScript
    assert_wire_equal(got, oracle(datetime_lambdas, request))


def test_a_function_of_the_whole_batch_sees_the_requests_rows_like_nvtabular(datetime_lambdas):
    day = 86_400
    alone = {"t": np.array([10 * day], dtype=np.int64)}
    with_earlier = {"t": np.array([10 * day, 7 * day], dtype=np.int64)}
    compiled = compile_workflow(datetime_lambdas)
    assert compiled.transform(alone)["day"].tolist() == [1]
    assert compiled.transform(with_earlier)["day"].tolist() == [4, 1]
    assert_wire_equal(compiled.transform(with_earlier), oracle(datetime_lambdas, with_earlier))


def test_filter_returning_a_dataframe_runs_through_nvtabular():
    workflow = fit(["a", "b"] >> nvt.ops.Filter(f=lambda df: df[df["a"] > 0]), TRAIN)
    compiled = compile_workflow(workflow)
    assert len(compiled.fallbacks) == 1
    assert compiled.fallbacks[0][0] == "Filter"
    request = {"a": np.array([1, -1, 5]), "b": np.array([1.5, 2.5, np.nan])}
    got = compiled.transform(request)
    np.testing.assert_array_equal(got["a"], [1, 5])
    assert_wire_equal(got, oracle(workflow, request))


def test_rows_come_back_from_the_request_when_a_filter_keeps_none_like_nvtabular():
    # NVTabular drops upstream results without rows and reads the inputs from the request instead
    workflow = fit(
        ["a"]
        >> nvt.ops.Filter(f=lambda df: df["a"] > 100)
        >> nvt.ops.LambdaOp(lambda col: col + 1),
        TRAIN,
    )
    request = {"a": np.array([1, 2, 3])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["a"], [2, 3, 4])
    assert_wire_equal(got, oracle(workflow, request))
