"""Who can reach a server the library starts, and who can change what it serves: loopback by
default, and the admin APIs (load, unload, the repository index, ...) refused without the key on
HTTP and gRPC alike, while inference and health stay open."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from merlin_torch_serving import Client, ServerError
from merlin_torch_serving.launcher import access
from merlin_torch_serving.launcher.access import ADMIN_KEY_HEADER
from tests.integration.test_cli import read_until
from tests.triton_models import write_doubler

pytestmark = pytest.mark.integration

MODULES = {"http": httpclient, "grpc": grpcclient}


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every socket tritonserver listens on."""
    return {
        (connection.laddr.ip, connection.laddr.port)
        for connection in psutil.Process(pid).net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN
    }


def raw_client(protocol: str, url: str):
    return MODULES[protocol].InferenceServerClient(url)


def url_of(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def doubled(client, protocol: str, model: str) -> list[int]:
    module = MODULES[protocol]
    tensor = module.InferInput("x", [3], "INT64")
    tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int64))
    return client.infer(model, [tensor]).as_numpy("y").tolist()


@pytest.fixture(scope="module")
def served_doubler(triton_server):
    write_doubler(triton_server.repository, "guarded")
    triton_server.load("guarded")  # the library's own admin call carries the key
    return triton_server


def test_a_server_listens_on_loopback_only_by_default(served_doubler):
    addresses = listening_addresses(served_doubler.pid)
    ports = {
        int(url.rsplit(":", 1)[1])
        for url in (served_doubler.http_url, served_doubler.grpc_url, served_doubler.metrics_url)
    }
    assert {port for _, port in addresses} == ports
    assert {ip for ip, _ in addresses} <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_without_the_key_the_repository_index_load_and_unload_are_refused(served_doubler, protocol):
    client = raw_client(protocol, url_of(served_doubler, protocol))
    try:
        for call in (
            lambda: client.get_model_repository_index(),
            lambda: client.load_model("guarded"),
            lambda: client.unload_model("guarded"),
            lambda: client.get_inference_statistics(),
        ):
            with pytest.raises(
                InferenceServerException,
                match=f"expecting header .(triton-grpc-protocol-)?{ADMIN_KEY_HEADER}.",
            ):
                call()
        wrong = access.headers("not-the-key", protocol)
        with pytest.raises(InferenceServerException, match="is restricted"):
            client.unload_model("guarded", headers=wrong)
        # nothing changed: the model still answers
        assert client.is_model_ready("guarded")
        assert doubled(client, protocol, "guarded") == [2, 4, 6]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inference_metadata_and_health_need_no_key(served_doubler, protocol):
    client = raw_client(protocol, url_of(served_doubler, protocol))
    try:
        # (not is_server_ready: the shared server also holds other tests' models, some broken
        # on purpose)
        assert client.is_server_live()
        assert client.is_model_ready("guarded")
        assert client.get_model_metadata("guarded")
        assert client.get_model_config("guarded")
        assert doubled(client, protocol, "guarded") == [2, 4, 6]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_with_the_key_the_admin_apis_answer(served_doubler, protocol):
    client = raw_client(protocol, url_of(served_doubler, protocol))
    key = access.headers(served_doubler.admin_key, protocol)
    try:
        index = client.get_model_repository_index(
            headers=key, **({"as_json": True} if protocol == "grpc" else {})
        )
        names = [model["name"] for model in (index["models"] if protocol == "grpc" else index)]
        assert "guarded" in names
        client.unload_model("guarded", headers=key)
        served_doubler.load("guarded")
        client.load_model("guarded", headers=key)
        assert doubled(client, protocol, "guarded") == [2, 4, 6]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_librarys_client_finds_the_key_of_a_server_of_this_user(served_doubler, protocol):
    with Client(url_of(served_doubler, protocol), protocol) as client:
        assert "guarded" in [status.name for status in client.models()]
        assert {h.name: h.stubs_alive for h in client.health()}["guarded"] is True
    wrong = Client(url_of(served_doubler, protocol), protocol, admin_key="wrong")
    with (
        wrong,
        pytest.raises(ServerError, match=r"^pass the server's admin key \(Client\(url, admin_key"),
    ):
        wrong.models()


def shared_memory_of(pid: int) -> set[Path]:
    """The files in /dev/shm that process ``pid`` and its children have mapped."""
    found = set()
    for process in [psutil.Process(pid), *psutil.Process(pid).children()]:
        with contextlib.suppress(psutil.Error):
            found |= {Path(m.path) for m in process.memory_maps() if m.path.startswith("/dev/shm/")}
    return found


def test_the_shared_memory_that_carries_requests_is_the_servers_user_alone(served_doubler):
    client = raw_client("grpc", served_doubler.grpc_url)
    try:
        assert doubled(client, "grpc", "guarded") == [2, 4, 6]
    finally:
        client.close()
    regions = shared_memory_of(served_doubler.pid)
    assert regions, "the python backend maps its regions from /dev/shm"
    exposed = {region: oct(stat.S_IMODE(region.stat().st_mode)) for region in regions}
    assert all(mode == "0o600" for mode in exposed.values()), exposed
    if os.geteuid() == 0:  # root reads anything: read as another user to see the mode hold
        region = sorted(regions)[0]
        other = subprocess.run(
            ["head", "-c", "16", str(region)], user=65534, capture_output=True, check=False
        )
        assert (other.returncode, other.stdout) == (1, b""), other
        assert b"Permission denied" in other.stderr


def test_serve_on_every_interface_says_so_and_still_restricts_the_admin_apis(tmp_path):
    repository = tmp_path / "repository"
    write_doubler(repository, "open_to_all")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "merlin_torch_serving",
            "serve",
            str(repository),
            "--host",
            "0.0.0.0",
            *("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = "".join(read_until(process, "press Ctrl-C to stop"))
        assert "listening on 0.0.0.0 (every interface: reachable from other machines)" in output
        pid = int(re.search(r"ready \(pid (\d+)\)", output).group(1))
        assert {ip for ip, _ in listening_addresses(pid)} <= {"0.0.0.0", "::"}
        key_file = Path(re.search(r"its key is in (\S+\.key)", output).group(1))
        http_url = re.search(r"^\s+HTTP\s+(\S+)$", output, flags=re.M).group(1)
        client = httpclient.InferenceServerClient(http_url)
        try:
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                client.unload_model("open_to_all")
            assert doubled(client, "http", "open_to_all") == [2, 4, 6]
            key = {ADMIN_KEY_HEADER: key_file.read_text().strip()}
            assert [m["name"] for m in client.get_model_repository_index(headers=key)] == [
                "open_to_all"
            ]
        finally:
            client.close()
    finally:
        process.terminate()
        process.wait(60)
        process.stdout.close()
    assert not key_file.exists()  # removed when the server stopped
