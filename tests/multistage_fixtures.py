"""Session fixtures of the multi-stage tests (registered in tests/conftest.py), built once per test
session on the session example's clicks, workflow and XLNet (tests/session_models.py):

``multistage_tables``: the item and session feature tables (examples/multi_stage/catalog.py); the
session table leaves out MISSING_SESSIONS, as a store that has not seen them yet.
``feature_repository``: those tables as a Feast feature repository, applied and materialized into
its sqlite online store by Feast's own environment. ``feature_server``: ``feast serve`` on it.
``ranker``: the example's ranking model, untrained, its weights fixed by a seed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

from tests.session_models import request_rows

#: how many held-out sessions the feature store has never seen
MISSING_SESSION_COUNT = 3


class Tables(NamedTuple):
    items: pd.DataFrame
    sessions: pd.DataFrame
    #: held-out session ids the session table lacks
    missing_sessions: list[int]


@pytest.fixture(scope="session")
def multistage_tables(session_workflow, session_split) -> Tables:
    from examples.multi_stage import catalog

    train, held_out = session_split
    missing = sorted(held_out["session_id"].unique())[:MISSING_SESSION_COUNT]
    known = np.setdiff1d(pd.concat([train, held_out])["session_id"].unique(), missing)
    return Tables(
        catalog.item_table(session_workflow, train),
        catalog.session_table(known),
        [int(m) for m in missing],
    )


@pytest.fixture(scope="session")
def feature_repository(multistage_tables, tmp_path_factory):
    from examples.multi_stage import feature_store

    folder = feature_store.write_repository(
        tmp_path_factory.mktemp("feature_repository"),
        multistage_tables.items,
        multistage_tables.sessions,
    )
    try:
        feature_store.apply_and_materialize(folder)
    except (FileNotFoundError, RuntimeError) as error:
        pytest.fail(f"the Feast feature repository could not be made: {error}", pytrace=False)
    return folder


@pytest.fixture(scope="session")
def feature_server(feature_repository):
    """``feast serve`` on the test repository; a server that cannot start fails the tests."""
    from examples.multi_stage import feature_store

    try:
        with feature_store.FeatureServer(feature_repository) as server:
            yield server
    except (FileNotFoundError, RuntimeError) as error:
        pytest.fail(f"Feast's feature server could not start: {error}", pytrace=False)


@pytest.fixture(scope="session")
def ranker(session_workflow):
    from examples.multi_stage import catalog
    from examples.multi_stage import ranker as ranking

    return ranking.build_ranker(
        catalog.category_count(session_workflow),
        catalog.PRICE_BUCKETS,
        catalog.TAG_IDS,
        catalog.DEVICES,
        seed=5,
    )


def multistage_request(held_out: pd.DataFrame, tables: Tables, sessions: int, seed: int):
    """Raw clicks of ``sessions`` held-out sessions (tests/session_models.py's ``request_rows``:
    the longest and a single-click session among them, unknown items), one of them a session the
    feature store lacks when there are two or more."""
    if sessions == 1:
        return request_rows(held_out, 1, seed)
    known = held_out[~held_out["session_id"].isin(tables.missing_sessions)]
    rows = request_rows(known, sessions - 1, seed)
    missing = held_out[held_out["session_id"] == tables.missing_sessions[0]]
    return pd.concat([rows, missing], ignore_index=True)


def feature_store_free_url() -> str:
    """The URL of a port nothing listens on (a feature server that is down)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"
