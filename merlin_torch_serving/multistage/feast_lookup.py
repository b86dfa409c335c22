"""FeastFeatures: features of each key from a Feast feature store, through its feature server.

The step keeps the server's URL, nothing of the feature repository (Merlin Systems' ``QueryFeast``
keeps the repository's path, which must then exist on every serving host) and never imports Feast
(see ``feature_server``). Each request asks for the distinct keys once. A key the store lacks gets
the declared defaults (``mts_missing_entities_total``); when the server is down, slow or answers
garbage, every key gets them (``mts_unanswered_entities_total``,
``mts_feature_server_errors_total``) and the request is answered all the same.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage.feature_server import FeatureServerClient, OnlineFeatures
from merlin_torch_serving.multistage.feature_specs import (
    FeatureSpec,
    gather,
    parse_features,
    to_config,
)
from merlin_torch_serving.multistage.lookup import FeatureLookup


class FeastFeatures(FeatureLookup):
    """The features of a Feast feature view for each row's key, from a running ``feast serve``.

    Parameters
    ----------
    url
        The feature server, e.g. ``"http://localhost:6566"``.
    view
        The feature view (``item_features``).
    entity
        The view's join key (``item_id``), as the feature server expects it.
    features
        ``{name: dtype}`` of the view's features to answer (``"float32"``, ``"int64"``,
        ``"list[int64]"``, ...), as the view declares them (``Float32``, ``Int64``,
        ``Array(Int64)``).
    defaults
        ``{name: value}`` for keys the store lacks or when the server does not answer; 0 (an empty
        list) for features left out.
    column
        The input column of keys, one per row; by default ``entity``.
    prefix
        Put before each output column's name.
    timeout_s
        The most a call to the feature server may take; past it the features get their defaults.
    retry_after_s
        After a failed call, requests skip the server for this long (their features get the
        defaults at once), so a hung server costs one timeout rather than one per request.
    url_env
        The name of an environment variable that, when set where the step runs (the server's
        environment), overrides ``url``: the same export then points at another feature server.
    """

    def __init__(
        self,
        url: str,
        *,
        view: str,
        entity: str,
        features: Mapping[str, str],
        defaults: Mapping[str, Any] | None = None,
        column: str | None = None,
        prefix: str = "",
        timeout_s: float = 0.5,
        retry_after_s: float = 1.0,
        url_env: str | None = None,
    ):
        super().__init__()
        self.url = url
        self.url_env = url_env
        self.view = view
        self.entity = entity
        self.column = column or entity
        self.prefix = prefix
        self.timeout_s = float(timeout_s)
        self.retry_after_s = float(retry_after_s)
        self.specs: list[FeatureSpec] = parse_features(
            features, defaults, f"FeastFeatures({view!r})"
        )
        self.server = FeatureServerClient(
            self.serving_url, timeout_s=self.timeout_s, retry_after_s=self.retry_after_s
        )

    @property
    def serving_url(self) -> str:
        """The URL called: ``url_env``'s value where it is set, else ``url``."""
        return (os.environ.get(self.url_env) if self.url_env else None) or self.url

    @property
    def label(self) -> str:
        return f"FeastFeatures({self.view!r})"

    def key_description(self) -> str:
        return f"one int or text {self.entity!r} key per row"

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        keys = np.asarray(transformable[self.column].values)
        distinct, rows = np.unique(keys, return_inverse=True)
        answer = None
        if len(distinct):
            answer = self.server.online_features(
                [f"{self.view}:{spec.name}" for spec in self.specs],
                self.entity,
                distinct.tolist(),
            )
            if answer is None:
                metrics.count(metrics.FEATURE_SERVER_ERRORS, 1, lookup=self.view)
                metrics.count(metrics.UNANSWERED_ENTITIES, len(distinct), lookup=self.view)
        columns = {}
        for spec in self.specs:
            values, offsets, found = _arrays(spec, answer, len(distinct))
            columns[self.prefix + spec.name] = gather(
                spec, values, offsets, np.where(found[rows], rows, -1) if len(rows) else rows
            )
        if answer is not None:
            missing = ~np.logical_or.reduce([answer.found[s.name] for s in self.specs])
            metrics.count(
                metrics.MISSING_ENTITIES, int(np.asarray(missing)[rows].sum()), lookup=self.view
            )
        return TensorTable(columns, _unsafe=True)

    def health(self):
        """The feature server's state, asked now."""
        return self.server.check()

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "url_env": self.url_env,
            "view": self.view,
            "entity": self.entity,
            "column": self.column,
            "prefix": self.prefix,
            "timeout_s": self.timeout_s,
            "retry_after_s": self.retry_after_s,
            **to_config(self.specs),
        }

    def services(self) -> list[dict[str, str]]:
        return [{"name": f"feast feature server ({self.view})", "url": self.serving_url}]


def _arrays(
    spec: FeatureSpec, answer: OnlineFeatures | None, keys: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """One feature of the distinct keys as arrays (values, offsets for lists) and whether each key
    has it; nothing is found when the server did not answer."""
    if answer is None:
        found = np.zeros(keys, dtype=bool)
        empty = np.zeros(0, dtype=spec.dtype)
        return (
            (empty, np.zeros(1, np.int64), found)
            if spec.is_list
            else (np.zeros(keys, spec.dtype), None, found)
        )
    values = answer.values[spec.name]
    found = np.asarray(answer.found[spec.name], dtype=bool) & np.array(
        [v is not None for v in values], dtype=bool
    )
    if not spec.is_list:
        # JSON numbers are doubles: a float32 feature read through float64 comes back exactly
        filled = [v if ok else 0 for v, ok in zip(values, found, strict=True)]
        return (
            np.asarray(filled, dtype=np.float64 if spec.dtype.kind == "f" else np.int64).astype(
                spec.dtype
            ),
            None,
            found,
        )
    lists = [v if ok else [] for v, ok in zip(values, found, strict=True)]
    lengths = np.array([len(v) for v in lists], dtype=np.int64)
    flat = [x for v in lists for x in v]
    dtype = np.float64 if spec.dtype.kind == "f" else np.int64
    return (
        np.asarray(flat, dtype=dtype).astype(spec.dtype),
        wire.offsets_from_lengths(lengths, np.int64),
        found,
    )
