"""A client of Feast's feature server (``feast serve``): online features over HTTP, through a
connection pool, each call bounded by a timeout, never raising.

Feast is not imported here, nor anywhere in the serving process: every Feast release pins numpy,
pandas, dask, pyarrow or protobuf against the Merlin 23.x stack, and Merlin Systems' ``QueryFeast``,
which imports it in the server, broke with each. The feature server is Feast's own process, in an
environment of its own; this module speaks its JSON API (``POST /get-online-features``).

A call that fails (refused, timed out, an error status, an answer that does not parse) returns
None, remembers why, and makes the calls of the next ``retry_after_s`` skip the server, so that a
server that hangs costs one timeout, not one per request; the state is what health reports. Both
are ``stores.guard.Outages``', as for a store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import urllib3

from merlin_torch_serving.stores.guard import Outages, ServiceState

ONLINE_FEATURES_PATH = "/get-online-features"
HEALTH_PATH = "/health"
FOUND = "PRESENT"


@dataclass(frozen=True)
class OnlineFeatures:
    """One answer: per feature, a value per key (None when not found) and whether it was found."""

    values: dict[str, list]
    found: dict[str, list[bool]]


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
        self._pool = urllib3.PoolManager(
            num_pools=1,
            maxsize=pool_size,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(total=self.timeout_s),
        )
        self.outages = Outages(
            self.url,
            retry_after_s=retry_after_s,
            what="the feature server",
            meanwhile="features get their defaults",
        )

    @property
    def state(self) -> ServiceState:
        return self.outages.state

    def online_features(
        self, references: Sequence[str], entity: str, keys: list
    ) -> OnlineFeatures | None:
        """The features ``references`` (``"view:feature"``) of ``keys`` of ``entity``, or None when
        the server did not answer (or is being skipped after a failure)."""
        if self.outages.skipping():
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
            self.outages.failed(f"{type(error).__name__}: {error}")
            return None
        self.outages.answered()
        return answer

    def check(self) -> ServiceState:
        """Ask the server's health endpoint now (bounded by the timeout) and return the state."""
        try:
            response = self._pool.request("GET", self.url + HEALTH_PATH)
            if response.status != 200:
                raise ValueError(f"HTTP {response.status} from {HEALTH_PATH}")
        except Exception as error:
            self.outages.failed(f"{type(error).__name__}: {error}", skip=False)
        else:
            self.outages.answered()
        return self.outages.state


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
