"""Experiments: sessions split between variants by weight, each session always in the same one.

A session's variant depends on its id and the experiment's salt only: its bucket is a number in
[0, 1), the 8-byte BLAKE2b digest (``hashlib.blake2b(data, digest_size=8)``, BLAKE2b-64: not the
first 8 bytes of the default 64-byte digest) of salt + NUL + str(session id), UTF-8, read
big-endian over 2**64, and the weights, in the variants' order, cut [0, 1) into one interval per
variant. The same session gets the same variant in every request, process and server, and anyone
(an analysis job reading the logs) can compute it again. Changing the weights moves only the
sessions whose bucket lies between the old and the new cuts; a new salt draws the split anew.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


def session_buckets(keys: np.ndarray, salt: str) -> np.ndarray:
    """Each session id's bucket in [0, 1) under ``salt`` (float64, one per key)."""
    prefix = salt.encode() + b"\x00"
    buckets = np.empty(len(keys), dtype=np.float64)
    for position, key in enumerate(np.asarray(keys).tolist()):
        digest = hashlib.blake2b(prefix + str(key).encode(), digest_size=8).digest()
        buckets[position] = int.from_bytes(digest, "big") / 2.0**64
    return buckets


def checked_weights(experiment: str, weights: Mapping[str, float], variants=None) -> dict:
    """``weights`` as floats, once they are valid: finite, not negative, not all zero, of a
    finite sum, and (when ``variants`` is given) one for each of those variants and no other."""
    weights = dict(weights)
    if variants is not None:
        missing = [v for v in variants if v not in weights]
        unknown = [v for v in weights if v not in variants]
        if missing or unknown:
            raise ValueError(
                f"experiment {experiment!r} has the variants {list(variants)}; give a weight for"
                f" each of them and no other (missing: {missing}, unknown: {unknown})"
            )
        weights = {variant: weights[variant] for variant in variants}
    if not weights:
        raise ValueError(f"experiment {experiment!r} needs at least one variant")
    checked = {}
    for variant, weight in weights.items():
        if not variant:
            raise ValueError(f"experiment {experiment!r}: variant names are non-empty strings")
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"experiment {experiment!r}: the weight of variant {variant!r} must be a finite"
                f" number of 0 or more, got {weight!r}"
            )
        checked[variant] = value
    total = sum(checked.values())
    if total <= 0:
        raise ValueError(
            f"experiment {experiment!r}: the weights are all 0; give at least one variant a"
            " positive weight"
        )
    if not math.isfinite(total):
        largest = max(checked, key=checked.__getitem__)
        raise ValueError(
            f"experiment {experiment!r}: the weights sum to more than a float holds (variant"
            f" {largest!r} weighs {checked[largest]!r}), which would send every session to one"
            " variant; only their ratios count, so give smaller ones (e.g. each divided by"
            f" {checked[largest]!r})"
        )
    return checked


@dataclass(frozen=True)
class Experiment:
    """Sessions split between ``weights``' variants (branch names of a route) in proportion to
    their weights (they need not sum to 1; a weight of 0 gives a variant no session).

    Parameters
    ----------
    name
        Names the experiment in errors, in the answer's variant column and in the served step's
        config (where its weights can change without a new export).
    weights
        Variant (a branch of the route) -> weight, in the order that cuts the buckets.
    salt
        Mixed into every session's hash; by default the experiment's name. A new salt assigns
        sessions anew (a new experiment), the same salt keeps every session where it was.
    key
        The column holding the session id (the workflow's Groupby key).
    """

    name: str
    weights: Mapping[str, float]
    salt: str | None = None
    key: str = "session_id"

    def __post_init__(self):
        if not self.name:
            raise ValueError(f"an experiment needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "weights", checked_weights(self.name, self.weights))

    @property
    def variants(self) -> list[str]:
        return list(self.weights)

    @property
    def salt_or_name(self) -> str:
        return self.name if self.salt is None else self.salt

    def with_weights(self, weights: Mapping[str, float]) -> Experiment:
        """The same experiment (variants, salt) with new weights, one per variant."""
        checked = checked_weights(self.name, weights, self.variants)
        return Experiment(self.name, checked, self.salt, self.key)

    def assign(self, keys: np.ndarray) -> np.ndarray:
        """Each session's variant, as an index into ``variants`` (int64, one per key)."""
        weights = np.array(list(self.weights.values()), dtype=np.float64)
        cuts = np.cumsum(weights) / weights.sum()
        # the last variant with weight takes the rest of [0, 1), whatever the rounding of the sum
        cuts[np.flatnonzero(weights > 0)[-1] :] = 1.0
        chosen = np.searchsorted(cuts, session_buckets(keys, self.salt_or_name), side="right")
        return chosen.astype(np.int64)

    def config(self) -> dict:
        return {"name": self.name, "salt": self.salt, "key": self.key}
