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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from merlin_torch_serving.evaluation import intervals
from merlin_torch_serving.evaluation.chart import chart
from merlin_torch_serving.evaluation.findings import (
    Comparison,
    Findings,
    GroupReadout,
    metric_names,
)
from merlin_torch_serving.evaluation.impressions import impressions
from merlin_torch_serving.evaluation.join import Joined
from merlin_torch_serving.evaluation.report import table
from merlin_torch_serving.exceptions import AnswerLogError


@dataclass(frozen=True)
class Readout(Findings):
    """What ``evaluate_answers`` found (``Findings``: ``groups``, ``comparisons``,
    ``better_variant()``), with the join it was measured on: ``table()``, ``chart(path)``,
    ``impressions()``."""

    joined: Joined

    def impressions(self) -> pd.DataFrame:
        """Every item shown, with whether the session clicked it within the window after."""
        return impressions(self.joined)

    def table(self) -> str:
        """The read-out as a Markdown table, with the differences and the better variant."""
        return table(self)

    def chart(self, path: str | os.PathLike) -> Path:
        """The read-out drawn into the PNG file ``path``."""
        return chart(self, Path(path))


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
        raise AnswerLogError(
            f"the log has no variant {control!r} to compare with; pick one of"
            f" {', '.join(repr(g.name) for g in variants)}"
        )
    base = next((g for g in variants if g.name == control), None)
    for treated in variants:
        if base is None or treated is base:
            continue
        for metric in metric_names(joined.ks):
            comparisons.append(
                Comparison(
                    treated.name,
                    str(control),
                    metric,
                    intervals.difference(treated.ratios[metric], base.ratios[metric]),
                )
            )
    return Readout(
        groups,
        comparisons,
        control if variants else None,
        catalog_size,
        joined.ks,
        joined.window,
        joined,
    )


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
