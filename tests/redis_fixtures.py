"""Redis for the tests (registered in tests/conftest.py): a real ``redis-server``, never a fake.

``redis_server``: one per test session, shared by tests that only add keys of their own (each
test names its own sessions, lists or key prefix): 127.0.0.1 on a port the OS assigned
(``.url``), a unix socket (``.socket_url``) and a TLS port (``.tls_url``, its CA in
``.tls_files.ca_file``). ``fresh_redis_server()`` starts one for a test that stops, pauses or
locks it. A machine without redis-server fails these tests, naming how to install it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import pytest

from examples.live_sessions.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    with fresh_redis_server(tmp_path_factory.mktemp("redis"), tls=True) as server:
        yield server


@contextlib.contextmanager
def fresh_redis_server(folder, **options) -> Iterator[RedisServer]:
    """A redis-server of its own in ``folder`` (``RedisServer``'s options), stopped after."""
    server = RedisServer(folder, **options)
    try:
        server.start()
    except (FileNotFoundError, RuntimeError) as error:
        pytest.fail(f"redis-server could not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def unique_prefix(name: str = "t") -> str:
    """A key prefix no other test of this session uses, for tests sharing ``redis_server``."""
    return f"{name}{next(_prefixes)}"
