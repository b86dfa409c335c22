import socket
from pathlib import Path

import pytest

from merlin_torch_serving import PortInUseError, ServerError
from merlin_torch_serving.launcher.preflight import check, is_taken, nested_repository


def model(folder):
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "m"\n')


def test_the_folder_above_a_repository_is_told_apart_from_a_repository(tmp_path):
    model(tmp_path / "output" / "repository" / "recs")
    (tmp_path / "output" / "workflow").mkdir()
    assert nested_repository(tmp_path / "output") == tmp_path / "output" / "repository"
    assert nested_repository(tmp_path / "output" / "repository") is None
    with pytest.raises(
        ServerError,
        match=(
            r"^serve the repository itself, '.*/output/repository': '.*/output' holds a model"
            r" repository"
        ),
    ):
        check(tmp_path / "output", {})


def test_a_listening_port_is_taken_and_a_closed_one_is_not():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert is_taken(port)
        with pytest.raises(PortInUseError, match=rf"the gRPC port {port} is already in use"):
            check(Path("/nonexistent"), {"http": None, "grpc": port})
    assert not is_taken(port)
