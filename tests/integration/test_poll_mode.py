"""A repository tritonserver polls: an ensemble exported into it while it serves is picked up and
answers by name, and the models already served keep answering, without a failed request."""

from __future__ import annotations

import datetime
import os
import re
import signal
import time

import pytest

from merlin_torch_serving import Client, Ensemble, InferenceError, TritonServer
from tests import toy_session
from tests.served import Traffic, assert_frames_equal, stubs_of, wait_for_health

pytestmark = pytest.mark.integration

POLL_INTERVAL_S = 1
#: between Triton saying the new ensemble loaded and the first answer: the client tries every
#: 0.2 s, and a 2-core machine busy with the traffic of this test and with other work needs time
#: to schedule the first request
ANSWER_SLACK_S = 10.0
PICK_UP_TIMEOUT_S = 240.0
_LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d:\d\d:\d\d\.\d+) ")


def log_time(server, needle: str) -> datetime.datetime | None:
    """When the server logged a line containing ``needle`` (its clock, today)."""
    for line in server.logs().splitlines():
        if needle in line and (match := _LOG_TIME.match(line)):
            return datetime.datetime.strptime(match.group(1), "%H:%M:%S.%f")
    return None


@pytest.fixture(scope="module")
def polled(toy_workflow, toy_model, tmp_path_factory):
    repository = tmp_path_factory.mktemp("polled")
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    ensemble.export(repository, "served-first")
    # stop_timeout_s: tritonserver 2.51 never finishes unloading the instance whose stub the last
    # test kills, so stop() waits out the exit timeout (0.75 of it) before it kills the server
    with TritonServer(
        repository, model_control="poll", poll_interval_s=POLL_INTERVAL_S, stop_timeout_s=6
    ) as server:
        yield server, ensemble


def test_an_ensemble_exported_into_a_polled_repository_answers_while_the_others_keep_answering(
    polled, toy_workflow, toy_model
):
    server, first = polled
    requests = [toy_session.interactions(n, seed=60 + n) for n in (1, 16)]
    newcomer = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, k=5), toy_workflow.input_schema
    )
    rows = toy_session.interactions(6, seed=61)
    traffic = Traffic(
        {"grpc": server.grpc_url, "http": server.http_url},
        "served-first",
        requests,
        [first.transform(r) for r in requests],
    )
    with traffic as load, Client(server.grpc_url, retries=0) as client:
        load.wait_for(50)
        result = newcomer.export(server.repository, "dropped-in")
        exported_at = time.monotonic()
        answer = None
        while answer is None and time.monotonic() - exported_at < PICK_UP_TIMEOUT_S:
            try:
                answer = client.infer("dropped-in", rows)
            except InferenceError:  # not found until the next poll has loaded it
                time.sleep(0.2)
        answered_after_s = time.monotonic() - exported_at
        load.wait_for(50)

    assert answer is not None, (
        f"'dropped-in' did not answer {PICK_UP_TIMEOUT_S:g} s after its export"
    )
    assert_frames_equal(answer, newcomer.transform(rows))
    step = next(model for model in result.models if model != "dropped-in")
    load_s = (
        log_time(server, "successfully loaded 'dropped-in'")
        - log_time(server, f"loading: {step}:1")
    ).total_seconds()
    assert answered_after_s <= POLL_INTERVAL_S + load_s + ANSWER_SLACK_S, (answered_after_s, load_s)
    assert load.errors == [], (
        f"{len(load.errors)} of {load.total} requests to 'served-first' failed: {load.errors[:3]}"
    )
    assert load.mismatches == []


def test_a_polled_server_reloads_a_model_whose_stub_died(polled):
    server, first = polled
    rows = toy_session.interactions(3, seed=62)
    step = next(m.name for m in server.health() if m.name.startswith("served-first-"))
    # the export of the other test made the poll reload this model too: kill its serving stub,
    # once the one it replaced has gone
    deadline = time.monotonic() + 60.0
    while len(stubs := stubs_of(server, step)) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(stubs[0], signal.SIGKILL)
    deadline = (
        time.monotonic() + 90.0
    )  # as in test_faults: a look per second plus the step's load time
    answer = None
    with Client(server.grpc_url, retries=0) as client:
        while answer is None and time.monotonic() < deadline:
            try:
                answer = client.infer("served-first", rows)
            except InferenceError:
                time.sleep(0.2)
    assert answer is not None
    assert_frames_equal(answer, first.transform(rows))
    # the model answers once tritonserver has loaded it, a moment before the supervisor's
    # reload call returns and counts it
    assert wait_for_health(server, step, lambda m: m.restarts == 1, 10.0).restarts == 1
