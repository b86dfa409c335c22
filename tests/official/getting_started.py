"""Transformers4Rec's getting-started session-based example, scaled down and on pandas.

Its ETL (``examples/getting-started-session-based/01-ETL-with-NVTabular.ipynb``, release 23.12):
synthetic clicks without timestamps; Categorify, Groupby by session, ListSlice(-20) with tags,
Filter(item_id-count >= 2) and ValueCount after it. Its model (``02-session-based-XLNet-with-PyT``):
TabularSequenceFeatures with max_sequence_length=20, continuous projection and masking, an MLP and
an XLNet block, a next-item head with tied weights; ``tr.Model(head)`` without a sequence length.
Sizes here are smaller so that fitting and training take seconds.
"""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import torch
import transformers4rec.torch as tr
from merlin.schema import Tags

SESSIONS_MAX_LENGTH = 20
MINIMUM_SESSION_LENGTH = 2
MODEL_COLUMNS = ["item_id-list", "category-list", "weekday_sin-list", "age_days-list"]
RAW_COLUMNS = ["session_id", "item_id", "category", "age_days", "weekday_sin", "day"]


def interactions(
    rows: int = 4000, sessions: int = 800, seed: int = 0, first_session: int = 70_000
) -> pd.DataFrame:
    """The notebook's synthetic clicks: long-tailed item ids, a category per id range, two
    continuous features and a day per session; sessions are random, so they mix in row order."""
    rng = np.random.default_rng(seed)
    item_ids = np.clip(rng.lognormal(3.0, 1.0, rows).astype(np.int32), 1, 50_000)
    frame = pd.DataFrame(
        {"session_id": rng.integers(first_session, first_session + sessions, rows)}
    )
    frame["item_id"] = item_ids
    frame["category"] = pd.cut(frame["item_id"], bins=334, labels=np.arange(1, 335)).astype(
        np.int32
    )
    frame["age_days"] = rng.uniform(0, 1, rows).astype(np.float32)
    frame["weekday_sin"] = rng.uniform(0, 1, rows).astype(np.float32)
    day_of_session = dict(
        zip(frame.session_id.unique(), rng.integers(1, 10, frame.session_id.nunique()), strict=True)
    )
    frame["day"] = frame.session_id.map(day_of_session)
    return frame


def workflow(categories_path: str) -> nvt.Workflow:
    """The notebook's workflow, unfitted.

    Categorify writes its vocabularies under ``categories_path``.
    """
    categories = ["item_id", "category"] >> nvt.ops.Categorify(out_path=categories_path)
    grouped = (categories + ["session_id", "day", "age_days", "weekday_sin"]) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        aggs={
            "item_id": ["list", "count"],
            "category": ["list"],
            "day": ["first"],
            "age_days": ["list"],
            "weekday_sin": ["list"],
        },
        name_sep="-",
    )
    category_list = grouped["category-list"] >> nvt.ops.ListSlice(-SESSIONS_MAX_LENGTH)
    item_list = (
        grouped["item_id-list"] >> nvt.ops.ListSlice(-SESSIONS_MAX_LENGTH) >> nvt.ops.TagAsItemID()
    )
    continuous_lists = (
        grouped["age_days-list", "weekday_sin-list"]
        >> nvt.ops.ListSlice(-SESSIONS_MAX_LENGTH)
        >> nvt.ops.AddMetadata(tags=[Tags.CONTINUOUS])
    )
    selected = (
        grouped["item_id-count", "day-first", "session_id"]
        + item_list
        + category_list
        + continuous_lists
    )
    sessions = selected >> nvt.ops.Filter(
        f=lambda df: df["item_id-count"] >= MINIMUM_SESSION_LENGTH
    )
    sequences = (
        sessions["item_id-list", "category-list", "age_days-list", "weekday_sin-list"]
        >> nvt.ops.ValueCount()
    )
    return nvt.Workflow(sessions["session_id", "day-first"] + sequences)


def model(schema, *, d_model: int = 32, seed: int = 0) -> tr.Model:
    """The notebook's XLNet next-item model at a smaller width (one layer, two heads)."""
    schema = schema.select_by_name(MODEL_COLUMNS)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        inputs = tr.TabularSequenceFeatures.from_schema(
            schema,
            max_sequence_length=SESSIONS_MAX_LENGTH,
            continuous_projection=16,
            masking="mlm",
            d_output=d_model,
        )
        config = tr.XLNetConfig.build(
            d_model=d_model, n_head=2, n_layer=1, total_seq_length=SESSIONS_MAX_LENGTH
        )
        body = tr.SequentialBlock(
            inputs, tr.MLPBlock([d_model]), tr.TransformerBlock(config, masking=inputs.masking)
        )
        head = tr.Head(body, tr.NextItemPredictionTask(weight_tying=True), inputs=inputs)
        return tr.Model(head)
