"""The benchmark's chart: this project against Merlin Systems, with the Triton floor and the
in-process limit as reference lines, and the ratio between the two systems written on it.

    python -m benchmarks.chart [benchmarks/results/latest.json]

redraws ``latest.png`` beside the results file from its measurements, without measuring again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.results import FLOOR, IN_PROCESS, MERLIN, PROJECT, Measurement

#: what is compared: gRPC, each system through the client its users call
PROTOCOL = "grpc"
PROJECT_COLOUR, MERLIN_COLOUR = "#1f6fb4", "#9a9a9a"


def draw(path: Path, measurements: list[Measurement]) -> None:
    """Two panels, p50 latency and sessions/s.

    Each has one group of two bars per (sessions, clients) setting.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {}
    for m in measurements:  # the first client path of each system: the one its users call
        by_key.setdefault((m.system, m.protocol, m.sessions, m.concurrency), m)
    settings = sorted({(m.sessions, m.concurrency) for m in measurements if m.system == PROJECT})
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = (
        (
            axes[0],
            "p50_ms",
            "p50 latency per request, ms (log; lower is better)",
            "{:.1f} ms",
            lambda ours, theirs: theirs / ours,
        ),
        (
            axes[1],
            "sessions_per_s",
            "sessions answered per second (log; higher is better)",
            "{:,.0f}/s",
            lambda ours, theirs: ours / theirs,
        ),
    )
    for axis, field, title, number, advantage in panels:
        shown = []
        for index, setting in enumerate(settings):
            ours = by_key.get((PROJECT, PROTOCOL, *setting))
            theirs = by_key.get((MERLIN, PROTOCOL, *setting))
            for offset, measured, colour in (
                (-0.19, ours, PROJECT_COLOUR),
                (0.19, theirs, MERLIN_COLOUR),
            ):
                if measured is None:
                    continue
                value = getattr(measured, field)
                shown.append(value)
                axis.bar(index + offset, value, 0.36, color=colour)
                axis.annotate(
                    number.format(value),
                    (index + offset, value),
                    ha="center",
                    va="bottom",
                    fontsize=7.5,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
            for system, style in ((IN_PROCESS, "-"), (FLOOR, ":")):
                reference = by_key.get(
                    (system, "in-process" if system == IN_PROCESS else PROTOCOL, *setting)
                )
                if reference is not None:
                    value = getattr(reference, field)
                    shown.append(value)
                    axis.hlines(
                        value,
                        index - 0.45,
                        index + 0.45,
                        colors="black",
                        linestyles=style,
                        linewidth=1.2,
                    )
            if ours is not None and theirs is not None:
                ratio = advantage(getattr(ours, field), getattr(theirs, field))
                axis.text(
                    index,
                    1.0,
                    f"{ratio:.1f}x",
                    transform=axis.get_xaxis_transform(),
                    ha="center",
                    va="bottom",
                    fontsize=11,
                    fontweight="bold",
                    color=PROJECT_COLOUR,
                )
        axis.set_yscale("log")
        axis.set_ylim(min(shown) / 1.6, max(shown) * 1.6)
        axis.set_title(title, fontsize=10, pad=22)
        axis.set_xticks(range(len(settings)))
        axis.set_xticklabels(
            [f"{s} session{'s' * (s > 1)}/request\n{c} client{'s' * (c > 1)}" for s, c in settings],
            fontsize=8.5,
        )
        axis.grid(axis="y", which="major", alpha=0.3)
        axis.spines[["top", "right"]].set_visible(False)
    handles = [
        matplotlib.patches.Patch(color=PROJECT_COLOUR, label="merlin_torch_serving (Client, gRPC)"),
        matplotlib.patches.Patch(
            color=MERLIN_COLOUR, label="Merlin Systems 23.08 (its client, gRPC)"
        ),
        matplotlib.lines.Line2D(
            [], [], color="black", linestyle="-", label="in-process limit (Ensemble.transform)"
        ),
        matplotlib.lines.Line2D(
            [], [], color="black", linestyle=":", label="Triton floor (no-op ensemble)"
        ),
    ]
    figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=8.5, frameon=False)
    figure.suptitle(
        "Same workflow and Transformers4Rec model, 2 CPU cores: bold = times better than Merlin"
        " Systems",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.07, 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def redraw(results: Path) -> Path:
    """Draw ``<stem>.png`` beside a results file (``latest.json``) from its measurements."""
    document = json.loads(results.read_text())
    measurements = [Measurement(**record) for record in document["measurements"]]
    path = results.with_suffix(".png")
    draw(path, measurements)
    return path


if __name__ == "__main__":
    default = Path(__file__).resolve().parent / "results" / "latest.json"
    print(redraw(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
