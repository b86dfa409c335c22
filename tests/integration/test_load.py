"""Concurrent traffic over gRPC and HTTP, of mixed sizes, every answer compared with in-process:
no error and no mismatch; and a new version loaded under that traffic without a failed request."""

from __future__ import annotations

import pytest

from merlin_torch_serving import Ensemble
from tests import toy_session
from tests.served import Traffic

pytestmark = pytest.mark.integration

#: answers counted in a test: enough that every thread sent many requests of both sizes
#: (2 threads per protocol, a dozen kinds of request)
ANSWERS = 600


@pytest.fixture(scope="module")
def served(triton_server, toy_workflow, toy_model):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    result = ensemble.export(triton_server.repository, "under-load")
    triton_server.load("under-load")
    # one session and 32 sessions per request, shuffled clicks, sessions that differ per request
    requests = [
        toy_session.interactions(n, seed=seed, first_session=10_000 * seed).sample(
            frac=1.0, random_state=seed
        )
        for seed, n in enumerate([1, 32] * 6, start=1)
    ]
    return ensemble, result, requests, [ensemble.transform(request) for request in requests]


def traffic(server, served) -> Traffic:
    _ensemble, result, requests, expected = served
    return Traffic(
        {"grpc": server.grpc_url, "http": server.http_url}, result.name, requests, expected
    )


def assert_clean(load: Traffic) -> None:
    assert load.errors == [], (
        f"{len(load.errors)} of {load.total} requests failed, e.g. {load.errors[:3]}"
    )
    assert load.mismatches == [], (
        f"{len(load.mismatches)} answers differ from in-process, e.g. {load.mismatches[:3]}"
    )
    assert set(load.answered) == {"grpc", "http"}


def test_concurrent_requests_of_mixed_sizes_over_both_protocols_all_equal_in_process(
    triton_server, served
):
    with traffic(triton_server, served) as load:
        load.wait_for(ANSWERS)
    assert load.total >= ANSWERS
    assert_clean(load)


def test_a_new_export_is_reloaded_under_load_without_a_failed_request(triton_server, served):
    ensemble, result, _, _ = served
    step = next(model for model in result.models if model != result.name)
    loads_before = triton_server.logs().count(f"successfully loaded '{step}'")
    with traffic(triton_server, served) as load:
        load.wait_for(ANSWERS // 4)
        # export + swap the same graph anew, then load it beside the running version
        ensemble.export(triton_server.repository, result.name, overwrite=True)
        triton_server.reload(step)
        load.wait_for(ANSWERS // 4)
    assert triton_server.logs().count(f"successfully loaded '{step}'") == loads_before + 1, (
        "the step was not reloaded"
    )
    assert_clean(load)
    assert all(model.healthy for model in triton_server.health() if model.name in result.models)


def test_reloading_the_ensemble_with_unchanged_files_restarts_its_steps_under_load(
    triton_server, served
):
    _, result, _, _ = served
    step = next(model for model in result.models if model != result.name)
    loads_before = triton_server.logs().count(f"successfully loaded '{step}'")
    with traffic(triton_server, served) as load:
        load.wait_for(ANSWERS // 4)
        triton_server.reload(result.name)  # nothing exported anew
        load.wait_for(ANSWERS // 4)
    assert triton_server.logs().count(f"successfully loaded '{step}'") == loads_before + 1
    assert_clean(load)
