"""Experiments: a stable hash puts each session in a bucket, and the weights cut the buckets."""

import hashlib

import numpy as np
import pytest

from merlin_torch_serving.routing import Experiment, session_buckets
from tests.examples.test_readme import python_blocks, section

SESSIONS = np.arange(500_000, 510_000)  # 10,000 distinct session ids


def test_a_session_bucket_is_the_documented_blake2b_of_salt_and_id():
    digest = hashlib.blake2b(b"salt\x00123456", digest_size=8).digest()
    expected = int.from_bytes(digest, "big") / 2**64
    assert session_buckets(np.array([123456]), "salt")[0] == expected
    assert session_buckets(np.array(["123456"], dtype=object), "salt")[0] == expected


def test_the_routing_guides_recipe_computes_every_sessions_variant_as_the_route_does():
    [recipe] = python_blocks(section("A session's variant, computed again"))
    assert "merlin_torch_serving" not in recipe  # computed without the library
    namespace: dict = {}
    exec(recipe, namespace)
    variant = namespace["variant"]
    sessions = np.arange(700_000, 704_000)
    for salt, weights in (
        ("model-test", {"current": 0.7, "candidate": 0.2, "baseline": 0.1}),
        ("second run", {"a": 3, "b": 0, "c": 1}),
    ):
        experiment = Experiment("model-test", weights, salt=salt)
        assigned = [experiment.variants[i] for i in experiment.assign(sessions)]
        assert [variant(int(s), salt, weights) for s in sessions] == assigned
        assert [variant(str(s), salt, weights) for s in sessions] == assigned  # text ids alike

    # and the guide warns rightly: the first 8 bytes of the 64-byte digest are other buckets
    def truncated(session_id):
        digest = hashlib.blake2b(b"salt\x00" + str(session_id).encode()).digest()[:8]
        return int.from_bytes(digest, "big") / 2**64

    buckets = session_buckets(sessions, "salt")
    assert np.mean([truncated(s) == b for s, b in zip(sessions, buckets, strict=True)]) == 0


def test_ten_thousand_sessions_split_80_20_within_two_points_and_keep_their_variant():
    experiment = Experiment("model-test", {"current": 0.8, "candidate": 0.2})
    first = experiment.assign(SESSIONS)
    share = np.bincount(first, minlength=2) / len(SESSIONS)
    assert abs(share[0] - 0.8) <= 0.02, share
    assert abs(share[1] - 0.2) <= 0.02, share
    # again, in another order and in small requests: every session keeps its variant
    order = np.random.default_rng(0).permutation(len(SESSIONS))
    again = np.empty_like(first)
    for part in np.array_split(order, 97):
        again[part] = experiment.assign(SESSIONS[part])
    np.testing.assert_array_equal(again, first)
    # and in a copy of the experiment (another process, another server)
    copy = Experiment("model-test", {"current": 0.8, "candidate": 0.2})
    np.testing.assert_array_equal(copy.assign(SESSIONS), first)


def test_new_weights_move_only_the_sessions_between_the_old_and_new_cut():
    before = Experiment("e", {"a": 0.5, "b": 0.5})
    after = before.with_weights({"a": 0.2, "b": 0.8})
    buckets = session_buckets(SESSIONS, "e")
    moved = before.assign(SESSIONS) != after.assign(SESSIONS)
    np.testing.assert_array_equal(moved, (buckets >= 0.2) & (buckets < 0.5))
    assert after.salt_or_name == "e"
    assert after.variants == ["a", "b"]


def test_weights_need_not_sum_to_one_and_a_variant_of_weight_zero_gets_no_session():
    assigned = Experiment("e", {"a": 3, "b": 1, "c": 0}).assign(SESSIONS)
    assert not (assigned == 2).any()
    assert abs((assigned == 0).mean() - 0.75) <= 0.02
    assert set(Experiment("e", {"a": 0, "b": 2}).assign(SESSIONS)) == {1}


def test_another_salt_draws_the_split_anew():
    a = Experiment("e", {"a": 0.5, "b": 0.5}).assign(SESSIONS)
    b = Experiment("e", {"a": 0.5, "b": 0.5}, salt="second run").assign(SESSIONS)
    assert 0.4 < (a != b).mean() < 0.6


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"a": -1, "b": 1}, r"experiment 'e': the weight of variant 'a' must be a finite number"),
        ({"a": float("nan")}, r"the weight of variant 'a' must be a finite number of 0 or more"),
        ({"a": 0, "b": 0}, r"experiment 'e': the weights are all 0"),
        ({}, r"experiment 'e' needs at least one variant"),
        (
            {"a": 1e308, "b": 1e308},
            r"experiment 'e': the weights sum to more than a float holds \(variant 'a' weighs"
            r" 1e\+308\).*only their ratios count",
        ),
    ],
)
def test_weights_that_cannot_split_sessions_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        Experiment("e", weights)


def test_new_weights_name_every_variant_and_no_other():
    experiment = Experiment("e", {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"missing: \['b'\], unknown: \['c'\]"):
        experiment.with_weights({"a": 1, "c": 1})
