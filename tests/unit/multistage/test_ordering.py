"""TopKCandidates and SoftmaxSampling: each session's candidates ordered by the ranker's scores back
into one row per session, short sessions answered with what they have; the sample reproducible for
a seed, the same for a session alone or among others, and drawn by the softmax."""

import numpy as np
import pytest
from merlin.dag import ColumnSelector
from merlin.table import TensorTable

from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage import SoftmaxSampling, TopKCandidates


def table(ids_per_session, scores, sessions=None):
    lengths = [len(ids) for ids in ids_per_session]
    return TensorTable(
        {
            "score": np.asarray(scores, dtype=np.float32),
            "candidate_ids": (
                np.asarray([i for ids in ids_per_session for i in ids], dtype=np.int64),
                np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
            ),
            "session_id": np.asarray(sessions or range(len(lengths)), dtype=np.int64),
        }
    )


def order(op, data):
    """The operator on one row per candidate (scores) and one per session (candidates, keys), as
    the plan routes them (the ensemble's request has one row count)."""
    names = ["score", "candidate_ids"] + (["session_id"] if op.key_column else [])
    return op.transform(ColumnSelector(names), data)


def test_top_k_per_session_with_short_and_empty_sessions_answered():
    data = table([[5, 6, 7], [], [8]], [0.1, 0.9, 0.5, 0.3])

    with metrics.collecting() as counted:
        answer = order(TopKCandidates(2, "candidate_ids"), data)

    np.testing.assert_array_equal(answer["item_ids"].values, [[6, 7], [-1, -1], [8, -1]])
    np.testing.assert_array_equal(answer["item_count"].values, [2, 0, 1])
    assert answer["item_scores"].values[2, 1] == -np.inf
    assert counted.totals[(metrics.SHORT_ANSWERS, ())] == 2
    assert counted.totals[(metrics.EMPTY_ANSWERS, ())] == 1


def test_ties_keep_the_retrieval_order_and_nan_scores_go_last():
    answer = order(TopKCandidates(3, "candidate_ids"), table([[4, 5, 6]], [np.nan, 1.0, 1.0]))

    np.testing.assert_array_equal(answer["item_ids"].values, [[5, 6, 4]])


def sampler(**kwargs):
    return SoftmaxSampling(3, "candidate_ids", session_key="session_id", **kwargs)


def test_a_sample_is_the_same_for_a_seed_and_for_a_session_alone_or_among_others():
    alone = table([[1, 2, 3, 4, 5]], [0.5, 0.4, 0.3, 0.2, 0.1], sessions=[77])
    among = table([[9, 8], [1, 2, 3, 4, 5]], [1, 2, 0.5, 0.4, 0.3, 0.2, 0.1], sessions=[5, 77])

    first = order(sampler(seed=3), alone)["item_ids"].values
    again = order(sampler(seed=3), alone)["item_ids"].values
    in_company = order(sampler(seed=3), among)["item_ids"].values

    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(in_company[1], first[0])


def test_the_first_draw_follows_the_softmax_of_the_scores_over_the_temperature():
    scores = np.log(np.array([0.6, 0.3, 0.1]))  # softmax gives back 0.6, 0.3, 0.1
    sessions = list(range(4000))
    data = table([[1, 2, 3]] * len(sessions), np.tile(scores, len(sessions)), sessions)

    first = order(sampler(temperature=1.0, seed=11), data)["item_ids"].values[:, 0]

    shares = [np.mean(first == item) for item in (1, 2, 3)]
    np.testing.assert_allclose(shares, [0.6, 0.3, 0.1], atol=0.03)


def test_a_low_temperature_samples_the_top_k():
    data = table([[1, 2, 3, 4]], [0.1, 0.4, 0.3, 0.2])

    sampled = order(sampler(temperature=1e-4), data)["item_ids"].values

    np.testing.assert_array_equal(sampled, [[2, 3, 4]])


def test_the_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature must be above 0"):
        sampler(temperature=0)
