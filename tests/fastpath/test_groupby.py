"""The compiled Groupby.

Covered: pandas' sort and group order, every compiled aggregation, and NVTabular's casts.
"""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import (
    assert_wire_equal,
    fit,
    oracle,
    run_module,
    scripted_module,
)

TRAIN = pd.DataFrame(
    {
        "k": [1, 1, 2, 2, 3],
        "k2": [0, 1, 0, 1, 0],
        "t": [5.0, 3.0, 4.0, 1.0, np.nan],  # float, so that requests may hold null timestamps
        "v": np.array([10, 20, 30, 40, 50], dtype=np.int32),
        "f": [0.5, 1.5, np.nan, 2.5, 3.5],
    }
)
AGGS = {
    "v": ["list", "count", "sum", "mean", "min", "max", "first", "last"],
    "f": ["list", "count", "sum", "mean", "min", "max", "first", "last"],
    "t": ["first", "last"],
}


def groupby_workflow(train: pd.DataFrame = TRAIN, **options) -> nvt.Workflow:
    columns = (
        ["k", "k2", "t", "v", "f"]
        if "k2" in options.get("groupby_cols", [])
        else ["k", "t", "v", "f"]
    )
    return fit(columns >> nvt.ops.Groupby(**options), train[columns])


# requests to a scripted workflow have its input schema's dtypes (Triton holds them to it): keys
# that may be null need a float key column in training too
FLOAT_KEYS = TRAIN.assign(k=TRAIN["k"].astype(np.float64))


@pytest.fixture(scope="module")
def by_k():
    return groupby_workflow(groupby_cols=["k"], sort_cols=["t"], aggs=AGGS, name_sep="-")


@pytest.fixture(scope="module")
def by_k_descending():
    return groupby_workflow(
        groupby_cols=["k"], sort_cols=["t"], aggs=AGGS, name_sep="_", ascending=False
    )


@pytest.fixture(scope="module")
def by_two_keys_two_sorts():
    return groupby_workflow(groupby_cols=["k", "k2"], sort_cols=["t", "v"], aggs=AGGS, name_sep="-")


@st.composite
def grouped_rows(draw, two_keys: bool = False):
    """Rows with repeated keys (some null), and tied and null sort values.

    Their floats are of wide magnitude.
    """
    rows = draw(st.integers(1, 60))
    floats = st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False),
        st.sampled_from([0.1, 0.2, 0.3, 1e16, -1e16, 1.0, 1e-8, np.inf, -np.inf]),
        st.just(np.nan),
    )

    def column(strategy, dtype):
        return np.array(draw(st.lists(strategy, min_size=rows, max_size=rows)), dtype=dtype)

    request = {
        "k": column(st.one_of(st.integers(0, 4).map(float), st.just(np.nan)), np.float64),
        "t": column(st.one_of(st.integers(0, 3).map(float), st.just(np.nan)), np.float64),
        "v": column(st.integers(-(2**31), 2**31 - 1), np.int32),
        "f": column(floats, np.float64),
    }
    if two_keys:
        request["k2"] = column(st.integers(0, 2), np.int64)
    if np.isnan(request["k"]).all():
        request["k"][0] = (
            1.0  # keep one group: NVTabular fails on an empty frame downstream of list columns
        )
    return request


@settings(max_examples=80, deadline=None)
@given(request=grouped_rows())
def test_groupby_equals_nvtabular_on_random_rows(by_k, request):
    assert_wire_equal(compile_workflow(by_k).transform(request), oracle(by_k, request))


@settings(max_examples=60, deadline=None)
@given(request=grouped_rows())
def test_descending_groupby_equals_nvtabular_on_random_rows(by_k_descending, request):
    assert_wire_equal(
        compile_workflow(by_k_descending).transform(request), oracle(by_k_descending, request)
    )


