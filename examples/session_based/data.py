"""Interaction rows for the session-based example: a seeded synthetic generator, file I/O and a
split by time into training and held-out sessions.

An interactions table has one row per click and these four integer columns (any extra columns are
kept by the readers and ignored by the workflow):

- ``session_id``: the session the click belongs to;
- ``item_id``: the raw id of the clicked item (any integers; the workflow encodes them);
- ``category``: the item's category, one per item (any integers);
- ``timestamp``: when the click happened, in seconds (datetime columns are converted to seconds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

INTERACTION_COLUMNS = ("session_id", "item_id", "category", "timestamp")

# Sessions longer than this are cut; real click logs have a long tail that rarely goes further.
MAX_SESSION_LENGTH = 50


def generate_interactions(
    *,
    n_sessions: int = 5000,
    n_items: int = 2000,
    n_categories: int = 40,
    seed: int = 0,
    start_timestamp: int = 1_700_000_000,
    days: int = 30,
) -> pd.DataFrame:
    """Synthetic clicks with the shape of a real catalog and a signal a sequence model can learn.

    Item popularity follows Zipf's law, session lengths a clipped lognormal (1 to 50, median ~4),
    and each next click is, in this order of likelihood, one of the previous item's three fixed
    "next item" neighbours, a popular item of the same category, or a popular item of any kind.
    Popularity alone therefore explains part of the data and the order of clicks explains more.
    The same arguments always give the same rows.
    """
    for name, value, minimum in (
        ("n_sessions", n_sessions, 1),
        ("n_items", n_items, 4),
        ("n_categories", n_categories, 1),
        ("days", days, 1),
    ):
        if value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    if n_categories > n_items:
        raise ValueError(
            f"n_categories ({n_categories}) must not exceed n_items ({n_items}): every category "
            "needs at least one item"
        )
    rng = np.random.default_rng(seed)
    catalog = _Catalog.generate(rng, n_items=n_items, n_categories=n_categories)
    lengths = rng.lognormal(mean=1.4, sigma=0.9, size=n_sessions)
    lengths = np.clip(np.rint(lengths), 1, MAX_SESSION_LENGTH).astype(np.int64)

    # Walk all sessions one position at a time; a session's clicks past its length are dropped.
    item_index = np.empty((n_sessions, MAX_SESSION_LENGTH), dtype=np.int64)
    item_index[:, 0] = catalog.popular(rng, n_sessions)
    for position in range(1, int(lengths.max())):
        item_index[:, position] = catalog.next_items(rng, item_index[:, position - 1])

    starts = np.sort(rng.integers(0, days * 86_400, size=n_sessions)) + start_timestamp
    # Gaps of a few seconds to a few minutes between clicks, never zero so the order is unambiguous.
    gaps = 1 + rng.exponential(scale=45.0, size=(n_sessions, MAX_SESSION_LENGTH)).astype(np.int64)
    gaps[:, 0] = 0
    timestamps = starts[:, None] + np.cumsum(gaps, axis=1)

    clicked = np.arange(MAX_SESSION_LENGTH)[None, :] < lengths[:, None]
    session_ids = np.arange(n_sessions, dtype=np.int64)[:, None] + 100_000
    session_ids = np.broadcast_to(session_ids, clicked.shape)
    items = item_index[clicked]
    interactions = pd.DataFrame(
        {
            "session_id": session_ids[clicked],
            "item_id": catalog.raw_item_ids[items],
            "category": catalog.raw_categories[catalog.item_category[items]],
            "timestamp": timestamps[clicked],
        }
    )
    return interactions.astype("int64")


class _Catalog:
    """The items of the synthetic shop: raw ids, categories, popularity and next-item neighbours."""

    # How the next click is chosen: a neighbour of the previous item, else a popular item of its
    # category, else a popular item of the whole catalog.
    NEIGHBOUR_PROBABILITY = 0.6
    SAME_CATEGORY_PROBABILITY = 0.2
    NEIGHBOUR_WEIGHTS = np.array([0.6, 0.3, 0.1])
    ZIPF_EXPONENT = 0.8

    def __init__(self, raw_item_ids, raw_categories, item_category, popularity):
        self.raw_item_ids = raw_item_ids
        self.raw_categories = raw_categories
        self.item_category = item_category
        # Drawn by generate() with this catalog's own samplers: [item, NEIGHBOUR_WEIGHTS].
        self.neighbours = np.empty((len(raw_item_ids), len(self.NEIGHBOUR_WEIGHTS)), dtype=np.int64)
        # Dividing by the last cumulative value makes the final entry exactly 1.0, so a uniform
        # draw in [0, 1) always lands on an item.
        cumulative = np.cumsum(popularity)
        self._popularity_cdf = cumulative / cumulative[-1]
        # Items sorted by category; each category's cumulative popularity is shifted by the
        # category's index, so one searchsorted over all of them draws within a given category.
        self._by_category = np.argsort(item_category, kind="stable")
        sorted_categories = item_category[self._by_category]
        cumulative = pd.Series(popularity[self._by_category]).groupby(sorted_categories).cumsum()
        total = cumulative.groupby(sorted_categories).transform("last")
        self._category_cdf = (cumulative / total).to_numpy() + sorted_categories

    @classmethod
    def generate(cls, rng: np.random.Generator, *, n_items: int, n_categories: int) -> _Catalog:
        # Raw ids are large and arbitrary, as in a real catalog, so nothing can rely on 0..n.
        raw_item_ids = (
            rng.choice(9_000_000, size=n_items, replace=False).astype(np.int64) + 1_000_000
        )
        raw_categories = (
            rng.choice(9_000, size=n_categories, replace=False).astype(np.int64) + 1_000
        )
        # Every category gets at least one item; the rest are spread at random.
        item_category = np.concatenate(
            [np.arange(n_categories), rng.integers(0, n_categories, size=n_items - n_categories)]
        )
        rng.shuffle(item_category)
        popularity = 1.0 / rng.permutation(np.arange(1, n_items + 1)) ** cls.ZIPF_EXPONENT
        catalog = cls(raw_item_ids, raw_categories, item_category, popularity)
        # Neighbours come mostly from the item's own category, so category carries signal too.
        for column in range(catalog.neighbours.shape[1]):
            same_category = rng.random(n_items) < 0.7
            catalog.neighbours[:, column] = np.where(
                same_category,
                catalog.popular_in_category(rng, item_category),
                catalog.popular(rng, n_items),
            )
        return catalog

    def popular(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.searchsorted(self._popularity_cdf, rng.random(size), side="right")

    def popular_in_category(self, rng: np.random.Generator, categories: np.ndarray) -> np.ndarray:
        shifted = categories + rng.random(len(categories))
        return self._by_category[np.searchsorted(self._category_cdf, shifted, side="right")]

    def next_items(self, rng: np.random.Generator, previous: np.ndarray) -> np.ndarray:
        draw = rng.random(len(previous))
        column = rng.choice(
            len(self.NEIGHBOUR_WEIGHTS), size=len(previous), p=self.NEIGHBOUR_WEIGHTS
        )
        neighbour = self.neighbours[previous, column]
        same_category = self.popular_in_category(rng, self.item_category[previous])
        anything = self.popular(rng, len(previous))
        neighbour_drawn = draw < self.NEIGHBOUR_PROBABILITY
        category_drawn = draw < self.NEIGHBOUR_PROBABILITY + self.SAME_CATEGORY_PROBABILITY
        return np.select(
            [neighbour_drawn, category_drawn], [neighbour, same_category], default=anything
        )


def write_interactions(interactions: pd.DataFrame, path: str | Path) -> Path:
    """Write interactions to ``.parquet`` or ``.csv``, chosen by the file's suffix."""
    path = Path(path)
    validate_interactions(interactions, source="the interactions to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    file_format = _file_format(path)
    if file_format == "parquet":
        interactions.to_parquet(path, index=False)
    else:
        interactions.to_csv(path, index=False)
    return path


def read_interactions(path: str | Path, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """Read an interactions file (``.parquet`` or ``.csv``) and check it has the four columns.

    Integer columns of any width come back as int64, whole floats (``8382491.0``, as CSV readers
    and joins make them) as int64, and datetime timestamps as int64 seconds. ``columns`` maps the
    file's names to the four expected ones (``{"user_session": "session_id"}``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"interactions file {str(path)!r} does not exist")
    interactions = pd.read_parquet(path) if _file_format(path) == "parquet" else pd.read_csv(path)
    return validate_interactions(
        interactions, source=f"interactions file {str(path)!r}", columns=columns
    )


def validate_interactions(
    interactions: pd.DataFrame,
    *,
    source: str = "interactions",
    columns: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Return the interactions with the four columns as int64, or raise naming what is wrong.

    ``columns`` renames the data's columns first (its name -> the expected name)."""
    unknown = [name for name in columns or {} if name not in interactions.columns]
    if unknown:
        raise ValueError(
            f"fix the column mapping: {source} has no column {', '.join(map(repr, unknown))} "
            f"(its columns: {list(interactions.columns)})"
        )
    interactions = interactions.rename(columns=columns or {})
    missing = [column for column in INTERACTION_COLUMNS if column not in interactions.columns]
    if missing:
        example = ",".join(f"YOURS={column}" for column in missing)
        raise ValueError(
            f"name the columns of {source} session_id, item_id, category and timestamp, or map"
            f" yours with --columns {example} (columns={{'yours': {missing[0]!r}, ...}}): it has no"
            f" column {', '.join(map(repr, missing))}; its columns: {list(interactions.columns)}"
        )
    converted = {}
    for column in INTERACTION_COLUMNS:
        values = interactions[column]
        if column == "timestamp" and pd.api.types.is_datetime64_any_dtype(values):
            # Seconds since the epoch, whatever the column's time unit and zone.
            values = (values - pd.Timestamp(0, tz=values.dt.tz)) // pd.Timedelta(seconds=1)
        if (
            pd.api.types.is_float_dtype(values)
            and values.notna().all()
            and (values == np.floor(values)).all()
        ):
            values = values.astype(np.int64)  # whole numbers stored as floats
        if not pd.api.types.is_integer_dtype(values):
            first = f" (first value {values.iloc[0]!r})" if len(values) else ""
            raise ValueError(
                f"{source}: column {column!r} must hold integers, got dtype {values.dtype}{first}."
                " Map the values to integer ids and drop or fill missing values before using the"
                " file"
            )
        converted[column] = values.astype(np.int64)
    return interactions.assign(**converted)


def split_by_time(
    interactions: pd.DataFrame, *, held_out_fraction: float = 0.1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split into (train, held-out) so the held-out sessions are the latest ones.

    Sessions stay whole; they are ordered by their first click, and the last
    ``held_out_fraction`` of them are held out, as a model trained on the past is later asked
    about the future.
    """
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(
            f"held_out_fraction must be between 0 and 1 (exclusive), got {held_out_fraction!r}"
        )
    first_click = interactions.groupby("session_id")["timestamp"].min()
    # Ties in the first click are broken by session id so the split does not depend on row order.
    ordered = first_click.reset_index().sort_values(["timestamp", "session_id"], kind="stable")
    n_held_out = round(len(ordered) * held_out_fraction)
    if n_held_out == 0 or n_held_out == len(ordered):
        raise ValueError(
            f"held_out_fraction={held_out_fraction!r} of {len(ordered)} sessions leaves one side "
            "of the split empty; use more sessions or another fraction"
        )
    held_out_sessions = ordered["session_id"].iloc[len(ordered) - n_held_out :]
    is_held_out = interactions["session_id"].isin(held_out_sessions)
    return (
        interactions[~is_held_out].reset_index(drop=True),
        interactions[is_held_out].reset_index(drop=True),
    )


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its suffix {suffix!r}; "
        "use a file name ending in .parquet or .csv"
    )
