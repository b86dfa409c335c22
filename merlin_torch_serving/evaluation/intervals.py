"""Confidence intervals for metrics averaged over answers when sessions, not answers, are what an
experiment assigns: the answers of one session are not independent draws, so each metric is a
ratio of per-session sums (sum of the metric over sum of answers), and its variance comes from the
delta method over sessions (Deng, Knoblich and Lu, "Applying the Delta Method in Metric
Analytics", KDD 2018). Sessions of two variants are disjoint, so a difference's variance is the
sum of the two."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the two-sided 95 % normal quantile
Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A metric's value with its 95 % interval (NaN bounds when it cannot be told: fewer than two
    sessions)."""

    value: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class Ratio:
    """Sum of ``values`` over sum of ``counts``, both summed per session first (``sums`` of the
    metric, ``counts`` of answers, one entry per session)."""

    sums: np.ndarray
    counts: np.ndarray

    @property
    def value(self) -> float:
        total = self.counts.sum()
        return float(self.sums.sum() / total) if total else math.nan

    @property
    def variance(self) -> float:
        sessions = len(self.counts)
        if sessions < 2 or not self.counts.sum():
            return math.nan
        ratio, mean_count = self.value, self.counts.mean()
        covariance = np.cov(np.vstack([self.sums, self.counts]), ddof=1)
        spread = covariance[0, 0] - 2 * ratio * covariance[0, 1] + ratio**2 * covariance[1, 1]
        return float(max(spread, 0.0) / (sessions * mean_count**2))

    def estimate(self) -> Estimate:
        half = Z_95 * math.sqrt(self.variance) if not math.isnan(self.variance) else math.nan
        return Estimate(self.value, self.value - half, self.value + half)


def difference(treatment: Ratio, control: Ratio) -> Estimate:
    """``treatment`` minus ``control``, with its 95 % interval (disjoint sessions)."""
    value = treatment.value - control.value
    half = Z_95 * math.sqrt(treatment.variance + control.variance)
    return Estimate(value, value - half, value + half)


def per_session(sessions: np.ndarray, values: np.ndarray) -> Ratio:
    """The ratio of ``values`` (one per answer) averaged over answers, summed per session."""
    _, index = np.unique(sessions, return_inverse=True)
    sums = np.bincount(index, weights=values.astype(np.float64))
    counts = np.bincount(index).astype(np.float64)
    return Ratio(sums, counts)