@settings(max_examples=60, deadline=None)
@given(request=grouped_rows(two_keys=True))
def test_groupby_on_two_keys_and_two_sort_columns_equals_nvtabular(by_two_keys_two_sorts, request):
    got = compile_workflow(by_two_keys_two_sorts).transform(request)
    assert_wire_equal(got, oracle(by_two_keys_two_sorts, request))


@pytest.fixture(scope="module")
def float_key_groupbys():
    return {
        "by_k": groupby_workflow(
            FLOAT_KEYS, groupby_cols=["k"], sort_cols=["t"], aggs=AGGS, name_sep="-"
        ),
        "by_k_descending": groupby_workflow(
            FLOAT_KEYS,
            groupby_cols=["k"],
            sort_cols=["t"],
            aggs=AGGS,
            name_sep="_",
            ascending=False,
        ),
        "by_two_keys_two_sorts": groupby_workflow(
            FLOAT_KEYS, groupby_cols=["k", "k2"], sort_cols=["t", "v"], aggs=AGGS, name_sep="-"
        ),
    }


@settings(max_examples=60, deadline=None)
@given(request=grouped_rows())
@pytest.mark.parametrize("name", ["by_k", "by_k_descending"])
def test_scripted_groupby_equals_nvtabular_on_random_rows(float_key_groupbys, name, request):
    workflow = float_key_groupbys[name]
    assert_wire_equal(run_module(scripted_module(workflow), request), oracle(workflow, request))


@settings(max_examples=60, deadline=None)
@given(request=grouped_rows(two_keys=True))
def test_scripted_groupby_on_two_keys_and_two_sort_columns_equals_nvtabular_ties_included(
    float_key_groupbys, request
):
    workflow = float_key_groupbys["by_two_keys_two_sorts"]
    assert_wire_equal(run_module(scripted_module(workflow), request), oracle(workflow, request))


def test_scripted_groupby_keeps_tied_rows_in_request_order(float_key_groupbys):
    request = {
        "k": np.array([1.0, 1.0, 1.0, 1.0]),
        "t": np.array([2.0, 1.0, 2.0, 1.0]),
        "v": np.array([10, 20, 30, 40], dtype=np.int32),
        "f": np.array([1.0, 2.0, 3.0, 4.0]),
    }
    got = run_module(scripted_module(float_key_groupbys["by_k"]), request)
    np.testing.assert_array_equal(got["v-list__values"], [20, 40, 10, 30])
    np.testing.assert_array_equal(got["v-first"], [20])
    np.testing.assert_array_equal(got["v-last"], [30])


def test_groupby_drops_rows_with_a_null_key_and_orders_groups_by_key(by_k):
    request = {
        "k": np.array([3.0, np.nan, 1.0, 3.0]),
        "t": np.array([2.0, 0.0, 1.0, 1.0]),
        "v": np.array([1, 2, 3, 4], dtype=np.int32),
        "f": np.array([0.5, 0.25, np.nan, 1.0]),
    }
    got = compile_workflow(by_k).transform(request)
    np.testing.assert_array_equal(got["k"], [1, 3])
    np.testing.assert_array_equal(
        got["v-list__values"], [3, 4, 1]
    )  # group 3 sorted by t: 4 (t=1) then 1 (t=2)
    np.testing.assert_array_equal(got["f-count"], [0, 2])  # count skips NaN
    assert got["f-count"].dtype == np.int32
    assert got["v-sum"].dtype == np.float32
    np.testing.assert_array_equal(got["f-sum"], [0.0, 1.5])  # a sum of nothing is 0
    np.testing.assert_array_equal(got["f-min"], [np.nan, 0.5])  # a minimum of nothing is NaN
    np.testing.assert_array_equal(
        got["f-first"], [np.nan, 1.0]
    )  # first is the first row, NaN or not
    assert_wire_equal(got, oracle(by_k, request))


