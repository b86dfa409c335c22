"""The Redis store: sessions, rules and trending counts in a Redis server shared by replicas.

Layout (every key starts with the settings' ``key_prefix``; ``{session}`` is a hash tag):

    <p>:clicks:{<session>}   sorted set: score = timestamp, member = arrival number (16 hex
                             digits, so equal timestamps keep arrival order) + the click's payload;
                             trimmed to the last ``keep``
    <p>:keys:{<session>}     set of the keys of every click the session received (duplicates
                             are refused against it, trimmed clicks included)
    <p>:rules:<list>         set of blocked items
    <p>:trend:<name>         sorted set of the trending buckets that hold counts
    <p>:trend:<name>:<b>     hash: item -> clicks in bucket ``b``

An append is one Lua script for all the sessions of a request: a click is stored and counted
only when its key was not in the session's set, atomically, so retries and concurrent requests
neither store twice nor lose a click, and the request pays one round trip. The script touches
keys of several sessions, so it runs on a single Redis (or a replicated primary), not a cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from merlin_torch_serving.exceptions import StoreError
from merlin_torch_serving.stores.base import (
    Click,
    Store,
    TrendingCounts,
    TrendingWindow,
    check_window,
)
from merlin_torch_serving.stores.settings import RedisSettings

#: the arrival number before a payload in a session's sorted set
ARRIVAL_DIGITS = 16

APPEND_SCRIPT = """
local keep, ttl, sessions = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local trend_prefix, trend_window = ARGV[4], tonumber(ARGV[5])
local trend_index = KEYS[2 * sessions + 1]
local a, out, latest = 6, {}, nil
for s = 1, sessions do
  local history, seen = KEYS[2 * s - 1], KEYS[2 * s]
  local n = tonumber(ARGV[a]); a = a + 1
  for c = 1, n do
    local key, score, payload = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    local bucket, item = ARGV[a + 3], ARGV[a + 4]
    a = a + 5
    if redis.call('SADD', seen, key) == 1 then
      local arrival = redis.call('SCARD', seen)
      redis.call('ZADD', history, score, string.format('%016x', arrival) .. payload)
      if item ~= '' then
        local b = tonumber(bucket)
        redis.call('HINCRBY', trend_prefix .. b, item, 1)
        redis.call('ZADD', trend_index, b, b)
        if latest == nil or b > latest then latest = b end
      end
    end
  end
  redis.call('ZREMRANGEBYRANK', history, 0, -keep - 1)
  redis.call('PEXPIRE', history, ttl)
  redis.call('PEXPIRE', seen, ttl)
  out[s] = redis.call('ZRANGE', history, 0, -1)
end
if latest ~= nil then
  local newest = tonumber(redis.call('ZRANGE', trend_index, -1, -1)[1])
  local old = redis.call('ZRANGEBYSCORE', trend_index, '-inf', newest - trend_window)
  for _, b in ipairs(old) do redis.call('DEL', trend_prefix .. b) end
  redis.call('ZREMRANGEBYSCORE', trend_index, '-inf', newest - trend_window)
