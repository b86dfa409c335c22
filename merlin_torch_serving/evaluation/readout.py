"""The read-out of an answer log: per variant, per branch and overall, the hit rate and recall of
the next click at k, the mean reciprocal rank and the catalogue's coverage, with 95 % intervals,
and each variant's difference from the control variant with its interval.

Measured over the answers followed by a click within the window (``join``):

- ``hit_rate@k``: the share of answers whose next click was among the first k items shown;
- ``recall@k``: per answer, the share of the distinct items clicked within the window that the
  first k items held, averaged;
- ``mrr``: the mean of 1 / the position of the next click's item in the list (0 when not shown);
- ``coverage@k``: the distinct items among the first k of every answer (followed by a click or
  not) over the catalogue's size. It grows with the number of answers, so it has no interval and
  compares variants fairly only at equal traffic.

A variant is a session's variant in the route's experiment (recorded also when a rule or the
fallback answered it: the comparison is by assignment); a branch is the one that answered.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from merlin_torch_serving.evaluation import intervals
from merlin_torch_serving.evaluation.intervals import Estimate
from merlin_torch_serving.evaluation.join import Joined


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
class Readout:
    """What ``evaluate_answers`` found; ``table()``, ``chart(path)``, ``impressions()``."""

    groups: list[GroupReadout]
    comparisons: list[Comparison]
    control: str | None
    catalog_size: int
    joined: Joined

    @property
    def ks(self) -> tuple[int, ...]:
        return self.joined.ks

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

    def impressions(self) -> pd.DataFrame:
        """Every item shown, with whether the session clicked it within the window after."""
        from merlin_torch_serving.evaluation.impressions import impressions

        return impressions(self.joined)

    def table(self) -> str:
        from merlin_torch_serving.evaluation.report import table

        return table(self)

    def chart(self, path: str | os.PathLike) -> Path:
        from merlin_torch_serving.evaluation.chart import chart

        return chart(self, Path(path))


def metric_names(ks: Sequence[int]) -> list[str]:
    return [f"hit_rate@{k}" for k in ks] + [f"recall@{k}" for k in ks] + ["mrr"]


def read_out(
    joined: Joined, *, catalog: int | Iterable | None = None, control: str | None = None
) -> Readout:
    """The read-out of ``joined`` (see the module's docstring); ``catalog``: its size or its items
    (by default the items shown or clicked, ``joined.items``); ``control``: the variant the others
    are compared with (by default the one with the most sessions)."""
    answers = joined.answers
    catalog_size = _catalog_size(catalog, joined.items)
    groups = [_group(joined, "overall", "", np.ones(len(answers), bool), catalog_size)]
    for kind in ("variant", "branch"):
        for name in sorted(answers[kind].dropna().unique()):
            rows = (answers[kind] == name).to_numpy()
            groups.append(_group(joined, kind, str(name), rows, catalog_size))
    variants = [g for g in groups if g.kind == "variant"]
    if control is None and variants:
        control = max(variants, key=lambda g: (g.sessions, [-ord(c) for c in g.name])).name
    comparisons = []
    if variants and control not in {g.name for g in variants}:
        from merlin_torch_serving.exceptions import AnswerLogError

        raise AnswerLogError(
            f"the log has no variant {control!r} to compare with; pick one of"
            f" {', '.join(repr(g.name) for g in variants)}"
        )
    for treated in variants:
        if treated.name == control:
            continue
        base = next(g for g in variants if g.name == control)
        for metric in metric_names(joined.ks):
            comparisons.append(
                Comparison(
                    treated.name,
                    str(control),
                    metric,
                    intervals.difference(treated.ratios[metric], base.ratios[metric]),
                )
            )
    return Readout(groups, comparisons, control if variants else None, catalog_size, joined)


def _group(
    joined: Joined, kind: str, name: str, rows: np.ndarray, catalog_size: int
) -> GroupReadout:
    answers = joined.answers[rows]
    judged = answers[answers["clicked"].to_numpy()]
    sessions = judged["session_id"].to_numpy()
    ranks = judged["next_rank"].to_numpy()
    later = np.maximum(judged["later_items"].to_numpy(), 1)
    values = {}
    for k in joined.ks:
        values[f"hit_rate@{k}"] = ((ranks >= 1) & (ranks <= k)).astype(np.float64)
        values[f"recall@{k}"] = judged[f"hits@{k}"].to_numpy() / later
    values["mrr"] = np.where(ranks > 0, 1.0 / np.maximum(ranks, 1), 0.0)
    ratios = {metric: intervals.per_session(sessions, v) for metric, v in values.items()}
    shown = joined.shown[np.isin(joined.shown["answer"], np.flatnonzero(rows))]
    coverage = {
        k: shown.loc[shown["position"] <= k, "item_id"].nunique() / max(catalog_size, 1)
        for k in joined.ks
    }
    return GroupReadout(
        kind,
        name,
        answers=len(answers),
        sessions=answers["session_id"].nunique(),
        judged=len(judged),
        metrics={metric: ratio.estimate() for metric, ratio in ratios.items()},
        coverage=coverage,
        ratios=ratios,
    )


def _catalog_size(catalog, items: int) -> int:
    if catalog is None:
        return items
    if isinstance(catalog, int | np.integer):
        return int(catalog)
    return len(set(catalog))
