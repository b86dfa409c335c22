"""A python stub that dies fails only the request inside it, at every kill: raw tritonclient callers
under load see no other failure, a request the dead stub held fails within seconds, and every
answer stays equal to in-process. Reloads are never taken for deaths: new weights reloaded under
load always reach the answers, and no ensemble stays on a standby. A server that saw stubs die
stops in seconds."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from merlin_torch_serving import Client, Ensemble, TritonServer
from merlin_torch_serving.launcher.standby import standby_name
from merlin_torch_serving.routing import set_weights
from tests import routed_graphs, toy_session
from tests.served import Traffic, assert_frames_equal

pytestmark = pytest.mark.integration

CLIENTS = 8
KILLS = 3
REQUEST_COLUMNS = ("session_id", "item_id", "category", "timestamp")
ROUTED = "routed"
#: the weights the route is reloaded with, one after the other
WEIGHTS = (
    {"current": 1.0, "candidate": 0.0},
    {"current": 0.0, "candidate": 1.0},
    {"current": 0.3, "candidate": 0.7},
)
#: how long a request the dead stub held may take to fail, and stop() after stub deaths: the
#: python backend fails such a request after its one-second health check (measured 1.00 to 1.03 s),
#: and a stop ends once the requests in flight are answered and the other models unloaded
#: (measured 2.1 to 9.9 s with ten models at load averages of 3 to 6.5 on 2 cores, and once 16.6 s
#: at load 4 beside the rest of the suite, where ten models' stubs took that long to end). Before,
#: a stop waited for tritonserver's exit timeout, which this module's server sets to 30 s
#: (STOP_TIMEOUT_S) so that a stop that waits for it cannot pass for one that does not; the rest is
#: headroom for a loaded machine
HELD_REQUEST_BOUND_S = 5.0
STOP_BOUND_S = 24.0
#: the server's stop_timeout_s: tritonserver's exit timeout is three quarters of it, 30 s
STOP_TIMEOUT_S = 40.0


@pytest.fixture(scope="module")
def served(tmp_path_factory, toy_workflow, toy_model, filtered_toy_workflow):
    """A failover server on the toy session ensemble and a routed one (its branches inline: one
    python step), once every python model has its standby."""
    repository = tmp_path_factory.mktemp("failover") / "repository"
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    (step,) = [model for model in ensemble.export(repository, "reco").models if model != "reco"]
    workflow = filtered_toy_workflow
    graph = routed_graphs.routed(
        workflow,
        toy_session.scripted_model(workflow),
        weights=WEIGHTS[-1],
        inline=("current", "candidate", "popular"),
    )
    routed = Ensemble(graph, workflow.input_schema)
    exported = routed.export(repository, ROUTED).models
    (route_step,) = [model for model in exported if model != ROUTED]
    # a stop that waited for tritonserver's exit timeout would take 30 s here (STOP_TIMEOUT_S)
    server = TritonServer(
        repository, failover=True, start_timeout_s=180, stop_timeout_s=STOP_TIMEOUT_S
    )
    server.start()
    try:
        assert server.wait_for_failover(timeout_s=180) == {step, route_step}
        yield server, ensemble, step, (routed, graph.op, route_step)
    finally:
        server.stop()


def stubs_of(server, model: str) -> list[psutil.Process]:
    """The live stubs of ``model`` (a killed one is a zombie until tritonserver collects it)."""
    found = []
    for process in psutil.Process(server.pid).children():
        with contextlib.suppress(psutil.Error):
            running = process.status() != psutil.STATUS_ZOMBIE
            if running and f"/{model}/" in " ".join(process.cmdline()):
                found.append(process)
    return found


def grpc_inputs(request) -> list:
    inputs = []
    for column in REQUEST_COLUMNS:
        tensor = grpcclient.InferInput(column, [len(request)], "INT64")
        tensor.set_data_from_numpy(request[column].to_numpy())
        inputs.append(tensor)
    return inputs


def ensemble_steps(server, ensemble: str) -> list[str]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        config = client.get_model_config(ensemble)
    finally:
        client.close()
    return [step["model_name"] for step in config["ensemble_scheduling"]["step"]]


def wait_until_repaired(server, model: str, victim: int, timeout_s: float = 120.0) -> None:
    """Until ``model`` runs again without the stub ``victim``, all its stubs alive, healthy, its
    ensembles running it (not its standby). (Not by its restart count: under load one reload may
    repair two deaths.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        health = {m.name: m for m in server.health()}[model]
        stubs = [stub.pid for stub in stubs_of(server, model)]
        if health.healthy and not health.standby and victim not in stubs and len(stubs) == 2:
            return
        assert time.monotonic() < deadline, f"not repaired within {timeout_s:g} s: {health}"
        time.sleep(0.25)


def test_every_python_model_runs_two_instances_and_an_idle_standby(served):
    server, _, step, _ = served
    assert len(stubs_of(server, step)) == 2
    assert len(stubs_of(server, standby_name(step))) == 1
    health = {model.name: model for model in server.health()}
    assert health[standby_name(step)].state == "READY"
    assert health[standby_name(step)].stubs_alive is True
    assert (health[step].standby, health[step].healthy) == ("", True)


def test_each_of_three_stub_kills_fails_at_most_the_request_inside_it_under_load(served):
    server, ensemble, step, _ = served
    requests = [toy_session.interactions(1, seed=seed) for seed in range(CLIENTS)]
    expected = [ensemble.transform(request) for request in requests]
    outcomes: list[tuple[float, float, str | None]] = []
    mismatches: list[int] = []
    stop = threading.Event()

    def client(index: int) -> None:
        connection = grpcclient.InferenceServerClient(server.grpc_url)
        inputs = grpc_inputs(requests[index])
        try:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    answer = connection.infer("reco", inputs)
                except Exception as error:
                    outcomes.append((sent, time.monotonic(), str(error)))
                    continue
                outcomes.append((sent, time.monotonic(), None))
                want = expected[index]
                if not (
                    np.array_equal(answer.as_numpy("item_ids"), np.stack(want["item_ids"]))
                    and np.array_equal(
                        answer.as_numpy("item_scores"), np.stack(want["item_scores"])
                    )
                ):
                    mismatches.append(index)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
    killed_at, victims = [], []
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        for _ in range(KILLS):
            victim = stubs_of(server, step)[0]
            victims.append(victim.pid)
            killed_at.append(time.monotonic())
            os.kill(victim.pid, signal.SIGKILL)
            # answered by the standby, then by the model again once it is reloaded
            wait_until_repaired(server, step, victim.pid)
            time.sleep(1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    windows = [*killed_at, float("inf")]
    for kill, (start, end) in enumerate(itertools.pairwise(windows), start=1):
        # (sent after the kill, how long it took, the error) of the requests that failed: in
        # flight at the kill (taken by the dead stub's instance before it died), or sent after it
        held = [
            (sent - start, ended - sent, error)
            for sent, ended, error in outcomes
            if error and sent < start < ended
        ]
        after = [
            (sent - start, ended - sent, error)
            for sent, ended, error in outcomes
            if error and start <= sent < end and not sent < end < ended  # (the next kill's)
        ]
        print(f"kill {kill}: in flight {[h[:2] for h in held]}, after {[a[:2] for a in after]}")
        # Killed between two requests, the next one its instance took in the ~0.1 s the kernel
        # takes to end a process of 400 MB, before the death can be seen; nothing sent later.
        assert len(after) <= 1, (kill, after)
        assert all(sent < 0.2 for sent, _, _ in after), (kill, after)
        # each failed with the dead stub's error, within the bound
        instances = {re.search(r"Stub process '([^']+)'", error)[1] for _, _, error in held + after}
        assert len(instances) <= 1, (kill, held, after)
        assert all(took < HELD_REQUEST_BOUND_S for _, took, _ in held + after), (kill, held, after)
    assert not [error for _, ended, error in outcomes if error and ended < killed_at[0]]
    answered_after = [sent for sent, _, error in outcomes if not error and sent > killed_at[-1]]
    assert len(answered_after) > 100
    assert mismatches == []
    assert {process.pid for process in stubs_of(server, step)}.isdisjoint(victims)


def test_after_the_repairs_the_ensemble_runs_the_model_again_with_two_instances(served):
    server, _, step, _ = served
    assert ensemble_steps(server, "reco") == [step]
    assert len(stubs_of(server, step)) == 2


def test_new_weights_reloaded_under_load_always_reach_the_answers_and_no_standby_stays(served):
    server, _, _, (routed, route, step) = served
    requests = [
        toy_session.interactions(n, seed=60 + n, first_session=100_000 * n) for n in (1, 7, 32)
    ]
    urls = {"grpc": server.grpc_url, "http": server.http_url}
    before = [routed.transform(rows) for rows in requests]
    with Client(server.grpc_url) as client:
        for cycle, weights in enumerate(WEIGHTS):
            route.set_weights(weights)
            after = [routed.transform(rows) for rows in requests]
            with Traffic(urls, ROUTED, requests, list(zip(before, after, strict=True))) as load:
                load.wait_for(20)
                set_weights(server.repository, ROUTED, weights)
                server.reload(step)
                for rows, expected in zip(requests, after, strict=True):
                    assert_frames_equal(client.infer(ROUTED, rows), expected)
                load.wait_for(20)
            assert load.errors == [], (cycle, load.errors[:3])
            assert load.mismatches == [], (cycle, load.mismatches[:3])
            health = {m.name: m for m in server.health()}[step]
            assert (health.standby, health.healthy) == ("", True), (cycle, health)
            assert ensemble_steps(server, ROUTED) == [step]
            before = after


def test_a_server_whose_stubs_died_stops_within_seconds(served):
    server, _, _, _ = served
    started = time.monotonic()
    server.stop()
    took = time.monotonic() - started
    log = server.logs()
    assert took < STOP_BOUND_S, f"stop() took {took:.1f} s: {log[log.rfind('Signal (2)') :]}"
    print(f"stop() after {KILLS} stub kills took {took:.2f} s")
    assert not psutil.pid_exists(server.pid)


def test_a_server_without_failover_runs_the_exported_instances_only(
    tmp_path, toy_workflow, toy_model
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    result = ensemble.export(tmp_path / "repository", "reco")
    (step,) = [model for model in result.models if model != "reco"]
    with TritonServer(tmp_path / "repository", failover=False) as server:
        time.sleep(1.5)  # a supervisor look
        assert len(stubs_of(server, step)) == 1
        assert [m.name for m in server.models()] == ["reco", step]
