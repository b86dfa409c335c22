"""A client of Feast's feature server (``feast serve``): online features over HTTP, through a
connection pool, each call bounded by a timeout, never raising.

Feast is not imported here, nor anywhere in the serving process: every Feast release pins numpy,
pandas, dask, pyarrow or protobuf against the Merlin 23.x stack, and Merlin Systems' ``QueryFeast``,
which imports it in the server, broke with each. The feature server is Feast's own process, in an
environment of its own; this module speaks its JSON API (``POST /get-online-features``).

A call that fails (refused, timed out, an error status, an answer that does not parse) returns
None, remembers why, and makes the calls of the next ``retry_after_s`` skip the server, so that a
server that hangs costs one timeout, not one per request; the state is what health reports.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import urllib3

logger = logging.getLogger("merlin_torch_serving")

ONLINE_FEATURES_PATH = "/get-online-features"
HEALTH_PATH = "/health"
FOUND = "PRESENT"


@dataclass(frozen=True)
class OnlineFeatures:
    """One answer: per feature, a value per key (None when not found) and whether it was found."""

    values: dict[str, list]
    found: dict[str, list[bool]]


@dataclass(frozen=True)
class ServerState:
    """What the last calls to a feature server showed."""

    url: str
    #: whether the last call was answered
    reachable: bool
    #: why the last failing call failed ("" while it answers)
    last_error: str
    #: when the state last changed (``time.time()``)
    since: float


class FeatureServerClient:
    """Calls one feature server; thread-safe (the pool and the state are shared by callers)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.5,
        retry_after_s: float = 1.0,
        pool_size: int = 4,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"the feature server's URL must start with http:// or https://, got {url!r}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be above 0, got {timeout_s!r}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retry_after_s = float(retry_after_s)
        self._pool = urllib3.PoolManager(
            num_pools=1,
            maxsize=pool_size,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(total=self.timeout_s),
        )
        self._lock = threading.Lock()
        self._state = ServerState(self.url, True, "", time.time())
        self._skip_until = 0.0

    @property
    def state(self) -> ServerState:
        return self._state

    def online_features(
        self, references: Sequence[str], entity: str, keys: list
    ) -> OnlineFeatures | None:
        """The features ``references`` (``"view:feature"``) of ``keys`` of ``entity``, or None when
        the server did not answer (or is being skipped after a failure)."""
        if time.monotonic() < self._skip_until:
            return None
        body = json.dumps({"features": list(references), "entities": {entity: keys}})
        try:
            response = self._pool.request(
                "POST",
                self.url + ONLINE_FEATURES_PATH,
                body=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {response.data[:300]!r}")
            answer = _parse(json.loads(response.data), [r.split(":", 1)[-1] for r in references])
        except Exception as error:  # any failure is answered with the defaults, never raised
            self._failed(f"{type(error).__name__}: {error}")
            return None
        self._answered()
        return answer

    def check(self) -> ServerState:
        """Ask the server's health endpoint now (bounded by the timeout) and return the state."""
        try:
            response = self._pool.request("GET", self.url + HEALTH_PATH)
            if response.status != 200:
                raise ValueError(f"HTTP {response.status} from {HEALTH_PATH}")
        except Exception as error:
            self._failed(f"{type(error).__name__}: {error}", skip=False)
        else:
            self._answered()
        return self._state

    def _failed(self, reason: str, skip: bool = True) -> None:
        with self._lock:
            if skip:
                self._skip_until = time.monotonic() + self.retry_after_s
            if self._state.reachable:
                logger.warning(
                    "the feature server at %s does not answer (%s); features get their defaults"
                    " until it does",
                    self.url,
                    reason,
                )
                self._state = ServerState(self.url, False, reason, time.time())
            elif reason != self._state.last_error:
                self._state = ServerState(self.url, False, reason, self._state.since)

    def _answered(self) -> None:
        with self._lock:
            if not self._state.reachable:
                logger.warning("the feature server at %s answers again", self.url)
                self._state = ServerState(self.url, True, "", time.time())


def _parse(answer: dict, features: list[str]) -> OnlineFeatures:
    """Feast's answer, by feature: its ``results`` follow ``metadata.feature_names`` (the entity
    key first), in an order of Feast's own choosing."""
    names = answer["metadata"]["feature_names"]
    results = dict(zip(names, answer["results"], strict=True))
    values, found = {}, {}
    for name in features:
        result = results[name]
        values[name] = result["values"]
        found[name] = [status == FOUND for status in result["statuses"]]
    return OnlineFeatures(values, found)
