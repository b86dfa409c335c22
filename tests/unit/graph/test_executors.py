"""The in-process executor runs the graph with one torch thread by default, as exports do, and
leaves the process's own setting as it found it."""

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, LocalExecutor, ServingOperator


class RecordThreads(ServingOperator):
    """Returns, per row, the torch thread count it ran with."""

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return Schema([ColumnSchema("threads", dtype="int64")])

    def transform(self, col_selector, transformable):
        rows = len(transformable["x"].values)
        return TensorTable(
            {"threads": np.full(rows, torch.get_num_threads(), dtype=np.int64)}, _unsafe=True
        )


@pytest.fixture
def ensemble():
    schema = Schema([ColumnSchema("x", dtype="int64")])
    return Ensemble(["x"] >> RecordThreads(), schema)


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def test_local_executor_runs_with_one_torch_thread_and_restores_the_process_setting(
    ensemble, two_threads
):
    result = ensemble.transform({"x": [1, 2]})
    assert result["threads"].tolist() == [1, 1]
    assert torch.get_num_threads() == 2


def test_local_executor_keeps_the_process_setting_when_asked(ensemble, two_threads):
    result = ensemble.transform({"x": [1]}, LocalExecutor(torch_threads=None))
    assert result["threads"].tolist() == [2]


def test_local_executor_rejects_zero_threads():
    with pytest.raises(ValueError, match="torch_threads must be at least 1 or None, got 0"):
        LocalExecutor(torch_threads=0)
