"""The read-out as a table (Markdown, so that it reads in a terminal and renders in docs)."""

from __future__ import annotations

import math

from merlin_torch_serving.evaluation.findings import Findings, metric_names
from merlin_torch_serving.evaluation.intervals import Estimate


def table(readout: Findings) -> str:
    minutes = readout.window.total_seconds() / 60
    overall = readout.group("overall")
    metrics = metric_names(readout.ks)
    lines = [
        f"{overall.answers:,} answers to {overall.sessions:,} sessions, {overall.judged:,} followed"
        f" by a click within {minutes:g} min (those are judged); catalogue of"
        f" {readout.catalog_size:,} items. 95 % intervals, by session.",
        "",
        "| group | answers | sessions | judged | "
        + " | ".join(metrics)
        + " | "
        + " | ".join(f"coverage@{k}" for k in readout.ks)
        + " |",
        "| --- " * 4 + "| ---: " * (len(metrics) + len(readout.ks)) + "|",
    ]
    for group in readout.groups:
        lines.append(
            f"| {group.label} | {group.answers:,} | {group.sessions:,} | {group.judged:,} | "
            + " | ".join(_estimate(group.metrics[m]) for m in metrics)
            + " | "
            + " | ".join(f"{group.coverage[k]:.3f}" for k in readout.ks)
            + " |"
        )
    if readout.comparisons:
        lines += [
            "",
            f"Differences from the control variant {readout.control!r}:",
            "",
            "| variant | metric | difference | 95 % interval | verdict |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for c in readout.comparisons:
            d = c.difference
            lines.append(
                f"| {c.variant} | {c.metric} | {d.value:+.4f} | [{d.low:+.4f}, {d.high:+.4f}] |"
                f" {c.verdict} |"
            )
        better = readout.better_variant()
        lines += [
            "",
            f"Better variant on {readout.primary_metric}: "
            + (better if better else "none (no interval excludes zero)"),
        ]
    return "\n".join(lines) + "\n"


def _estimate(estimate: Estimate) -> str:
    if math.isnan(estimate.low):
        return f"{estimate.value:.4f}"
    return f"{estimate.value:.4f} ±{estimate.half_width:.4f}"
