"""Trending items: clicks counted per item and time bucket as they arrive (``SessionHistory``
counts them into its store), ranked over a window of buckets, optionally decayed.

Counts are integers per (bucket, item), so the store's counts equal the same counts recomputed
over the same clicks in batch (``Trending.batch_counts``), and one function ranks both
(``Trending.ranked``), so the ranking from live counts equals the batch one bit for bit. Time is
the clicks' own (their timestamp column), not the clock: the window ends at the latest bucket a
click fell in, as ``ItemPopularity.fit(window=...)`` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from merlin_torch_serving.stores.base import TrendingCounts, TrendingWindow, check_window, text_key


@dataclass(frozen=True)
class Trending:
    """How clicks are counted for trending items.

    Parameters
    ----------
    item, timestamp
        The click columns holding the item id and the time.
    bucket
        The width of a time bucket, in the timestamp's units (seconds for datetimes).
    window
        How many buckets, up to the latest, count.
    half_life
        In buckets: a click ``half_life`` buckets older than the latest weighs half as much (no
        decay when None: every click of the window weighs 1).
    name
        Names the counts in the store (graphs that count the same clicks may share them).
    """

    item: str = "item_id"
    timestamp: str = "timestamp"
    bucket: float = 60.0
    window: int = 60
    half_life: float | None = None
    name: str = "trending"

    def __post_init__(self):
        if not self.bucket > 0:
            raise ValueError(f"a trending bucket is wider than 0, got {self.bucket!r}")
        check_window(self.window)
        if self.half_life is not None and not self.half_life > 0:
            raise ValueError(f"half_life must be above 0 buckets (or None), got {self.half_life!r}")

    @property
    def store_window(self) -> TrendingWindow:
        return TrendingWindow(self.name, int(self.window))

    def buckets_of(self, timestamps) -> np.ndarray:
        """The bucket of each timestamp (int64): whole-number arithmetic for int timestamps and
        datetimes, so a bucket never depends on rounding."""
        values = np.asarray(timestamps)
        if values.dtype.kind == "M":
            nanoseconds = values.astype("datetime64[ns]").astype(np.int64)
            width = round(self.bucket * 1e9)
            return np.floor_divide(nanoseconds, width).astype(np.int64)
        if values.dtype.kind in "iu" and float(self.bucket).is_integer():
            return np.floor_divide(values.astype(np.int64), int(self.bucket))
        return np.floor(values.astype(np.float64) / float(self.bucket)).astype(np.int64)

    def batch_counts(self, clicks: pd.DataFrame) -> TrendingCounts:
        """The counts of ``clicks`` (raw rows, each click once) recomputed in one pass: what a
        store that received them holds."""
        if clicks.empty:
            return TrendingCounts(None)
        buckets = self.buckets_of(clicks[self.timestamp].to_numpy())
        latest = int(buckets.max())
        inside = buckets > latest - self.window
        frame = pd.DataFrame(
            {"bucket": buckets[inside], "item": [text_key(v) for v in clicks[self.item][inside]]}
        )
        counts: dict[int, dict[str, int]] = {}
        sizes = frame.groupby(["bucket", "item"]).size()
        for (bucket, item), n in zip(sizes.index.tolist(), sizes.tolist(), strict=True):
            counts.setdefault(int(bucket), {})[str(item)] = int(n)
        return TrendingCounts(latest, counts)

    def ranked(self, counts: TrendingCounts) -> tuple[list[str], np.ndarray]:
        """Items by weight, most first (ties by id), and their weights (float64): clicks per
        item over the window, each ``0.5 ** (age / half_life)`` with decay."""
        if counts.latest is None:
            return [], np.zeros(0)
        weights: dict[str, float] = {}
        for bucket in sorted(counts.buckets):
            age = counts.latest - bucket
            if age >= self.window or age < 0:
                continue
            weight = 1.0 if self.half_life is None else 0.5 ** (age / self.half_life)
            for item, n in sorted(counts.buckets[bucket].items()):
                weights[item] = weights.get(item, 0.0) + n * weight
        order = sorted(weights, key=lambda item: (-weights[item], len(item), item))
        return order, np.array([weights[item] for item in order], dtype=np.float64)

    def config(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Trending:
        return cls(**config)
