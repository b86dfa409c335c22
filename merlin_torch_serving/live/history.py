"""SessionHistory: the head of a live-session graph. A request holds only each session's new
clicks; the step appends them to the session's stored clicks and hands the rest of the graph the
session's last ``max_clicks`` stored clicks, so the workflow, the model and everything after see
what a request holding the session's whole history would have brought, and answer the same.

Served, every instance of the step (every stub, every server sharing the store) appends to the
same store; a click is stored once (``live.codec`` says what names it) and a session's clicks
come back in timestamp order. A store that fails or is slow fails no request: the step answers
each session from the clicks its request carries (``mts_unstored_clicks_total``) and skips the
store for ``retry_after_s``; health reports the model degraded meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data.schemas import describe_column, schema_from_json, schema_to_json
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.graph.rehearsal import is_rehearsal
from merlin_torch_serving.live.codec import ClickCodec, click_keys
from merlin_torch_serving.live.trending import Trending
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.stores import (
    Click,
    GuardedStore,
    StoreSettings,
    settings_from_config,
    store_settings,
    text_key,
)


class SessionHistory(ServingOperator):
    """Append each session's new clicks to its stored clicks and answer its last ``max_clicks``.

    Parameters
    ----------
    store
        Where sessions are kept: a folder (the embedded store), a Redis URL (``redis://``,
        ``rediss://``, ``unix://``), or ``RedisSettings`` / ``EmbeddedSettings`` (password, TLS
        files, timeouts).
    clicks
        The columns of a click, as the rest of the graph takes them (``workflow.input_schema``):
        what this step answers, and, with ``event_id``, what a request holds besides it.
    max_clicks
        How many of a session's last clicks the graph is handed. Answers equal those to a
        request of the session's whole history while the session holds no more, or while the
        workflow reads no more of its last clicks (``ListSlice(-n)`` with ``n <= max_clicks``)
        and nothing from the whole session (a count of its clicks).
    session, timestamp
        The click columns holding the session id and the time that orders a session's clicks.
    ttl_s
        A session's clicks expire this long after its last click.
    event_id
        A request column naming each click (an id the front end gives it), which then names the
        click in the store; by default a click is named by all its values (a click sent again is
        the same click; two clicks of one session equal in every column, time included, are one).
    trending
        Count the clicks for ``TrendingItems`` (``Trending``: which item and time columns, the
        buckets and window); None counts nothing.
    retry_after_s
        After a failed call, requests skip the store for this long (answered from their own
        clicks), so a store that hangs costs one timeout, not one per request.
    """

    def __init__(
        self,
        store: str | StoreSettings,
        clicks: Schema,
        *,
        max_clicks: int,
        session: str = "session_id",
        timestamp: str = "timestamp",
        ttl_s: float = 1800.0,
        event_id: str | None = None,
        trending: Trending | None = None,
        retry_after_s: float = 1.0,
    ):
        super().__init__()
        self.settings = store_settings(store)
        self.clicks_schema = clicks
        self.max_clicks = int(max_clicks)
        self.session = session
        self.timestamp = timestamp
        self.ttl_s = float(ttl_s)
        self.event_id = event_id
        self.trending = trending
        self.retry_after_s = float(retry_after_s)
        if self.max_clicks < 1:
            raise ValueError(f"max_clicks must be at least 1, got {max_clicks!r}")
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be above 0 seconds, got {ttl_s!r}")
        self._check_columns()
        self.codec = ClickCodec(clicks, self.label)
        #: the store, as the step calls it (opened on first use, shared in this process)
        self.guard = GuardedStore(self.settings, retry_after_s=self.retry_after_s, label="sessions")

    @property
    def label(self) -> str:
        return "SessionHistory"

    # ---- graph building ----------------------------------------------------------------------

    def root_columns(self) -> list[str]:
        return [*self.clicks_schema.column_names, *([self.event_id] if self.event_id else [])]

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        columns = list(self.clicks_schema)
        if self.event_id:
            columns.append(
                input_schema.get(self.event_id)
                or ColumnSchema(self.event_id, dtype="int64", dims=(None,))
            )
        return Schema(columns)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        super().validate_schemas(parents_schema, deps_schema, input_schema, output_schema)
        if self.event_id and input_schema[self.event_id].is_list:
            raise SchemaError(
                self.label,
                self.event_id,
                "one event id per click",
                describe_column(input_schema[self.event_id]),
            )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return self.clicks_schema

    def request_groups(self) -> list[str]:
        return [self.session]

    def non_null_inputs(self) -> list[str]:
        return [self.session, self.timestamp, *([self.event_id] if self.event_id else [])]

    def services(self) -> list[dict[str, str]]:
        return [{"name": f"session store ({self.settings.kind})", "url": self.settings.describe()}]

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        columns = {name: np.asarray(transformable[name].values) for name in self.root_columns()}
        sessions = columns[self.session]
        if len(sessions) == 0:
            return _table({name: columns[name] for name in self.clicks_schema.column_names})
        keys = [text_key(value) for value in sessions]
        order = list(dict.fromkeys(keys))  # sessions in the order they first appear
        stored = None if is_rehearsal() else self._append(columns, keys)
        if stored is None:
            metrics.count(metrics.UNSTORED_CLICKS, len(keys) if not is_rehearsal() else 0)
            position = {key: index for index, key in enumerate(order)}
            rows = np.argsort([position[key] for key in keys], kind="stable")
            return _table({n: columns[n][rows] for n in self.clicks_schema.column_names})
        history = self.codec.unpack([payload for key in order for payload in stored[key]])
        return _table(history)

    def _append(self, columns: dict[str, np.ndarray], keys: list[str]) -> dict | None:
        click_columns = {name: columns[name] for name in self.clicks_schema.column_names}
        payloads = self.codec.pack(click_columns)
        identities = click_keys(payloads, columns[self.event_id] if self.event_id else None)
        times = columns[self.timestamp]
        if times.dtype.kind == "M":
            times = times.astype("datetime64[ns]").astype(np.int64)
        trending = self.trending
        items = buckets = None
        if trending is not None:
            items = [text_key(v) for v in columns[trending.item]]
            buckets = trending.buckets_of(columns[trending.timestamp])
        clicks: dict[str, list[Click]] = {}
        for row, session in enumerate(keys):
            clicks.setdefault(session, []).append(
                Click(
                    identities[row],
                    float(times[row]),
                    payloads[row],
                    items[row] if items is not None else None,
                    int(buckets[row]) if buckets is not None else 0,
                )
            )
        window = trending.store_window if trending is not None else None
        return self.guard.call(
            lambda store: store.append(
                clicks, keep=self.max_clicks, ttl_s=self.ttl_s, trending=window
            ),
            None,
        )

    def health(self):
        """The store's state as this process's calls last saw it."""
        return self.guard.state

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "store": self.settings.config(),
            "clicks": schema_to_json(self.clicks_schema),
            "max_clicks": self.max_clicks,
            "session": self.session,
            "timestamp": self.timestamp,
            "ttl_s": self.ttl_s,
            "event_id": self.event_id,
            "trending": self.trending.config() if self.trending else None,
            "retry_after_s": self.retry_after_s,
        }

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        return {
            **config,
            "store": settings_from_config(config["store"]),
            "clicks": schema_from_json(config["clicks"]),
            "trending": Trending.from_config(config["trending"]) if config["trending"] else None,
        }

    def _check_columns(self) -> None:
        names = self.clicks_schema.column_names
        wanted: Sequence[str] = [self.session, self.timestamp]
        if self.trending is not None:
            wanted = [*wanted, self.trending.item, self.trending.timestamp]
        for name in wanted:
            if name not in names:
                raise SchemaError(
                    self.label,
                    name,
                    "a column of the clicks",
                    f"no such column (the clicks have {', '.join(map(repr, names))})",
                    "name the session and time columns with session= and timestamp=",
                )
        kind = self.clicks_schema[self.timestamp].dtype.element_type.value
        if kind not in ("int", "uint", "float", "datetime"):
            raise SchemaError(
                self.label,
                self.timestamp,
                "numbers or datetimes that order a session's clicks",
                describe_column(self.clicks_schema[self.timestamp]),
            )
        if self.event_id in names:
            raise SchemaError(
                self.label,
                self.event_id,
                "an event id column beside the click columns",
                "one of the click columns",
                "name a request column the workflow does not take",
            )


def _table(columns: dict[str, np.ndarray]) -> TensorTable:
    return TensorTable(dict(columns), _unsafe=True)
