"""A server gives back the memory a very big request took: 10 s after the answers to a million
clicks, tritonserver and its stubs hold within 15 % of what they held before, the Client having
sent them in requests of the row limit and in one piece with the limit off."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pandas as pd
import psutil
import pytest

from merlin_torch_serving import Client, Ensemble, ModelOptions, TritonServer
from tests import toy_session

pytestmark = pytest.mark.integration

SESSIONS, CLICKS_PER_SESSION = 200_000, 5
SETTLE_S = 10.0
MOST_GROWTH = 0.15


def server_resident_bytes(pid: int) -> int:
    """What tritonserver and its stubs hold in memory together."""
    total = 0
    server = psutil.Process(pid)
    for process in [server, *server.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a stub that ended meanwhile holds nothing
            total += process.memory_info().rss
    return total


@pytest.fixture(scope="module")
def million_clicks():
    rng = np.random.default_rng(7)
    rows = SESSIONS * CLICKS_PER_SESSION
    return pd.DataFrame(
        {
            "session_id": rng.permutation(
                np.repeat(np.arange(SESSIONS, dtype=np.int64), CLICKS_PER_SESSION)
            ),
            "item_id": rng.integers(500, 540, rows),
            "category": rng.integers(0, 7, rows),
            "timestamp": rng.integers(0, 10**6, rows),
        }
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory, toy_workflow, toy_model):
    """The toy session ensemble twice: with the row limit (the Client splits a big input into
    requests of whole sessions) and without it (one request)."""
    repository = tmp_path_factory.mktemp("memory") / "repository"
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    ensemble.export(repository, "chunked")
    ensemble.export(repository, "whole", options=ModelOptions(max_request_rows=None))
    return repository


def test_the_server_gives_back_what_a_million_clicks_took(repository, million_clicks):
    """As a server runs by default (failover on): the million clicks sent both ways, one after
    the other, to one server."""
    with TritonServer(
        repository, model_control="explicit", load_models=["chunked", "whole"], failover=True
    ) as server:
        server.wait_for_failover()
        with Client(server.grpc_url, timeout_s=600) as client:
            for model in ("chunked", "whole"):
                client.infer(model, million_clicks.iloc[:1000])
            time.sleep(2)
            before = server_resident_bytes(server.pid)
            answers = {model: client.infer(model, million_clicks) for model in ("chunked", "whole")}
        time.sleep(SETTLE_S)
        after = server_resident_bytes(server.pid)
    assert {model: len(answer) for model, answer in answers.items()} == {
        "chunked": SESSIONS,
        "whole": SESSIONS,
    }
    assert after <= before * (1 + MOST_GROWTH), (
        f"{after / 2**20:.0f} MB {SETTLE_S:g} s after the answers against"
        f" {before / 2**20:.0f} MB before"
    )


def test_without_failover_the_memory_comes_back_once_the_model_is_started_afresh(
    repository, million_clicks
):
    """One stub instead of three: what the request left is a bigger share of the server, and
    only starting the model afresh (``launcher.recycling``) gives it back. That takes a stub's
    start-up (seconds, more on a busy machine), so it is waited for rather than timed."""
    with TritonServer(
        repository, model_control="explicit", load_models=["whole"], failover=False
    ) as server:
        before, _ = big_request(server, "whole", million_clicks)
        (stub,) = psutil.Process(server.pid).children()
        deadline = time.monotonic() + 120
        while psutil.pid_exists(stub.pid) and stub.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the model was not started afresh within 120 s"
            time.sleep(0.5)
        time.sleep(1)
        after = server_resident_bytes(server.pid)
    assert after <= before * (1 + MOST_GROWTH), (after / 2**20, before / 2**20)


def big_request(server, model: str, clicks: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    """What the server held before the million clicks (once loaded and warm), and the answer."""
    with Client(server.grpc_url, timeout_s=600) as client:
        client.infer(model, clicks.iloc[:1000])
        time.sleep(2)
        before = server_resident_bytes(server.pid)
        return before, client.infer(model, clicks)
