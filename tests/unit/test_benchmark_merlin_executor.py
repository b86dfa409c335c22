"""The benchmarks' change to Merlin's executor (benchmarks/merlin_executor.py), checked against
merlin-core's own ``LocalExecutor`` on a graph where three branches read one node: as installed
here (merlin-core 23.08), Merlin runs that node once per branch; kept, it runs once, and the answer
is the same."""

from importlib import metadata

import numpy as np
import pandas as pd
import pytest
from merlin.dag import BaseOperator, ColumnSelector, Graph
from merlin.dag.executors import LocalExecutor
from merlin.dag.ops import Rename
from merlin.schema import ColumnSchema, Schema

from benchmarks.merlin_executor import (
    COLUMN_ROUTING,
    KeptResultsExecutor,
    TimedExecutor,
)

MERLIN_CORE = metadata.version("merlin-core")


class CountedDouble(BaseOperator):
    """Doubles its columns and counts its calls in the list it was given."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def transform(self, col_selector: ColumnSelector, transformable):
        self.calls.append(1)
        return type(transformable)({name: transformable[name] * 2 for name in col_selector.names})


@pytest.fixture
def fan_out():
    """``shared = x >> CountedDouble``, read by three branches that rename its output."""
    calls: list = []
    shared = ["x"] >> CountedDouble(calls)
    output = (
        (shared >> Rename(postfix="_a"))
        + (shared >> Rename(postfix="_b"))
        + (shared >> Rename(postfix="_c"))
    )
    graph = Graph(output)
    graph.construct_schema(Schema([ColumnSchema("x", dtype=np.int64)]))
    return graph, calls


def test_merlins_local_executor_runs_a_node_once_per_branch_that_reads_it(fan_out):
    graph, calls = fan_out
    answer = LocalExecutor().transform(pd.DataFrame({"x": [1, 2, 3]}), graph)
    assert len(calls) == 3, f"merlin-core {MERLIN_CORE}"
    assert answer["x_a"].tolist() == answer["x_c"].tolist() == [2, 4, 6]


def test_kept_results_run_the_shared_node_once_and_answer_as_merlin_does(fan_out):
    graph, calls = fan_out
    request = pd.DataFrame({"x": [1, 2, 3]})
    merlin = LocalExecutor().transform(request, graph)
    calls.clear()
    executor = KeptResultsExecutor()
    kept = executor.transform(request, graph)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(kept, merlin)
    # and once again for the next request: nothing is kept across requests
    executor.transform(request, graph)
    assert len(calls) == 2


def test_the_timed_executor_counts_each_operator_as_merlin_runs_it(fan_out):
    graph, _ = fan_out
    executor = TimedExecutor()
    executor.transform(pd.DataFrame({"x": [1]}), graph)
    assert executor.calls["CountedDouble"] == 3
    assert executor.calls["Rename"] == 3
    assert executor.calls[COLUMN_ROUTING] >= 1  # the "+" of the branches
    assert executor.transform_seconds >= sum(executor.seconds.values()) > 0
