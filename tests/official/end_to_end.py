"""Transformers4Rec's end-to-end session-based example (Yoochoose), scaled down and on pandas.

Its ETL (``examples/end-to-end-session-based/01-ETL-with-NVTabular.ipynb``, release 23.12): the
notebook's synthetic clicks with timestamps, consecutive repeats removed and each item's first
timestamp joined in; Categorify, datetime LambdaOps (``to_datetime``, ``.dt.weekday``), a cyclical
weekday feature, a custom ``ItemRecency`` operator with a dependency, LogOp and Normalize, a Groupby
sorted by time, ListSlice(-20), a day index from ``col - col.min()`` over the batch, and a final
Filter(item_id-count >= 2). Its model (``02-End-to-end-session-based-with-Yoochoose-PyT``):
TabularSequenceFeatures (max_sequence_length=20, continuous projection, concat, masking) into an
XLNet built by ``XLNetConfig.to_torch_model`` with a tied next-item head, and ``model.top_k``.
"""

from __future__ import annotations

import calendar
import datetime

import numpy as np
import nvtabular as nvt
import pandas as pd
import torch
import transformers4rec.torch as tr
from merlin.dag import ColumnSelector
from merlin.schema import Schema, Tags

SESSIONS_MAX_LENGTH = 20
MINIMUM_SESSION_LENGTH = 2
TOP_K = 10
MODEL_COLUMNS = [
    "item_id-list",
    "category-list",
    "product_recency_days_log_norm-list",
    "et_dayofweek_sin-list",
]
RAW_COLUMNS = ["session_id", "timestamp", "item_id", "category", "itemid_ts_first"]


def interactions(
    days: int = 2, rows_per_day: int = 1500, sessions: int = 750, seed: int = 0
) -> pd.DataFrame:
    """The notebook's synthetic clicks, cleaned as it cleans them: long-tailed items, one session
    start per session within ``days`` days of 2014-04-01, clicks within an hour of it; consecutive
    repeats of an item in a session removed; ``itemid_ts_first`` the item's first timestamp."""
    rng = np.random.default_rng(seed)
    total = days * rows_per_day
    frame = pd.DataFrame(
        {
            "session_id": rng.integers(70_000, 70_000 + sessions, total),
            "item_id": np.clip(rng.lognormal(3.0, 1.0, total).astype(np.int64), 1, 50_000),
        }
    )
    frame["category"] = pd.cut(frame["item_id"], bins=334, labels=np.arange(1, 335)).astype(
        np.int64
    )
    start_date = datetime.date(2014, 4, 1)
    starts = {
        session: calendar.timegm(
            (
                start_date
                + datetime.timedelta(days=int(rng.integers(0, days)))
                + datetime.timedelta(seconds=int(rng.integers(0, 86_400)))
            ).timetuple()
        )
        for session in np.unique(frame["session_id"])
    }
    offsets = np.clip(rng.lognormal(3.0, 1.0, total).astype(np.int64), 0, 3600)
    frame["timestamp"] = frame["session_id"].map(starts).to_numpy() + offsets
    frame = frame.sort_values(["session_id", "timestamp"], kind="stable")
    repeated = (frame["session_id"] == frame["session_id"].shift(1)) & (
        frame["item_id"] == frame["item_id"].shift(1)
    )
    frame = frame[~repeated]
    first_seen = frame.groupby("item_id")["timestamp"].min().rename("itemid_ts_first")
    return frame.merge(first_seen, left_on="item_id", right_index=True, how="left").reset_index(
        drop=True
    )[RAW_COLUMNS]


class ItemRecency(nvt.ops.Operator):
    """The notebook's custom operator: days since the item was first seen, zero when negative."""

    def transform(self, columns, df):
        for column in columns.names:
            days = (df[column] - df["itemid_ts_first"]) / (60 * 60 * 24)
            df[column + "_age_days"] = days * (days >= 0)
        return df

    def compute_selector(
        self, input_schema: Schema, selector, parents_selector, dependencies_selector
    ):
        self._validate_matching_cols(input_schema, parents_selector, "computing input selector")
        return parents_selector

    def column_mapping(self, col_selector):
        return {name + "_age_days": [name] for name in col_selector.names}

    @property
    def dependencies(self):
        return ["itemid_ts_first"]

    @property
    def output_dtype(self):
        return np.float64


