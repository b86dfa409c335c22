"""Reaching a store: URLs, TLS, passwords, timeouts, and the errors that say what to fix."""

from __future__ import annotations

import time

import pytest

from merlin_torch_serving import StoreError
from merlin_torch_serving.stores import (
    EmbeddedSettings,
    RedisSettings,
    open_store,
    settings_from_config,
    store_settings,
)
from tests.redis_fixtures import fresh_redis_server, unique_prefix


def test_a_location_names_redis_by_its_scheme_and_anything_else_is_a_folder(tmp_path):
    assert isinstance(store_settings("redis://127.0.0.1:6379/0"), RedisSettings)
    assert isinstance(store_settings("rediss://cache.internal:6380/1"), RedisSettings)
    assert isinstance(store_settings("unix:///run/redis.sock?db=2"), RedisSettings)
    embedded = store_settings(tmp_path / "state", timeout_s=1.0)
    assert embedded == EmbeddedSettings(str(tmp_path / "state"), timeout_s=1.0)
    with pytest.raises(ValueError, match=r"a Redis URL .* or a folder; got 'http://x'"):
        store_settings("http://x")


def test_settings_come_back_from_their_config(tmp_path):
    for settings in (
        RedisSettings("rediss://localhost:1/0", password_env="PW", ca_file="/ca.pem"),
        EmbeddedSettings(str(tmp_path), timeout_s=2.0),
    ):
        assert settings_from_config(settings.config()) == settings


def test_a_password_in_the_url_is_refused_and_never_repeated():
    with pytest.raises(ValueError, match=r"redis://:\*\*\*@localhost:6379/0.*password_env="):
        RedisSettings("redis://:secret@localhost:6379/0")


def test_a_tls_client_certificate_needs_its_key():
    with pytest.raises(ValueError, match="needs both cert_file and key_file"):
        RedisSettings("rediss://localhost:1/0", cert_file="client.pem")


def test_url_env_points_the_same_settings_at_another_server(redis_server, monkeypatch):
    settings = RedisSettings("redis://127.0.0.1:1/0", url_env="MTS_TEST_STORE_URL", timeout_s=5)
    monkeypatch.setenv("MTS_TEST_STORE_URL", redis_server.url)
    with open_store(settings) as store:
        store.ping()


def test_redis_over_a_unix_socket_answers(redis_server):
    with open_store(redis_server.socket_url, key_prefix=unique_prefix()) as store:
        store.block("l", ["1"])
        assert store.blocked("l") == ["1"]


def test_redis_over_tls_verifies_the_server_certificate(redis_server):
    ca_file = str(redis_server.tls_files.ca_file)
    with open_store(redis_server.tls_url, ca_file=ca_file, key_prefix=unique_prefix()) as store:
        store.block("l", ["1"])
        assert store.blocked("l") == ["1"]
    with (
        open_store(redis_server.tls_url, timeout_s=5) as unverified,
        pytest.raises(StoreError, match=r"rediss://localhost:\d+/0 failed: .*certificate.*ca_file"),
    ):
        unverified.ping()


def test_redis_with_a_password_takes_it_from_the_named_variable(tmp_path, monkeypatch):
    with fresh_redis_server(tmp_path, password="s3cret-pw") as server:
        monkeypatch.setenv("MTS_TEST_REDIS_PASSWORD", "s3cret-pw")
        with open_store(server.url, password_env="MTS_TEST_REDIS_PASSWORD") as store:
            store.ping()
        with (
            open_store(server.url) as anonymous,
            pytest.raises(StoreError, match=r"AuthenticationError: .*password_env"),
        ):
            anonymous.ping()


def test_an_unreachable_redis_fails_within_the_timeout(tmp_path):
    with fresh_redis_server(tmp_path) as server:
        url = server.url
    started = time.monotonic()
    with (
        open_store(url, timeout_s=0.5, connect_timeout_s=0.5) as store,
        pytest.raises(StoreError, match=r"redis://127\.0\.0\.1:\d+/0 failed: ConnectionError"),
    ):
        store.ping()
    assert time.monotonic() - started < 30  # refused at once; the bound only catches a hang


def test_a_locked_embedded_store_fails_after_its_timeout(tmp_path):
    import sqlite3

    with open_store(tmp_path, timeout_s=0.2) as store:
        store.block("l", ["1"])
        holder = sqlite3.connect(EmbeddedSettings(str(tmp_path)).path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreError, match=r"database is locked; another process held"):
                store.block("l", ["2"])
            assert store.blocked("l") == ["1"]  # reads go on beside the writer (WAL)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.block("l", ["2"]) == 1
