"""Hypothesis strategies for raw interaction requests.

They draw shuffled sessions, ties, and unseen and null ids.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


@st.composite
def session_requests(
    draw,
    known_items: list,
    item_kind: str = "int",
    max_sessions: int = 6,
    max_length: int = 30,
    min_longest: int = 1,
    with_price: bool = False,
):
    """Rows of a few sessions in shuffled order.

    Sessions run from 1 row to beyond the ListSlice length; timestamps come from a small range so
    that sessions have ties; item ids mix known, never-seen and (for float and string ids) null
    values.
    """
    session_count = draw(st.integers(1, max_sessions))
    per_session = {"min_size": session_count, "max_size": session_count}
    session_ids = draw(st.lists(st.integers(0, 10**6), unique=True, **per_session))
    lengths = draw(st.lists(st.integers(1, max_length), **per_session))
    if max(lengths) < min_longest:
        lengths[0] = min_longest
    rows = sum(lengths)
    order = np.array(draw(st.permutations(range(rows))))
    unseen = {
        "int": st.integers(10**6, 10**6 + 50),
        "float": st.integers(10**6, 10**6 + 50).map(float),
        "str": st.text(min_size=0, max_size=3),
    }[item_kind]
    choices = [st.sampled_from(known_items), unseen]
    if item_kind != "int":
        choices.append(st.just(None if item_kind == "str" else np.nan))
    items = draw(st.lists(st.one_of(*choices), min_size=rows, max_size=rows))
    if all(item is None or item != item for item in items):
        # NVTabular cannot encode a column that holds nulls only (see test_categorify)
        items[0] = known_items[0]
    item_dtype = {"int": np.int64, "float": np.float64, "str": object}[item_kind]
    per_row = {"min_size": rows, "max_size": rows}
    columns = {
        "session_id": np.repeat(np.array(session_ids, dtype=np.int64), lengths)[order],
        "timestamp": np.array(draw(st.lists(st.integers(0, 40), **per_row)), dtype=np.int64) * 1000,
        "item_id": np.array(items, dtype=item_dtype),
        "category": np.array(draw(st.lists(st.integers(0, 20), **per_row)), dtype=np.int64),
    }
    if with_price:
        prices = draw(st.lists(st.one_of(st.floats(0, 1000), st.just(np.nan)), **per_row))
        columns["price"] = np.array(prices, dtype=np.float64)
    return columns
