"""``store``: each test of a store runs on both, the embedded one (a fresh folder) and Redis
(the shared redis-server, under a key prefix of the test's own)."""

from __future__ import annotations

import pytest

from merlin_torch_serving.stores import open_store
from tests.redis_fixtures import unique_prefix


@pytest.fixture(params=["embedded", "redis"])
def store(request, tmp_path):
    if request.param == "embedded":
        opened = open_store(tmp_path / "store")
    else:
        server = request.getfixturevalue("redis_server")
        opened = open_store(server.url, key_prefix=unique_prefix(), timeout_s=5.0)
    with opened:
        yield opened
