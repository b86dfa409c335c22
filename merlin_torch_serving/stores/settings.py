"""Where a store lives and how to reach it: an embedded folder on this machine, or a Redis server.

Settings are small frozen dataclasses that an operator writes into its export (``config()``) and
reads back where it serves (``from_config``); nothing secret is ever part of them: a Redis
password is named by the environment variable that holds it (``password_env``), read when the
connection is made, and a URL that carries one is refused.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import asdict, dataclass
from typing import Any

#: URL schemes that name a Redis server (``unix://`` is Redis on a unix socket)
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: the file of the embedded store inside its folder
EMBEDDED_FILE = "state.sqlite3"


@dataclass(frozen=True)
class RedisSettings:
    """A Redis server (or anything speaking its protocol: Valkey, KeyDB, a managed service).

    Parameters
    ----------
    url
        ``redis://host:port/db``, ``rediss://host:port/db`` (TLS) or ``unix:///path.sock?db=0``;
        a user name may be in it (``redis://name@host``), a password may not.
    password_env
        The environment variable holding the password (read where the connection is made, so
        the export never holds it); unset or empty means no password.
    ca_file
        TLS: the CA bundle that signed the server's certificate (the system's when None).
    cert_file, key_file
        TLS: this client's certificate and key, for servers that ask for one
        (``tls-auth-clients yes``).
    check_hostname
        TLS: whether the server's certificate must name the host of ``url``.
    timeout_s
        The most one call may wait for the server to answer; past it the call fails (an operator
        then answers from the request alone).
    connect_timeout_s
        The most opening a connection may take.
    key_prefix
        Put before every key, so that several graphs (or other applications) share one database.
    url_env
        An environment variable that, when set where the store is opened (the server's
        environment), overrides ``url``: the same export then points at another Redis.
    """

    url: str
    password_env: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True
    timeout_s: float = 0.2
    connect_timeout_s: float = 0.2
    key_prefix: str = "mts"
    url_env: str | None = None

    def __post_init__(self):
        check_redis_url(self.url)
        _check_timeouts(self.timeout_s, self.connect_timeout_s)
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "a TLS client certificate needs both cert_file and key_file; got"
                f" cert_file={self.cert_file!r}, key_file={self.key_file!r}"
            )
        if not self.key_prefix or any(c in self.key_prefix for c in "{} "):
            raise ValueError(
                f"key_prefix must be a non-empty word without braces or spaces, got"
                f" {self.key_prefix!r}"
            )

    kind = "redis"

    @property
    def serving_url(self) -> str:
        """The URL connected to: ``url_env``'s value where it is set, else ``url``."""
        if self.url_env and os.environ.get(self.url_env):
            return check_redis_url(os.environ[self.url_env])
        return self.url

    @property
    def password(self) -> str | None:
        """The password, read from ``password_env`` now (None without one)."""
        return (os.environ.get(self.password_env) or None) if self.password_env else None

    @property
    def uses_tls(self) -> bool:
        return self.serving_url.startswith("rediss://")

    def describe(self) -> str:
        """Where it is, for messages and health reports (never a secret)."""
        return self.serving_url

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class EmbeddedSettings:
    """A store in a folder of this machine (SQLite in WAL mode), needing no service.

    Every process that opens the same folder shares it: the python-backend stubs of one server,
    several servers on one machine, the command line; it is kept across restarts.

    Parameters
    ----------
    folder
        Where the store's file (``state.sqlite3``) is; created when missing.
    timeout_s
        The most a call may wait for another process's write to finish; past it the call fails.
    folder_env
        An environment variable that, when set where the store is opened, overrides ``folder``.
    """

    folder: str
    timeout_s: float = 0.2
    folder_env: str | None = None

    kind = "embedded"

    def __post_init__(self):
        if not str(self.folder):
            raise ValueError("the embedded store needs a folder; got an empty one")
        object.__setattr__(self, "folder", os.path.abspath(os.fspath(self.folder)))
        _check_timeouts(self.timeout_s, None)

    @property
    def serving_folder(self) -> str:
        if self.folder_env and os.environ.get(self.folder_env):
            return os.path.abspath(os.environ[self.folder_env])
        return self.folder

    @property
    def path(self) -> str:
        """The store's file."""
        return os.path.join(self.serving_folder, EMBEDDED_FILE)

    def describe(self) -> str:
        return self.path

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "folder": self.folder,
            "timeout_s": self.timeout_s,
            "folder_env": self.folder_env,
        }


StoreSettings = RedisSettings | EmbeddedSettings


def store_settings(location: str | os.PathLike | StoreSettings, **options: Any) -> StoreSettings:
    """Settings from a location: a Redis URL (``redis://``, ``rediss://``, ``unix://``) or a
    folder for the embedded store; ``options`` are the settings' other fields. Settings given
    as they are are returned unchanged."""
    if isinstance(location, RedisSettings | EmbeddedSettings):
        if options:
            raise ValueError(f"options {sorted(options)} given with settings that hold them")
        return location
    text = os.fspath(location)
    if urllib.parse.urlsplit(text).scheme in REDIS_SCHEMES:
        return RedisSettings(text, **options)
    if "://" in text:
        raise ValueError(
            f"a store is a Redis URL (redis://, rediss://, unix://) or a folder; got {text!r}"
        )
    return EmbeddedSettings(text, **options)


def settings_from_config(config: dict[str, Any]) -> StoreSettings:
    """The settings ``config()`` wrote."""
    fields = dict(config)
    kind = fields.pop("kind", None)
    if kind == RedisSettings.kind:
        return RedisSettings(**fields)
    if kind == EmbeddedSettings.kind:
        return EmbeddedSettings(**fields)
    raise ValueError(f"unknown store kind {kind!r} (expected 'redis' or 'embedded')")


def check_redis_url(url: str) -> str:
    """``url`` when it names a Redis server without a password in it; ValueError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError(
            f"a Redis URL starts with redis://, rediss:// (TLS) or unix://; got {redact(url)!r}"
        )
    query = urllib.parse.parse_qs(parts.query)
    if parts.password or "password" in query:
        raise ValueError(
            f"the Redis URL {redact(url)!r} holds a password, which would be written into exports"
            " and logs: put it in an environment variable and name it with password_env="
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"the Redis URL {url!r} names no host (e.g. redis://localhost:6379/0)")
    return url


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}***@{host}"))


def _check_timeouts(timeout_s: object, connect_timeout_s: object) -> None:
    for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
        if value is not None and not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
