"""A python stub that dies fails only the request inside it: raw tritonclient callers under load
see no other failure, and every answer stays equal to in-process."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from merlin_torch_serving import Ensemble, TritonServer
from merlin_torch_serving.launcher.failover import standby_name
from tests import toy_session

pytestmark = pytest.mark.integration

CLIENTS = 8
REQUEST_COLUMNS = ("session_id", "item_id", "category", "timestamp")


@pytest.fixture(scope="module")
def served(tmp_path_factory, toy_workflow, toy_model):
    """A failover server on the toy session ensemble, once every python model has its standby."""
    repository = tmp_path_factory.mktemp("failover") / "repository"
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    result = ensemble.export(repository, "reco")
    (step,) = [model for model in result.models if model != "reco"]
    server = TritonServer(repository, failover=True, start_timeout_s=180, stop_timeout_s=10)
    server.start()
    try:
        assert server.wait_for_failover(timeout_s=180) == {step}
        yield server, ensemble, step
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


def test_every_python_model_runs_two_instances_and_an_idle_standby(served):
    server, _, step = served
    assert len(stubs_of(server, step)) == 2
    assert len(stubs_of(server, standby_name(step))) == 1
    health = {model.name: model for model in server.health()}
    assert health[standby_name(step)].state == "READY"
    assert health[standby_name(step)].stubs_alive is True


def test_a_killed_stub_fails_only_the_request_inside_it_under_load(served):
    server, ensemble, step = served
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
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        victim = stubs_of(server, step)[0]
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        # answered by the standby, then by the model again once it is reloaded
        deadline = time.monotonic() + 120
        while {model.name: model.restarts for model in server.health()}[step] < 1:
            assert time.monotonic() < deadline, "the model was not reloaded within 120 s"
            time.sleep(0.5)
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    failed = [(sent - killed_at, error) for sent, _, error in outcomes if error]
    answered_after = [sent for sent, _, error in outcomes if not error and sent > killed_at]
    # One request: the one the stub was running, or, killed between two requests, the next one
    # its instance took in the ~0.1 s the kernel takes to end a process of 400 MB, before the
    # death can be seen. Nothing sent later fails.
    assert len(failed) <= 1, failed
    assert all(sent < 0.2 for sent, _ in failed), failed
    assert all("is not healthy" in error for _, error in failed), failed
    assert len(answered_after) > 100
    assert mismatches == []
    health = {model.name: model for model in server.health()}
    assert health[step].stubs_alive is True
    assert victim.pid not in [process.pid for process in stubs_of(server, step)]


def test_after_the_repair_the_ensemble_runs_the_model_again(served):
    server, _, step = served
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        config = client.get_model_config("reco")
    finally:
        client.close()
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [step]
    # reloaded from its config.pbtxt (one instance), then raised to two again
    assert len(stubs_of(server, step)) == 2


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
