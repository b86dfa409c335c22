"""The serving runtime without Python (``backends.runtime``): tritonserver, its libraries and the
pytorch backend copied into one folder serve an all-libtorch export with an empty environment
(no PATH to a Python, no library path), started by the command of ``deploy/Dockerfile.libtorch``'s
entrypoint, and the running server maps no file of this Python or its packages: nothing of the
interpreter, the Merlin stack or this library is in the serving path. (No container is built here:
there is no container daemon on this machine.)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.http

from merlin_torch_serving import (
    Client,
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.backends.runtime import lay_out_libtorch_runtime
from merlin_torch_serving.deployment import deploy_files
from tests import toy_session
from tests.served import assert_frames_equal

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 120.0


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for held in sockets:
            held.bind(("127.0.0.1", 0))
        return [held.getsockname()[1] for held in sockets]
    finally:
        for held in sockets:
            held.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, pytorch_backend, toy_workflow, toy_model):
    scripted, input_schema, output_schema = toy_model
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(
        toy_workflow, backend="pytorch"
    )
    graph = features["session_id"] + (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="pytorch")
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    ensemble = Ensemble(graph, toy_workflow.input_schema)
    work = tmp_path_factory.mktemp("libtorch_runtime")
    ensemble.export(work / "repository", "reco")
    lay_out_libtorch_runtime(work / "runtime")
    # the image's entrypoint, with the runtime where this test laid it out and ports of its own
    entrypoint = json.loads(
        next(
            line[len("ENTRYPOINT ") :]
            for line in deploy_files.render()["Dockerfile.libtorch"].splitlines()
            if line.startswith("ENTRYPOINT ")
        )
    )
    entrypoint = [
        part.replace(deploy_files.RUNTIME_DIR, str(work / "runtime")) for part in entrypoint
    ]
    http, grpc, metrics = _free_ports(3)
    log = (work / "server.log").open("w")
    server = subprocess.Popen(
        [
            *entrypoint,
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
        ],
        # no Python of this project, no library path
        env={"PATH": "/usr/bin:/bin", "MODEL_REPOSITORY": str(work / "repository")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_ready(server, f"127.0.0.1:{http}", work / "server.log")
        yield ensemble, server, f"127.0.0.1:{grpc}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        log.close()


def _wait_until_ready(server: subprocess.Popen, url: str, log: Path) -> None:
    client = tritonclient.http.InferenceServerClient(url)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"the runtime's tritonserver exited:\n{log.read_text()[-3000:]}")
            try:
                if client.is_server_ready():
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
    finally:
        client.close()
    pytest.fail(f"the runtime's tritonserver was not ready in {START_TIMEOUT_S:g} s")


def test_the_runtime_serves_the_export_as_in_process(served):
    ensemble, _, url = served
    rows = toy_session.interactions(n_sessions=7, seed=8, first_session=300)
    assert_frames_equal(Client(url).infer("reco", rows), ensemble.transform(rows))


def test_the_running_server_maps_no_file_of_this_python(served):
    _, server, _ = served
    mapped = {
        line.split(maxsplit=5)[5]
        for line in Path(f"/proc/{server.pid}/maps").read_text().splitlines()
        if len(line.split(maxsplit=5)) == 6
    }
    prefixes = {sys.prefix, sys.base_prefix}
    from_python = sorted(path for path in mapped if any(path.startswith(p) for p in prefixes))
    assert from_python == []
    assert not any("libpython" in path for path in mapped)
    assert any(path.endswith("libtorch_cpu.so") for path in mapped)  # libtorch serves it