def test_descending_groupby_swaps_first_and_last_like_nvtabular(by_k_descending):
    request = {
        "k": np.array([1.0, 1.0, 1.0]),
        "t": np.array([1.0, 3.0, 2.0]),
        "v": np.array([10, 30, 20], dtype=np.int32),
        "f": np.array([1.0, 3.0, 2.0]),
    }
    got = compile_workflow(by_k_descending).transform(request)
    np.testing.assert_array_equal(got["v_list__values"], [30, 20, 10])
    # NVTabular's "first" of a descending sort is the last list element, and "last" the first
    np.testing.assert_array_equal(got["v_first"], [10])
    np.testing.assert_array_equal(got["v_last"], [30])
    assert_wire_equal(got, oracle(by_k_descending, request))


def test_groupby_with_an_aggregation_that_is_not_compiled_runs_through_nvtabular():
    workflow = groupby_workflow(groupby_cols=["k"], aggs={"f": ["std", "list"]}, name_sep="-")
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == [("Groupby", "aggregation 'std' on column 'f' is not compiled")]
    request = {
        "k": np.array([1, 1, 2]),
        "t": np.array([0.0, 0.0, 0.0]),
        "v": np.array([1, 2, 3], dtype=np.int32),
        "f": np.array([1.0, 2.0, 4.0]),
    }
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


@pytest.fixture(scope="module")
def datetime_first_last():
    """A datetime column aggregated like the end-to-end example's ``event_time_dt``."""
    train = pd.DataFrame(
        {"k": [1, 1, 2], "t": [3, 1, 2], "when": pd.to_datetime([30, 10, 20], unit="s")}
    )
    return fit(
        ["k", "t", "when"]
        >> nvt.ops.Groupby(
            groupby_cols=["k"],
            sort_cols=["t"],
            aggs={"when": ["first", "last", "list"]},
            name_sep="-",
        ),
        train,
    )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 9), st.integers(-(10**9), 3 * 10**9)),
        min_size=1,
        max_size=30,
    )
)
def test_groupby_first_last_and_list_of_datetimes_equal_nvtabular(datetime_first_last, rows):
    keys, times, seconds = map(np.array, zip(*rows, strict=True))
    request = {
        "k": keys,
        "t": times,
        "when": seconds.astype("datetime64[s]").astype("datetime64[ns]"),
    }
    compiled = compile_workflow(datetime_first_last)
    assert compiled.fallbacks == []
    assert_wire_equal(compiled.transform(request), oracle(datetime_first_last, request))


def test_groupby_min_and_max_of_equal_zeros_keep_the_first_sign_as_pandas_does(by_k):
    # fmin and fmax keep the last of equal values; pandas keeps the first, 0.0 and -0.0 included
    request = {
        "k": np.array([1.0, 1.0, 1.0, 2.0, 2.0, 3.0]),
        "t": np.array([0.0, 1.0, 2.0, 0.0, 1.0, 0.0]),
        "v": np.arange(6, dtype=np.int32),
        "f": np.array([np.nan, -0.0, 0.0, 0.0, -0.0, -0.0]),
    }
    got = compile_workflow(by_k).transform(request)
    assert np.signbit(got["f-min"]).tolist() == [True, False, True]
    assert_wire_equal(got, oracle(by_k, request))


def test_scripted_groupby_min_and_max_of_equal_zeros_keep_the_first_sign(float_key_groupbys):
    request = {
        "k": np.array([1.0, 1.0, 1.0, 2.0, 2.0, 3.0]),
        "t": np.array([0.0, 1.0, 2.0, 0.0, 1.0, 0.0]),
        "v": np.arange(6, dtype=np.int32),
        "f": np.array([np.nan, -0.0, 0.0, 0.0, -0.0, -0.0]),
    }
    workflow = float_key_groupbys["by_k"]
    got = run_module(scripted_module(workflow), request)
    assert np.signbit(got["f-min"]).tolist() == [True, False, True]
    assert_wire_equal(got, oracle(workflow, request))
