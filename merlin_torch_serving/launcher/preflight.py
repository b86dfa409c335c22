"""What can be found wrong before tritonserver starts, so it is said at once and plainly instead
of after every model has loaded (a taken port) or in Triton's words ("Could not determine
backend" for the folder above a repository)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

from merlin_torch_serving.exceptions import PortInUseError, ServerError

#: how diagnostics.port_in_use names each port's protocol
PROTOCOL_NAMES = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}


def check(repository: Path | str, ports: Mapping[str, int | None]) -> None:
    """Raise if ``repository`` (a local folder; an object-store URL is tritonserver's to read) is
    the folder above a model repository, or if a port asked for (``{"http": 8000, ...}``, None:
    the OS chooses) is taken."""
    nested = nested_repository(repository) if isinstance(repository, Path) else None
    if nested is not None:
        raise ServerError(
            f"serve the repository itself, {str(nested)!r}: {str(repository)!r} holds a model"
            " repository, not model folders"
        )
    for key, port in ports.items():
        if port is not None and is_taken(port):
            raise PortInUseError(port, PROTOCOL_NAMES.get(key, key))


def nested_repository(folder: Path) -> Path | None:
    """The model repository inside ``folder`` when ``folder`` holds no model but a folder of
    models (each model folder has a ``config.pbtxt``), else None."""
    try:
        children = sorted(child for child in folder.iterdir() if child.is_dir())
    except OSError:
        return None
    if any((child / "config.pbtxt").is_file() for child in children):
        return None
    for child in children:
        if any(
            (grandchild / "config.pbtxt").is_file()
            for grandchild in child.iterdir()
            if grandchild.is_dir()
        ):
            return child
    return None


def is_taken(port: int) -> bool:
    """Whether something listens on ``port`` (tritonserver binds every interface; a port left in
    TIME_WAIT by a server that just stopped is free to it, as to this probe)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return True
    return False
