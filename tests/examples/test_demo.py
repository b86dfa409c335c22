"""`./run demo` as a user runs it, on a click log of their own with other column names and ids
stored as floats: it prints its steps, the training's progress and the answer, nothing else."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.session_based import data

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RENAMED = {
    "session_id": "user_session",
    "item_id": "product_id",
    "category": "category_code",
    "timestamp": "event_time",
}


def test_the_demo_maps_the_columns_of_a_foreign_click_log_and_prints_only_its_steps_and_the_answer(
    tmp_path,
):
    clicks = data.generate_interactions(n_sessions=300, seed=3)
    foreign = clicks.astype({"item_id": "float64"}).rename(
        columns=RENAMED
    )  # as a CSV export or a join leaves them
    foreign.to_csv(tmp_path / "clicks.csv", index=False)
    mapping = ",".join(f"{theirs}={ours}" for ours, theirs in RENAMED.items())
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "session_based" / "demo.py"),
            "--interactions",
            str(tmp_path / "clicks.csv"),
            "--columns",
            mapping,
            "--epochs",
            "1",
            "--show",
            "2",
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # stderr, a pipe here as in a log: the training's progress only, one line per epoch (the
    # bar, which redraws itself with carriage returns, is for a terminal)
    assert "\r" not in result.stderr
    assert re.fullmatch(
        r"training: epoch 1/1, \d+ batches in [\d.]+ s, mean loss [\d.]+\n", result.stderr
    ), result.stderr
    steps = re.findall(r"^== (\d)/6 ", result.stdout, flags=re.M)
    assert steps == ["1", "2", "3", "4", "5", "6"]
    assert not re.search(r"warn|error|traceback|experimental", result.stdout, flags=re.I), (
        result.stdout
    )
    answers = re.findall(r"^  top-10 items:  \[(\d+, ){9}\d+\]$", result.stdout, flags=re.M)
    assert len(answers) == 2


def test_the_demo_names_every_column_a_click_log_lacks_and_how_to_map_them(tmp_path):
    data.generate_interactions(n_sessions=20, seed=4).rename(columns=RENAMED).to_csv(
        tmp_path / "clicks.csv", index=False
    )
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "session_based" / "demo.py"),
            "--interactions",
            str(tmp_path / "clicks.csv"),
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: name the columns of interactions file "), result.stderr
    assert (
        "or map yours with --columns YOURS=session_id,YOURS=item_id,YOURS=category,YOURS=timestamp"
        in result.stderr
    )
