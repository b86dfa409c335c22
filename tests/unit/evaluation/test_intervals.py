"""The intervals are honest: over many A/A splits of sessions whose answers are correlated (each
session has a hit chance of its own), the 95 % interval of the difference holds zero about 95 %
of the time, and the interval of a ratio is what the delta method gives by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from merlin_torch_serving.evaluation import intervals


def correlated_split(rng, sessions: int = 400):
    """Per answer: its session and a 0/1 hit; sessions of 1 to 8 answers, each with its own
    chance (drawn around 0.3), split in half."""
    answers = rng.integers(1, 9, sessions)
    chance = rng.beta(3, 7, sessions)
    session = np.repeat(np.arange(sessions), answers)
    hits = (rng.random(len(session)) < chance[session]).astype(np.float64)
    half = rng.random(sessions) < 0.5
    return session, hits, half[session]


def test_the_interval_of_an_a_a_difference_holds_zero_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    held = 0
    replications = 600
    for _ in range(replications):
        session, hits, first = correlated_split(rng)
        a = intervals.per_session(session[first], hits[first])
        b = intervals.per_session(session[~first], hits[~first])
        held += not intervals.difference(a, b).excludes_zero()
    assert 0.925 <= held / replications <= 0.975


def test_a_ratio_interval_is_the_delta_method_over_sessions():
    ratio = intervals.per_session(np.array([1, 1, 2, 3, 3, 3]), np.array([1, 0, 1, 0, 0, 1.0]))
    sums, counts = np.array([1.0, 1.0, 1.0]), np.array([2.0, 1.0, 3.0])
    r = 3 / 6
    spread = (
        np.var(sums, ddof=1) - 2 * r * np.cov(sums, counts)[0, 1] + r**2 * np.var(counts, ddof=1)
    )
    half = 1.959963984540054 * math.sqrt(spread / (3 * counts.mean() ** 2))
    estimate = ratio.estimate()
    assert estimate.value == pytest.approx(0.5)
    assert (estimate.low, estimate.high) == pytest.approx((0.5 - half, 0.5 + half))


def test_one_session_has_no_interval():
    estimate = intervals.per_session(np.array([4, 4]), np.array([1.0, 0.0])).estimate()
    assert estimate.value == 0.5
    assert math.isnan(estimate.low)
    assert not estimate.excludes_zero()
