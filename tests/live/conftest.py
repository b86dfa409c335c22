"""``store``: settings of a fresh store of each kind, the embedded one (its own folder) and Redis
(the shared redis-server, under a key prefix of its own)."""

from __future__ import annotations

import pytest

from tests.live_graphs import store_settings


@pytest.fixture(params=["embedded", "redis"])
def store(request, tmp_path):
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    return store_settings(request.param, tmp_path / "store", server, timeout_s=5.0)
