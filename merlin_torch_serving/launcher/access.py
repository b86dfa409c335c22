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
import fcntl
import ipaddress
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

from merlin_torch_serving.backends.bundle import cache_root
from merlin_torch_serving.launcher.process import listening_ports, pid_exists

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
#: key file -> the descriptor through which this process holds it locked while its server runs
_held: dict[Path, int] = {}


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
    the moment it exists (never readable by others, not even briefly). This process holds a
    shared lock on each file until ``remove_key_files``, so that files whose writer died (SIGKILL,
    a crash: it never removed them) are told apart and removed first (``remove_stale_key_files``).
    """
    folder = keys_folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    remove_stale_key_files(folder)
    written = []
    for port in ports:
        path = folder / f"{int(port)}.key"
        temporary = folder / f".{int(port)}.key.{os.getpid()}"
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        # locked before it takes its name: no sweep ever sees it unlocked
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        os.write(descriptor, (key + "\n").encode())
        os.replace(temporary, path)
        _close_quietly(_held.pop(path, None))
        _held[path] = descriptor
        written.append(path)
    return written


def remove_stale_key_files(folder: Path) -> list[Path]:
    """Remove the files in the keys folder of servers that are gone (their owner was SIGKILLed or
    crashed, and never removed them); the files removed.

    A ``<port>.key`` file is stale only when nothing says its server runs: no process holds it
    locked (this library's servers lock theirs while they run, in whatever namespace) and no
    process of this machine listens on its port (a server started by another version of the
    library locks nothing, but it writes its key files only once it listens, and listens until it
    ends). A half-written ``.<port>.key.<pid>`` is stale once process ``<pid>`` is gone. Any
    other file is left alone.
    """
    listening = listening_ports()
    candidates = []
    for path in folder.glob("*.key"):
        if path.stem.isdigit() and int(path.stem) not in listening:
            candidates.append(path)
    for path in folder.glob(".*.key.*"):
        writer = path.name.rsplit(".", 1)[1]
        if writer.isdigit() and not pid_exists(int(writer)):
            candidates.append(path)
    return [path for path in candidates if path not in _held and _remove_if_unlocked(path)]


def _remove_if_unlocked(path: Path) -> bool:
    """Remove ``path`` unless a process holds it locked; whether it was removed."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # removed meanwhile
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # still the file under that name (not one a new server put there meanwhile)
        if os.fstat(descriptor).st_ino != path.stat().st_ino:
            return False
        path.unlink()
        return True
    except OSError:
        return False  # locked: its server runs
    finally:
        os.close(descriptor)


def remove_key_files(paths: Iterable[Path], key: str) -> None:
    """Remove the files written for a server, unless another server has since written its own."""
    for path in paths:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == key:
                path.unlink()
        _close_quietly(_held.pop(path, None))


def _close_quietly(descriptor: int | None) -> None:
    if descriptor is not None:
        with contextlib.suppress(OSError):
            os.close(descriptor)


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
