"""Synthetic impressions for a click-through-rate model: one row per (user, item) shown, with
categorical and continuous features, some of them missing, and whether it was clicked.

Clicks follow a hidden rule a model can learn: a user-item affinity (latent taste vectors), cheaper
items and younger users click more, and mobile users a little less. Rows are seeded, so the same
arguments always give the same frame.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CATEGORICAL_COLUMNS = ("user_id", "item_id", "item_category", "device")
CONTINUOUS_COLUMNS = ("price", "user_age")
LABEL_COLUMN = "click"
DEVICES = ("mobile", "desktop", "tablet")


def generate_impressions(
    n_rows: int = 20_000,
    *,
    n_users: int = 500,
    n_items: int = 300,
    n_categories: int = 12,
    missing_fraction: float = 0.05,
    seed: int = 0,
) -> pd.DataFrame:
    """Impressions with raw ids (not dense ranges), a string ``device``, ``price`` and
    ``user_age`` with about ``missing_fraction`` of their values missing (NaN), and ``click``."""
    rng = np.random.default_rng(seed)
    user_taste = rng.normal(size=(n_users, 4))
    item_taste = rng.normal(size=(n_items, 4))
    item_category = rng.integers(0, n_categories, n_items)
    item_price = np.round(rng.lognormal(3.0, 0.6, n_items), 2)
    user_age = rng.integers(18, 75, n_users).astype(np.float64)
    user_device = rng.integers(0, len(DEVICES), n_users)

    users = rng.integers(0, n_users, n_rows)
    # popular items are shown more often
    popularity = rng.zipf(1.6, n_items).astype(np.float64)
    items = rng.choice(n_items, n_rows, p=popularity / popularity.sum())
    affinity = (user_taste[users] * item_taste[items]).sum(1)
    logit = (
        1.2 * affinity
        - 0.8 * (np.log(item_price[items]) - 3.0)
        - 0.03 * (user_age[users] - 45.0)
        - 0.4 * (user_device[users] == 0)
        - 1.0
    )
    click = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    frame = pd.DataFrame(
        {
            "user_id": 10_000 + users * 7,
            "item_id": 50_000 + items * 13,
            "item_category": 900 + item_category[items],
            "device": np.array(DEVICES, dtype=object)[user_device[users]],
            "price": item_price[items],
            "user_age": user_age[users],
            LABEL_COLUMN: click,
        }
    )
    for column in CONTINUOUS_COLUMNS:
        frame.loc[rng.random(n_rows) < missing_fraction, column] = np.nan
    return frame


def split(
    frame: pd.DataFrame, held_out_fraction: float = 0.2, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A random split of the rows into (train, held out), each with a fresh index."""
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be between 0 and 1, got {held_out_fraction!r}")
    held_out = np.random.default_rng(seed).random(len(frame)) < held_out_fraction
    return frame[~held_out].reset_index(drop=True), frame[held_out].reset_index(drop=True)