def cycled_sin(col, max_value):
    return np.sin(2 * np.pi * ((col + 0.000001) / max_value))


def workflow(categories_path: str) -> nvt.Workflow:
    """The notebook's workflow, unfitted.

    It uses ``pd.to_datetime`` where the notebook calls ``cudf.to_datetime``.
    """
    categories = ColumnSelector(["category", "item_id"]) >> nvt.ops.Categorify(
        out_path=categories_path
    )
    timestamp = ColumnSelector(["timestamp"])
    event_time = (
        timestamp
        >> nvt.ops.LambdaOp(lambda col: pd.to_datetime(col, unit="s"))
        >> nvt.ops.Rename(name="event_time_dt")
    )
    weekday = (
        event_time
        >> nvt.ops.LambdaOp(lambda col: col.dt.weekday)
        >> nvt.ops.Rename(name="et_dayofweek")
    )
    weekday_sin = (
        weekday >> (lambda col: cycled_sin(col + 1, 7)) >> nvt.ops.Rename(name="et_dayofweek_sin")
    )
    recency = (
        timestamp
        >> ItemRecency()
        >> nvt.ops.LogOp()
        >> nvt.ops.Normalize(out_dtype=np.float32)
        >> nvt.ops.Rename(name="product_recency_days_log_norm")
    )
    features = (
        ColumnSelector(["session_id", "timestamp"])
        + categories
        + event_time
        + weekday
        + weekday_sin
        + recency
    )
    grouped = features >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={
            "item_id": ["list", "count"],
            "category": ["list"],
            "timestamp": ["first"],
            "event_time_dt": ["first"],
            "et_dayofweek_sin": ["list"],
            "product_recency_days_log_norm": ["list"],
        },
        name_sep="-",
    )
    item_list = grouped["item_id-list"] >> nvt.ops.TagAsItemID()
    continuous_lists = grouped[
        "et_dayofweek_sin-list", "product_recency_days_log_norm-list"
    ] >> nvt.ops.AddMetadata(tags=[Tags.CONTINUOUS])
    lists = (item_list + continuous_lists + grouped["category-list"]) >> nvt.ops.ListSlice(
        -SESSIONS_MAX_LENGTH
    )
    day_index = (
        grouped["event_time_dt-first"]
        >> nvt.ops.LambdaOp(lambda col: (col - col.min()).dt.days + 1)
        >> nvt.ops.Rename(f=lambda col: "day_index")
        >> nvt.ops.AddMetadata(tags=[Tags.CATEGORICAL])
    )
    session_id = grouped["session_id"] >> nvt.ops.AddMetadata(tags=[Tags.CATEGORICAL])
    selected = session_id + grouped["item_id-count"] + lists + day_index
    return nvt.Workflow(
        selected >> nvt.ops.Filter(f=lambda df: df["item_id-count"] >= MINIMUM_SESSION_LENGTH)
    )


def model(schema, *, d_model: int = 32, seed: int = 0) -> tr.Model:
    """The notebook's model, returning the top TOP_K items.

    It is of a smaller width: one layer, two heads.
    """
    schema = schema.select_by_name(MODEL_COLUMNS)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        inputs = tr.TabularSequenceFeatures.from_schema(
            schema,
            max_sequence_length=SESSIONS_MAX_LENGTH,
            continuous_projection=16,
            aggregation="concat",
            d_output=d_model,
            masking="mlm",
        )
        config = tr.XLNetConfig.build(
            d_model=d_model, n_head=2, n_layer=1, total_seq_length=SESSIONS_MAX_LENGTH
        )
        return config.to_torch_model(inputs, tr.NextItemPredictionTask(weight_tying=True))
