"""Who may change what a tritonserver serves: the admin key, the APIs it guards, and the
owner-only files through which other processes of the same user find it.

Triton's model-repository API loads and unloads models, and its load call takes a model
configuration and files in the request: open to whoever reaches the port, it runs their code on
the machine. So every server the library starts guards its admin APIs with a key that requests
carry in a header (tritonserver's ``--http-restricted-api`` and ``--grpc-restricted-protocol``),
whatever address it listens on. Inference, metadata, health and the model configuration stay
open: the schema-driven ``Client`` reads each ensemble's schemas from its configuration, and an
inference client that needed the admin key would spread it to every caller.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

from merlin_torch_serving.backends.bundle import cache_root

#: the header that carries the admin key (over gRPC, tritonserver wants it in the metadata key
#: ``GRPC_HEADER_PREFIX + ADMIN_KEY_HEADER``)
ADMIN_KEY_HEADER = "mts-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
#: where ``TritonServer``, ``serve`` and ``Client`` look for a key first
ADMIN_KEY_ENV_VAR = "MTS_ADMIN_KEY"
#: the APIs tritonserver can restrict (its ``--help``)
RESTRICTABLE_APIS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: restricted by default: what loads, unloads or reads models, maps memory, writes files or
#: reads the load; what PyTriton 0.7 (whose tritonserver this is) restricts by default too
DEFAULT_RESTRICTED_APIS = ("model-repository", "shared-memory", "statistics", "trace", "logging")
#: loopback: a server bound here is reachable from this machine only
LOOPBACK_HOST = "127.0.0.1"
_KEYS_FOLDER = "admin-keys"


def new_admin_key() -> str:
    """A fresh random key (256 bits, URL-safe text, fit for a header)."""
    return secrets.token_urlsafe(32)


def checked_restricted_apis(apis: Iterable[str]) -> tuple[str, ...]:
    """``apis`` as a tuple, refused when one is not an API tritonserver can restrict."""
    if isinstance(apis, str):
        apis = [api.strip() for api in apis.split(",") if api.strip()]
    chosen = tuple(dict.fromkeys(apis))
    unknown = [api for api in chosen if api not in RESTRICTABLE_APIS]
    if unknown:
        raise ValueError(
            f"restricted_apis names {', '.join(map(repr, unknown))}, which tritonserver cannot"
            f" restrict; choose among {', '.join(RESTRICTABLE_APIS)}"
        )
    return chosen


def checked_admin_key(key: str) -> str:
    """``key`` if a header and tritonserver's option can carry it as it is."""
    if not key or any(char.isspace() or char in ",:=" or not char.isprintable() for char in key):
        raise ValueError(
            "the admin key must be non-empty printable text without spaces, ',', ':' or '='"
            " (tritonserver's option separates its parts with them); new_admin_key() makes one"
        )
    return key


def restriction_args(key: str, apis: Sequence[str]) -> list[str]:
    """tritonserver's options that make ``apis`` answer only requests carrying ``key``."""
    if not apis:
        return []
    rule = f"{','.join(apis)}:{ADMIN_KEY_HEADER}={key}"
    return [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]


def headers(key: str | None, protocol: str = "http") -> dict[str, str] | None:
    """The headers (``protocol="grpc"``: the metadata) an admin call sends."""
    if not key:
        return None
    return {(GRPC_HEADER_PREFIX if protocol == "grpc" else "") + ADMIN_KEY_HEADER: key}


def connect_host(host: str) -> str:
    """The address clients on this machine reach a server bound to ``host`` at."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return LOOPBACK_HOST
    return host


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---- key files --------------------------------------------------------------------------------


def keys_folder() -> Path:
    """``<cache>/admin-keys``: one file per port of a running server, readable by its owner only."""
    return cache_root() / _KEYS_FOLDER


def write_key_files(key: str, ports: Iterable[int]) -> list[Path]:
    """Write ``key`` into ``<port>.key`` for each port, the folder 0700 and each file 0600 from
    the moment it exists (never readable by others, not even briefly)."""
    folder = keys_folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    written = []
    for port in ports:
        path = folder / f"{int(port)}.key"
        temporary = folder / f".{int(port)}.key.{os.getpid()}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(key + "\n")
        os.replace(temporary, path)
        written.append(path)
    return written


def remove_key_files(paths: Iterable[Path], key: str) -> None:
    """Remove the files written for a server, unless another server has since written its own."""
    for path in paths:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == key:
                path.unlink()


def find_admin_key(url: str) -> str | None:
    """The admin key for the server at ``url`` (``host:port``): $MTS_ADMIN_KEY when set, else
    the key file a server of this user on this machine wrote for that port, else None."""
    from_environment = os.environ.get(ADMIN_KEY_ENV_VAR)
    if from_environment:
        return from_environment
    host, _, port = url.rpartition(":")
    if not port.isdigit() or not is_loopback(host or "localhost"):
        return None
    path = keys_folder() / f"{int(port)}.key"
    try:
        if path.stat().st_uid != os.getuid():
            return None
        return path.read_text().strip() or None
    except OSError:
        return None
