"""Whether a store answers, asked from any process, for health reports: no client library, no
password and no certificate needed, so a client of a server answers as the server's launcher does.

A Redis server is sent ``PING`` in its own protocol (over TLS for ``rediss://``, without checking
the certificate: nothing secret is sent); ``+PONG`` or an ``-NOAUTH`` refusal both prove it is
there. An embedded store answers when its file opens and its write lock is free within the
timeout (a lock held longer is what makes its writers fail).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import ssl
import urllib.parse

from merlin_torch_serving.stores.settings import REDIS_SCHEMES


def store_error(location: str, timeout_s: float) -> str:
    """Why the store at ``location`` (a Redis URL or an embedded store's file) does not answer
    within ``timeout_s``; "" when it does."""
    try:
        if urllib.parse.urlsplit(location).scheme in REDIS_SCHEMES:
            return _redis_error(location, timeout_s)
        return _embedded_error(location, timeout_s)
    except (OSError, sqlite3.Error, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def _redis_error(url: str, timeout_s: float) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: str | tuple = parts.path
    else:
        connection = socket.socket(
            socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET
        )
        address = (parts.hostname, parts.port or 6379)
    connection.settimeout(timeout_s)
    with connection:
        connection.connect(address)
        channel = connection
        if parts.scheme == "rediss":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            channel = context.wrap_socket(connection, server_hostname=parts.hostname)
        channel.sendall(b"PING\r\n")
        reply = channel.recv(128)
    if reply.startswith((b"+PONG", b"-NOAUTH")):
        return ""
    return f"unexpected answer to PING: {reply[:80]!r}"


def _embedded_error(path: str, timeout_s: float) -> str:
    if not os.path.exists(path):
        return f"no store file at {path!r} on this machine"
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    finally:
        db.close()
    return ""
