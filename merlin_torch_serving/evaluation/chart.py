"""The read-out as a chart (PNG): each variant's metrics with their 95 % intervals, and each
variant's difference from the control with its interval against zero."""

from __future__ import annotations

from pathlib import Path

from merlin_torch_serving.evaluation.findings import Findings, metric_names
from merlin_torch_serving.exceptions import AnswerLogError


def chart(readout: Findings, path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise AnswerLogError(
            "drawing the read-out's chart needs matplotlib; pip install"
            " 'merlin-torch-serving[evaluation]'"
        ) from error
    metrics = metric_names(readout.ks)
    groups = [g for g in readout.groups if g.kind == "variant"] or [readout.group("overall")]
    figure, (values, differences) = plt.subplots(
        1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    width = 0.8 / len(groups)
    for index, group in enumerate(groups):
        estimates = [group.metrics[m] for m in metrics]
        positions = [i + (index - (len(groups) - 1) / 2) * width for i in range(len(metrics))]
        values.bar(
            positions,
            [e.value for e in estimates],
            width,
            yerr=[[e.value - e.low for e in estimates], [e.high - e.value for e in estimates]],
            capsize=3,
            label=group.name or group.label,
        )
    values.set_xticks(range(len(metrics)), metrics, rotation=30, ha="right")
    values.set_ylabel("per answer followed by a click")
    values.set_title("metrics by variant (95 % intervals)")
    values.legend()
    comparisons = readout.comparisons
    if comparisons:
        labels = [f"{c.variant} {c.metric}" for c in comparisons]
        for row, c in enumerate(comparisons):
            d = c.difference
            color = {"better": "tab:green", "worse": "tab:red"}.get(c.verdict, "tab:gray")
            differences.errorbar(
                d.value,
                row,
                xerr=[[d.value - d.low], [d.high - d.value]],
                fmt="o",
                color=color,
                capsize=3,
            )
        differences.axvline(0, color="black", linewidth=0.8)
        differences.set_yticks(range(len(labels)), labels)
        differences.set_title(f"difference from {readout.control!r}")
    else:
        differences.axis("off")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
