"""The official examples exported and served on the real tritonserver, all on the python backend
and mixed (the python workflow step, then the model with its TopK, decoding and the blanking of
filtered sessions compiled into one libtorch step): over gRPC and HTTP the answer equals the
in-process answer bit for bit, filtered sessions and session ids included, for requests of one to
32 sessions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Client
from tests.official.example import request_rows

pytestmark = pytest.mark.integration


BACKENDS = ("python", "pytorch")


# session scope: a module fixture would be built again whenever the session-wide `example` switches
@pytest.fixture(scope="session")
def served(triton_server, pytorch_backend, getting_started_example, end_to_end_example):
    """Ensemble and served model name of each example, per backend of its model."""
    served = {}
    for example in (getting_started_example, end_to_end_example):
        for backend in BACKENDS:
            name = f"official-{example.name}-{backend}"
            ensemble = example.ensemble(backend)
            ensemble.export(triton_server.repository, name)
            triton_server.load(name)
            served[example.name, backend] = (ensemble, name)
    return served


def assert_same_answer(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    for name in expected.columns:
        column = expected[name]
        if column.dtype == object:  # list cells: compare as one array, NaN equal to NaN
            np.testing.assert_array_equal(np.stack(got[name]), np.stack(column), err_msg=name)
        else:
            assert got[name].dtype == column.dtype, name
            np.testing.assert_array_equal(got[name].to_numpy(), column.to_numpy(), err_msg=name)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_served_answer_equals_in_process_answer_exactly(
    triton_server, served, example, backend, protocol, n_sessions
):
    ensemble, name = served[example.name, backend]
    rows = request_rows(example, n_sessions, seed=100 + n_sessions)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url

    answer = Client(url, protocol=protocol).infer(name, rows)

    assert_same_answer(answer, ensemble.transform(rows))
    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))
    assert answer["filtered_out"].sum() == 1  # the one-click session, answered and marked


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_click_session_alone_is_answered_and_marked(
    triton_server, served, getting_started_example, backend
):
    ensemble, name = served["getting_started", backend]
    rows = request_rows(getting_started_example, 1, seed=7)
    answer = Client(triton_server.grpc_url).infer(name, rows)
    assert answer["filtered_out"].tolist() == [True]
    assert (answer["item_ids"][0] == -1).all()
    assert np.isnan(answer["item_scores"][0]).all()
    assert_same_answer(answer, ensemble.transform(rows))
