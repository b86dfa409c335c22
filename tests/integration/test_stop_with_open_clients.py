"""A ``Client`` over HTTP left open does not hold up ``TritonServer.stop()``.

tritonserver's graceful stop waits for every open HTTP connection to close, counting down its exit
timeout once a second in its log ("Timeout 15: Found 1 HTTP service connections"); an idle
keep-alive connection never closes by itself. The tests read that countdown from the log rather
than timing the stop.
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from merlin_torch_serving import Client, TritonServer
from tests.triton_models import INT64_VECTOR, write_doubler, write_python_model

pytestmark = pytest.mark.integration

STOP_TIMEOUT_S = 20.0  # the default: tritonserver's exit timeout is 15 s of it
HTTP_WAIT = re.compile(r"Timeout (\d+): Found (\d+) HTTP service connections")


def http_waits(server: TritonServer) -> list[tuple[int, int]]:
    """(seconds left of the exit timeout, open HTTP connections) for each second of waiting."""
    return [(int(left), int(open_)) for left, open_ in HTTP_WAIT.findall(server.logs())]


def test_stop_closes_an_idle_http_client_left_open_which_reconnects_to_the_next_server(tmp_path):
    write_doubler(tmp_path, "doubler")
    first = TritonServer(tmp_path, stop_timeout_s=STOP_TIMEOUT_S).start()
    try:
        client = Client(first.http_url, "http")  # never closed, as a notebook cell leaves it
        assert client.infer("doubler", {"x": [1, 2]})["y"].tolist() == [2, 4]
    finally:
        first.stop()
    assert http_waits(first) == []

    port = int(first.http_url.rpartition(":")[2])
    with TritonServer(tmp_path, http_port=port) as second:
        assert client.infer("doubler", {"x": [3]})["y"].tolist() == [6]
    assert http_waits(second) == []


def test_a_request_in_flight_when_stop_begins_is_answered_and_its_connection_closed_after(
    tmp_path,
):
    started = tmp_path / "started"
    write_python_model(
        tmp_path / "repository",
        "slow",
        inputs={"x": INT64_VECTOR},
        outputs={"y": INT64_VECTOR},
        compute=(
            f"open({str(started)!r}, 'w').close()\ntime.sleep(2)\nreturn {{'y': inputs['x'] * 2}}"
        ),
    )
    server = TritonServer(tmp_path / "repository", stop_timeout_s=STOP_TIMEOUT_S).start()
    answers = []
    try:
        client = Client(server.http_url, "http", retries=0)
        caller = threading.Thread(
            target=lambda: answers.append(client.infer("slow", {"x": [5, 6]}))
        )
        caller.start()
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), server.logs()
    finally:
        server.stop()
    caller.join(60)

    assert [answer["y"].tolist() for answer in answers] == [[10, 12]]
    waits = http_waits(server)
    assert waits, "the server did not wait for the request in flight"
    assert all(open_ == 1 for _, open_ in waits)
    # the connection closed once answered: the server did not count its 15 s down to the end
    assert min(left for left, _ in waits) >= 10, waits


def test_a_raw_tritonclient_left_open_holds_the_stop_for_the_exit_timeout(tmp_path):
    """What the library cannot close for you: another client (or a Client of another process)
    keeps the server waiting until its exit timeout (0.75 of stop_timeout_s); close it first."""
    write_doubler(tmp_path, "doubler")
    server = TritonServer(tmp_path, stop_timeout_s=4.0).start()
    raw = httpclient.InferenceServerClient(server.http_url)
    try:
        x = httpclient.InferInput("x", [1], "INT64")
        x.set_data_from_numpy(np.array([1], dtype=np.int64))
        raw.infer("doubler", [x])
    finally:
        server.stop()
        raw.close()
    assert [left for left, _ in http_waits(server)] == [3, 2, 1]
