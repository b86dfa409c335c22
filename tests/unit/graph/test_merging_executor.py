"""Concurrent in-process calls merged into runs answer exactly as the calls run one at a time."""

import threading
import time

import numpy as np
import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    Ensemble,
    InferenceError,
    LocalExecutor,
    MergingExecutor,
    ServingOperator,
)
from tests import toy_session


def _concurrently(call, arguments: list) -> list:
    """``call(argument)`` for every argument, each in a thread of its own, all started together;
    the result or the error each raised."""
    results: list = [None] * len(arguments)
    start = threading.Barrier(len(arguments))

    def caller(index: int) -> None:
        start.wait()
        try:
            results[index] = call(arguments[index])
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(arguments))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.fixture(scope="module")
def session_ensemble(toy_workflow, toy_model):
    return Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )


def _requests(columns: list[str]) -> list[pd.DataFrame]:
    """One-session requests with ids of their own, bigger ones, one of no clicks, and two that hold
    the same session id (which must not merge into one session)."""
    sizes = [1] * 10 + [3, 7, 1, 1]
    requests = [
        toy_session.interactions(n, seed=i, first_session=1000 + 100 * i)[columns]
        for i, n in enumerate(sizes)
    ]
    requests.append(toy_session.interactions(1, seed=90, first_session=5000)[columns])
    requests.append(toy_session.interactions(1, seed=91, first_session=5000)[columns])
    requests.append(requests[0].iloc[:0])
    return requests


def test_concurrent_calls_are_merged_and_answer_as_calls_one_at_a_time(session_ensemble):
    columns = session_ensemble.input_schema.column_names
    requests = _requests(columns)
    expected = [session_ensemble.transform(request, LocalExecutor()) for request in requests]
    executor = MergingExecutor()

    for _ in range(3):
        answers = _concurrently(lambda r: session_ensemble.transform(r, executor), requests)
        for request, answer, alone in zip(requests, answers, expected, strict=True):
            assert not isinstance(answer, Exception), answer
            pd.testing.assert_frame_equal(answer, alone, check_exact=True)
            assert set(answer["session_id"]) == set(request["session_id"])

    assert max(executor.run_sizes) > 1, executor.run_sizes
    assert sum(executor.run_sizes) == 3 * len(requests)


class RefuseThirteen(ServingOperator):
    """Doubles x, and fails a request that holds 13; slowly, so that calls queue while it runs."""

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return Schema([ColumnSchema("y", dtype="int64")])

    def transform(self, col_selector, transformable):
        time.sleep(0.02)
        values = np.asarray(transformable["x"].values)
        if (values == 13).any():
            raise ValueError("x holds 13")
        return TensorTable({"y": values * 2}, _unsafe=True)


def test_a_failing_call_fails_alone_when_its_merged_run_fails():
    ensemble = Ensemble(["x"] >> RefuseThirteen(), Schema([ColumnSchema("x", dtype="int64")]))
    executor = MergingExecutor()
    requests = [{"x": [i, i + 1]} for i in range(0, 40, 2)]  # the one of 12 and 13 fails

    answers = _concurrently(lambda r: ensemble.transform(r, executor), requests)

    for request, answer in zip(requests, answers, strict=True):
        if 13 in request["x"]:
            assert isinstance(answer, InferenceError)
            assert str(answer) == "inference on '0:RefuseThirteen' failed: ValueError: x holds 13"
        else:
            assert not isinstance(answer, Exception), answer
            assert answer["y"].tolist() == [2 * x for x in request["x"]]
    assert max(executor.run_sizes) > 1, executor.run_sizes  # the failing call was in a merged run


def test_calls_cut_into_runs_of_at_most_max_batch_rows_answer_as_alone(session_ensemble):
    columns = session_ensemble.input_schema.column_names
    requests = _requests(columns)
    executor = MergingExecutor(max_batch_rows=5)

    answers = _concurrently(lambda r: session_ensemble.transform(r, executor), requests)

    assert max(executor.run_sizes) > 1, executor.run_sizes
    for request, answer in zip(requests, answers, strict=True):
        pd.testing.assert_frame_equal(
            answer, session_ensemble.transform(request, LocalExecutor()), check_exact=True
        )


def test_max_batch_rows_must_be_positive():
    with pytest.raises(ValueError, match="max_batch_rows must be at least 1, got 0"):
        MergingExecutor(max_batch_rows=0)


class Interrupted(BaseException):
    """Stands for an interrupt: not an Exception, so no call may swallow it."""


class InterruptOnNinetyNine(ServingOperator):
    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return Schema([ColumnSchema("y", dtype="int64")])

    def transform(self, col_selector, transformable):
        time.sleep(0.02)
        values = np.asarray(transformable["x"].values)
        if (values == 99).any():
            raise Interrupted
        return TensorTable({"y": values}, _unsafe=True)


def test_an_interrupt_in_a_run_reaches_its_calls_and_leaves_the_executor_serving():
    ensemble = Ensemble(
        ["x"] >> InterruptOnNinetyNine(), Schema([ColumnSchema("x", dtype="int64")])
    )
    executor = MergingExecutor()
    requests = [{"x": [i]} for i in range(90, 100)]

    answers = _concurrently(lambda r: _or_interrupt(ensemble, executor, r), requests)

    assert answers[-1] == "interrupted"  # the call that holds 99, in whichever run it was
    for answer, request in zip(answers, requests, strict=True):  # the others: answered or told
        assert isinstance(answer, str) or answer["y"].tolist() == request["x"]
    assert ensemble.transform({"x": [5]}, executor)["y"].tolist() == [5]  # not stuck


def _or_interrupt(ensemble, executor, request):
    try:
        return ensemble.transform(request, executor)
    except Interrupted:
        return "interrupted"
