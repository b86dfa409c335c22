"""``merlin-torch-serving evaluate``: a log folder and a clicks file in, the table printed (naming
the better variant), the chart and the impressions dataset written."""

from __future__ import annotations

import pandas as pd

from merlin_torch_serving.cli import main
from tests.answer_logs import synthetic_experiment


def test_evaluate_prints_the_table_and_writes_the_chart_and_the_impressions(tmp_path, capsys):
    log, followed = synthetic_experiment(
        {"current": 0.5, "candidate": 0.5}, {"current": 0.45, "candidate": 0.25}, sessions=1500
    )
    (tmp_path / "log").mkdir()
    log.to_parquet(tmp_path / "log" / "answers-made-up.parquet")
    followed.to_csv(tmp_path / "clicks.csv", index=False)

    code = main(
        [
            "evaluate",
            str(tmp_path / "log"),
            "--clicks",
            str(tmp_path / "clicks.csv"),
            "--window",
            "45s",  # only the click that followed each answer
            "--k",
            "10",
            "--chart",
            str(tmp_path / "readout.png"),
            "--impressions",
            str(tmp_path / "impressions.parquet"),
        ]
    )
    printed = capsys.readouterr().out

    assert code == 0
    assert "Better variant on hit_rate@10: current" in printed
    assert (tmp_path / "readout.png").read_bytes()[:4] == b"\x89PNG"
    impressions = pd.read_parquet(tmp_path / "impressions.parquet")
    assert len(impressions) == 10 * len(log)
    assert impressions["clicked"].sum() == len(followed) - (followed["item_id"] >= 1000).sum()