end
return out
"""


class RedisStore(Store):
    """The store on the Redis server of ``settings`` (see the module's docstring); thread-safe
    (one connection pool, shared by callers)."""

    settings: RedisSettings

    def __init__(self, settings: RedisSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._client: Any = None
        self._append: Any = None
        prefix = settings.key_prefix
        self._clicks = prefix + ":clicks:{%s}"
        self._keys = prefix + ":keys:{%s}"
        self._rules = prefix + ":rules:"
        self._trend = prefix + ":trend:"

    # ---- sessions ----------------------------------------------------------------------------

    def append(
        self,
        clicks: Mapping[str, Sequence[Click]],
        *,
        keep: int,
        ttl_s: float,
        trending: TrendingWindow | None = None,
    ) -> dict[str, list[bytes]]:
        sessions = list(clicks)
        keys = [key for s in sessions for key in (self._clicks % s, self._keys % s)]
        index = self._trend + (trending.name if trending else "")
        keys.append(index)
        arguments: list[Any] = [
            int(keep),
            max(int(ttl_s * 1000), 1),
            len(sessions),
            index + ":",
            trending.window if trending else 1,
        ]
        for session in sessions:
            arguments.append(len(clicks[session]))
            for click in clicks[session]:
                counted = trending is not None and click.item is not None
                arguments += [
                    click.key,
                    repr(float(click.timestamp)),
                    click.payload,
                    int(click.bucket),
                    click.item if counted else "",
                ]
        answers = self._call(lambda client: self._append_script(client)(keys, arguments))
        return {
            session: [member[ARRIVAL_DIGITS:] for member in members]
            for session, members in zip(sessions, answers, strict=True)
        }

    def clicks(self, session: str, keep: int | None = None) -> list[bytes]:
        start = 0 if keep is None else -int(keep)
        members = self._call(lambda client: client.zrange(self._clicks % session, start, -1))
        return [member[ARRIVAL_DIGITS:] for member in members]

    def forget(self, session: str) -> bool:
        removed = self._call(
            lambda client: client.delete(self._clicks % session, self._keys % session)
        )
        return int(removed) > 0

    def count_sessions(self) -> int:
        pattern = self._clicks.replace("{%s}", "*")
        return int(
            self._call(lambda client: sum(1 for _ in client.scan_iter(match=pattern, count=1000)))
        )

    # ---- rules -------------------------------------------------------------------------------

    def block(self, rule_list: str, items: Iterable[str]) -> int:
        items = list(items)
        return (
            int(self._call(lambda client: client.sadd(self._rules + rule_list, *items)))
            if items
            else 0
        )

    def unblock(self, rule_list: str, items: Iterable[str]) -> int:
        items = list(items)
        return (
            int(self._call(lambda client: client.srem(self._rules + rule_list, *items)))
            if items
            else 0
        )

    def blocked(self, rule_list: str) -> list[str]:
        members = self._call(lambda client: client.smembers(self._rules + rule_list))
        return sorted(member.decode() for member in members)

    def rule_lists(self) -> list[str]:
        names = self._call(
            lambda client: list(client.scan_iter(match=self._rules + "*", count=500))
        )
        return sorted(name.decode()[len(self._rules) :] for name in names)

    # ---- trending ----------------------------------------------------------------------------

    def trending_counts(self, name: str, window: int) -> TrendingCounts:
        window = check_window(window)
        index = self._trend + name

        def read(client) -> TrendingCounts:
            newest = client.zrange(index, -1, -1)
            if not newest:
                return TrendingCounts(None)
            latest = int(newest[0])
            buckets = [int(b) for b in client.zrangebyscore(index, latest - window + 1, latest)]
            pipeline = client.pipeline(transaction=False)
            for bucket in buckets:
                pipeline.hgetall(f"{index}:{bucket}")
            counts = {
                bucket: {item.decode(): int(n) for item, n in hash_.items()}
                for bucket, hash_ in zip(buckets, pipeline.execute(), strict=True)
            }
            return TrendingCounts(latest, counts)

        return self._call(read)

    # ---- the store itself --------------------------------------------------------------------

    def ping(self) -> None:
        self._call(lambda client: client.ping())

    def close(self) -> None:
        with self._lock:
            client, self._client, self._append = self._client, None, None
        if client is not None:
            client.close()

    def _call(self, work):
        """``work(client)``, with Redis' errors (refused, timed out, refused by the server) raised
        as ``StoreError``."""
        import redis

        try:
            return work(self._connected())
        except redis.RedisError as error:
            raise StoreError(
                self.describe(), f"{type(error).__name__}: {error}", _hint(error)
            ) from error

    def _connected(self):
        with self._lock:
            if self._client is None:
                self._client = connect(self.settings)
            return self._client

    def _append_script(self, client):
        if self._append is None:
            self._append = client.register_script(APPEND_SCRIPT)
        return self._append


def connect(settings: RedisSettings, **options: Any):
    """A ``redis.Redis`` client for ``settings``: its timeouts, TLS files and password, and no
    retry (a failed call fails at once, within the timeout; callers decide what comes next).
    ``options`` go to ``redis.Redis`` as they are (``max_connections``, ...)."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as error:
        raise StoreError(
            settings.describe(),
            "the redis package is not installed",
            "pip install 'merlin-torch-serving[redis]'",
        ) from error
    tls: dict[str, Any] = {}
    if settings.uses_tls:
        tls = {
            "ssl_ca_certs": settings.ca_file,
            "ssl_certfile": settings.cert_file,
            "ssl_keyfile": settings.key_file,
            "ssl_check_hostname": settings.check_hostname,
        }
    return redis.Redis.from_url(
        settings.serving_url,
        password=settings.password,
        socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        **tls,
        **options,
    )


def _hint(error: Exception) -> str:
    text = str(error)
    if "Authentication" in type(error).__name__ or "NOAUTH" in text or "WRONGPASS" in text:
        return "set the password in the environment variable the settings name (password_env)"
    if "certificate" in text.lower() or "SSL" in text:
        return "check ca_file (the CA that signed the server's certificate) and check_hostname"
    if "Timeout" in type(error).__name__:
        return "the server answered too late: raise timeout_s, or look at the server's load"
    return "check that the Redis server runs and that the URL names it"
