"""Row orders against pandas itself.

Covered: sort_values (ties in row order, nulls, both directions) and groupby's groups.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving.fastpath.ordering import group_rows, sort_order

KEY_VALUES = {
    "int": st.integers(-3, 3),
    "float": st.one_of(st.integers(-3, 3).map(float), st.just(np.nan), st.just(-0.0)),
    "str": st.one_of(st.sampled_from(["a", "b", "", "ab"]), st.none()),
}
DTYPES = {"int": np.int64, "float": np.float64, "str": object}


@st.composite
def key_columns(draw, count: int):
    """A few key columns of random kinds; up to 80 rows, so both of numpy's sort paths are used."""
    rows = draw(st.integers(0, 80))
    kinds = draw(st.lists(st.sampled_from(sorted(KEY_VALUES)), min_size=count, max_size=count))
    return [
        np.array(draw(st.lists(KEY_VALUES[kind], min_size=rows, max_size=rows)), dtype=DTYPES[kind])
        for kind in kinds
    ]


@settings(max_examples=150, deadline=None)
@given(keys=st.integers(1, 3).flatmap(key_columns), ascending=st.booleans())
def test_sort_order_is_the_order_of_pandas_stable_sort_values(keys, ascending):
    frame = pd.DataFrame({f"k{i}": values for i, values in enumerate(keys)})
    expected = frame.sort_values(
        list(frame.columns), ascending=ascending, kind="stable"
    ).index.to_numpy()
    np.testing.assert_array_equal(sort_order(keys, ascending), expected)


def test_sort_order_of_one_key_puts_nulls_last_in_both_directions():
    values = np.array([2.0, np.nan, 1.0, 3.0])
    np.testing.assert_array_equal(sort_order([values], True), [2, 0, 3, 1])
    np.testing.assert_array_equal(sort_order([values], False), [3, 0, 2, 1])


@settings(max_examples=150, deadline=None)
@given(keys=st.integers(1, 3).flatmap(key_columns))
def test_group_rows_groups_like_pandas_groupby(keys):
    frame = pd.DataFrame({f"k{i}": values for i, values in enumerate(keys)})
    frame["row"] = np.arange(len(frame))
    names = [f"k{i}" for i in range(len(keys))]
    expected = frame.groupby(names, sort=True, dropna=True)["row"].agg(list)
    groups = group_rows(keys)
    got = np.split(groups.rows, np.cumsum(groups.counts)[:-1]) if len(groups.counts) else []
    assert [list(rows) for rows in got] == list(expected)
    for position, name in enumerate(names):
        key_values = expected.index.get_level_values(name) if len(names) > 1 else expected.index
        assert groups.keys[position].tolist() == list(key_values)


def test_group_rows_drops_rows_whose_key_is_null():
    groups = group_rows([np.array(["b", None, "a", "b"], dtype=object)])
    assert groups.keys[0].tolist() == ["a", "b"]
    np.testing.assert_array_equal(groups.rows, [2, 0, 3])
    np.testing.assert_array_equal(groups.counts, [1, 2])


def test_sort_order_keeps_tied_rows_in_row_order_whatever_the_other_rows():
    # numpy's quicksort reorders ties differently as other rows come and go; a stable sort never
    rng = np.random.default_rng(0)
    for others in (0, 7, 300):
        values = rng.permutation(np.concatenate([np.full(40, 5), rng.integers(0, 10, others)]))
        for ascending in (True, False):
            order = sort_order([values], ascending)
            tied = order[values[order] == 5]
            np.testing.assert_array_equal(tied, np.flatnonzero(values == 5))
