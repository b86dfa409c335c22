"""Where a server listens and the key that guards its admin APIs, without starting anything."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from merlin_torch_serving.launcher import access
from merlin_torch_serving.launcher.child import free_ports
from merlin_torch_serving.launcher.config import Ports, ServerConfig
from merlin_torch_serving.launcher.server import TritonServer

PORTS = Ports(http=8000, grpc=8001, metrics=8002)


def command(config: ServerConfig) -> list[str]:
    return config.command(Path("/bin/tritonserver"), Path("/backends"), PORTS, None)


def option(arguments: list[str], name: str) -> list[str]:
    return [
        argument.split("=", 1)[1] for argument in arguments if argument.startswith(f"--{name}=")
    ]


@pytest.fixture
def key_cache(tmp_path, monkeypatch):
    """An empty cache folder of our own, and no key in the environment."""
    monkeypatch.setenv("MTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(access.ADMIN_KEY_ENV_VAR, raising=False)
    return tmp_path / "cache"


def test_every_endpoint_listens_on_loopback_unless_a_host_is_given(tmp_path):
    default = command(ServerConfig(tmp_path))
    for name in ("http-address", "grpc-address", "metrics-address"):
        assert option(default, name) == ["127.0.0.1"]
    everywhere = command(ServerConfig(tmp_path, host="0.0.0.0"))
    for name in ("http-address", "grpc-address", "metrics-address"):
        assert option(everywhere, name) == ["0.0.0.0"]


def test_admin_apis_are_restricted_to_the_key_on_both_protocols_by_default(tmp_path):
    arguments = command(ServerConfig(tmp_path, admin_key="k3y"))
    rule = "model-repository,shared-memory,statistics,trace,logging:mts-admin-key=k3y"
    assert option(arguments, "http-restricted-api") == [rule]
    assert option(arguments, "grpc-restricted-protocol") == [rule]


def test_the_restriction_holds_when_the_server_listens_on_every_interface(tmp_path):
    arguments = command(ServerConfig(tmp_path, host="0.0.0.0", admin_key="k3y"))
    assert option(arguments, "http-restricted-api")[0].endswith(":mts-admin-key=k3y")


def test_an_empty_list_of_restricted_apis_lifts_the_restriction(tmp_path):
    arguments = command(ServerConfig(tmp_path, restricted_apis=()))
    assert option(arguments, "http-restricted-api") == []
    assert option(arguments, "grpc-restricted-protocol") == []


def test_every_server_gets_a_new_key_unless_one_is_given(tmp_path, monkeypatch):
    monkeypatch.delenv(access.ADMIN_KEY_ENV_VAR, raising=False)
    first, second = TritonServer(tmp_path), TritonServer(tmp_path)
    assert first.admin_key != second.admin_key
    assert len(first.admin_key) >= 40
    assert TritonServer(tmp_path, admin_key="chosen").admin_key == "chosen"
    monkeypatch.setenv(access.ADMIN_KEY_ENV_VAR, "from-env")
    assert TritonServer(tmp_path).admin_key == "from-env"


def test_the_key_is_left_out_of_the_configs_repr(tmp_path):
    config = ServerConfig(tmp_path, admin_key="do-not-print-me")
    assert "do-not-print-me" not in repr(config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"host": ""}, r"host must be the address to listen on .* got ''"),
        ({"admin_key": "a:b"}, r"the admin key must be non-empty printable text without spaces"),
        ({"admin_key": "two words"}, r"the admin key must be non-empty printable text"),
        (
            {"restricted_apis": ["model-repository", "everything"]},
            r"restricted_apis names 'everything', which tritonserver cannot restrict; choose among",
        ),
    ],
)
def test_bad_access_options_are_refused_naming_the_option(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(tmp_path, **options)


def test_restricted_apis_may_be_given_as_comma_separated_text():
    assert access.checked_restricted_apis("trace, logging,trace") == ("trace", "logging")
    assert access.checked_restricted_apis("") == ()


def test_clients_on_this_machine_reach_a_server_on_every_interface_through_loopback():
    assert access.connect_host("0.0.0.0") == "127.0.0.1"
    assert access.connect_host("::") == "127.0.0.1"
    assert access.connect_host("10.1.2.3") == "10.1.2.3"
    assert [access.is_loopback(h) for h in ("localhost", "127.0.0.1", "::1", "10.1.2.3", "x")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_key_files_are_readable_by_their_owner_only_and_found_by_port(key_cache):
    paths = access.write_key_files("s3cret", [8000, 8001])
    assert [path.name for path in paths] == ["8000.key", "8001.key"]
    assert stat.S_IMODE(os.stat(key_cache / "admin-keys").st_mode) == 0o700
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in paths)
    assert access.find_admin_key("localhost:8001") == "s3cret"
    assert access.find_admin_key("127.0.0.1:8000") == "s3cret"
    assert access.find_admin_key("localhost:8002") is None
    # another machine's port 8001 is not this one's
    assert access.find_admin_key("10.1.2.3:8001") is None


def test_the_environment_variable_wins_over_key_files(key_cache, monkeypatch):
    access.write_key_files("from-file", [8001])
    monkeypatch.setenv(access.ADMIN_KEY_ENV_VAR, "from-env")
    assert access.find_admin_key("localhost:8001") == "from-env"


def test_a_server_removes_only_the_key_files_that_still_hold_its_key(key_cache):
    mine = access.write_key_files("mine", [8000, 8001])
    access.write_key_files("a later server's", [8001])
    access.remove_key_files(mine, "mine")
    assert not mine[0].exists()
    assert mine[1].read_text().strip() == "a later server's"


# a process that writes the key files of a server on two ports and lives until it is killed
OWNER = """
import sys, time
from merlin_torch_serving.launcher import access
access.write_key_files(sys.argv[1], [int(port) for port in sys.argv[2:]])
print("written", flush=True)
time.sleep(600)
"""


def key_owner(key: str, *ports: int) -> subprocess.Popen:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, key, *map(str, ports)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout.readline().strip() == "written"
    return owner


def test_the_next_server_removes_the_key_files_of_a_killed_owner_and_keeps_a_live_ones(key_cache):
    gone, gone_too, live, new = free_ports(4)  # nothing listens on them
    killed, alive = key_owner("killed", gone, gone_too), key_owner("alive", live)
    try:
        killed.kill()  # no stop(): its files stay behind
        killed.wait()
        folder = key_cache / "admin-keys"
        assert names(folder) == sorted(f"{port}.key" for port in (gone, gone_too, live))
        access.write_key_files("next", [new])
        assert names(folder) == sorted(f"{port}.key" for port in (live, new))
        assert access.find_admin_key(f"localhost:{live}") == "alive"
    finally:
        for owner in (killed, alive):
            owner.kill()
            owner.wait()
            owner.stdout.close()


def test_a_key_file_nobody_locks_stays_while_a_process_listens_on_its_port(key_cache):
    # as a running server of another version of the library leaves it: a plain file, its port bound
    folder = key_cache / "admin-keys"
    folder.mkdir(parents=True, mode=0o700)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    (folder / f"{port}.key").write_text("another server's\n")
    # and a file being written by a live process (this one)
    (folder / f".{port}.key.{os.getpid()}").write_text("another server's\n")
    try:
        access.write_key_files("next", free_ports(1))
        assert access.find_admin_key(f"localhost:{port}") == "another server's"
        assert (folder / f".{port}.key.{os.getpid()}").exists()
    finally:
        listener.close()
    access.write_key_files("after it", free_ports(1))  # its server gone: the file goes
    assert access.find_admin_key(f"localhost:{port}") is None


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("*.key"))
