"""What a read-out finds, as data: each group's metrics with their intervals (overall, per
variant, per branch), each variant's difference from the control, and which variant is better.
The read-out computes it (``readout``); the table and the chart draw it (``report``, ``chart``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from merlin_torch_serving.evaluation import intervals
from merlin_torch_serving.evaluation.intervals import Estimate


@dataclass(frozen=True)
class GroupReadout:
    """The metrics of one group of answers: ``kind`` "overall", "variant" or "branch"."""

    kind: str
    name: str
    answers: int
    sessions: int
    #: answers followed by a click within the window, those the metrics judge
    judged: int
    metrics: dict[str, Estimate]
    coverage: dict[int, float]
    #: per metric, its ratio over sessions (for differences)
    ratios: dict[str, intervals.Ratio]

    @property
    def label(self) -> str:
        return self.kind if self.kind == "overall" else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Comparison:
    """A variant's difference from the control on one metric, with its 95 % interval."""

    variant: str
    control: str
    metric: str
    difference: Estimate

    @property
    def verdict(self) -> str:
        if not self.difference.excludes_zero():
            return "no difference"
        return "better" if self.difference.value > 0 else "worse"


@dataclass(frozen=True)
class Findings:
    """The groups' metrics and the variants' differences from the control, for ``ks`` (the list
    lengths judged) and clicks within ``window`` after each answer."""

    groups: list[GroupReadout]
    comparisons: list[Comparison]
    control: str | None
    catalog_size: int
    ks: tuple[int, ...]
    window: pd.Timedelta

    @property
    def primary_metric(self) -> str:
        """What names the better variant: the hit rate at the largest k."""
        return f"hit_rate@{max(self.ks)}"

    def group(self, kind: str, name: str = "") -> GroupReadout:
        return next(g for g in self.groups if g.kind == kind and g.name == name)

    def better_variant(self, metric: str | None = None) -> str | None:
        """The variant better than each other one on ``metric`` (the primary one by default):
        every difference's 95 % interval above zero. None when no variant is."""
        metric = metric or self.primary_metric
        variants = [g for g in self.groups if g.kind == "variant"]
        for best in variants:
            others = [g for g in variants if g is not best]
            if others and all(
                intervals.difference(best.ratios[metric], other.ratios[metric]).low > 0
                for other in others
            ):
                return best.name
        return None


def metric_names(ks: Sequence[int]) -> list[str]:
    """The metrics judged at the list lengths ``ks``, in the order tables show them."""
    return [f"hit_rate@{k}" for k in ks] + [f"recall@{k}" for k in ks] + ["mrr"]
