"""The read-out: metrics computed as defined on a small log worked by hand, a synthetic experiment
whose better variant is found with an interval that excludes zero, an A/A split that finds no
difference, the impressions dataset, hashed session ids, and the errors that say what to fix."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import AnswerLogError
from merlin_torch_serving.answer_log.records import session_hash
from merlin_torch_serving.evaluation import ClickColumns, evaluate_answers
from tests.answer_logs import answer, clicks, synthetic_experiment


def test_metrics_follow_their_definitions_on_a_log_worked_by_hand():
    log = pd.DataFrame(
        [
            answer(1, 0, [10, 11, 12, 13]),  # next click 12 (rank 3), then 10: both shown
            answer(1, 100, [20, 21, 22, 23]),  # next click 99: not shown; 21 later
            answer(2, 0, [10, 30, 31, 32]),  # no click within the window: not judged
            answer(3, 0, [40, 41, 42, 43]),  # next click 40 (rank 1)
        ]
    )
    readout = evaluate_answers(
        log,
        clicks((1, 12, 5), (1, 10, 6), (1, 99, 105), (1, 21, 106), (2, 10, 4000), (3, 40, 1)),
        window="1min",
        ks=(1, 3),
        catalog=100,
    )
    overall = readout.group("overall")
    assert (overall.answers, overall.sessions, overall.judged) == (4, 3, 3)
    m = {name: e.value for name, e in overall.metrics.items()}
    assert m["hit_rate@1"] == pytest.approx(1 / 3)
    assert m["hit_rate@3"] == pytest.approx(2 / 3)
    # of the items clicked within a minute: answer 1's first 3 hold both of {12, 10}, answer 2's
    # one of {99, 21}, answer 4's its one; their first items: 10 of two, none, 40
    assert m["recall@3"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert m["recall@1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert m["mrr"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    # distinct items among the first 3 of all four answers (10 twice), over 100
    assert overall.coverage[3] == pytest.approx(11 / 100)
    impressions = readout.impressions()
    assert len(impressions) == 16
    clicked = impressions[impressions["clicked"]]
    assert list(zip(clicked["session_id"], clicked["item_id"], strict=True)) == [
        (1, 10),
        (1, 12),
        (1, 21),
        (3, 40),
    ]


def test_a_clearly_better_variant_is_found_with_an_interval_that_excludes_zero():
    log, followed = synthetic_experiment(
        {"current": 0.5, "candidate": 0.5}, {"current": 0.3, "candidate": 0.45}
    )
    readout = evaluate_answers(log, followed, control="current")

    assert readout.better_variant() == "candidate"
    (hit,) = [c for c in readout.comparisons if c.metric == "hit_rate@10"]
    assert hit.difference.low > 0
    assert hit.difference.value == pytest.approx(0.15, abs=0.04)
    assert hit.verdict == "better"
    table = readout.table()
    assert "Better variant on hit_rate@10: candidate" in table
    assert "| variant candidate |" in table


def test_an_a_a_split_finds_no_difference():
    log, followed = synthetic_experiment({"a": 0.5, "b": 0.5}, {"a": 0.4, "b": 0.4}, seed=1)
    readout = evaluate_answers(log, followed)

    assert readout.better_variant() is None
    assert all(not c.difference.excludes_zero() for c in readout.comparisons)
    assert "none (no interval excludes zero)" in readout.table()


def test_the_control_defaults_to_the_variant_with_the_most_sessions_and_an_unknown_one_is_refused():
    log, followed = synthetic_experiment(
        {"current": 0.8, "candidate": 0.2}, {"current": 0.4, "candidate": 0.4}, sessions=500
    )
    assert evaluate_answers(log, followed).control == "current"
    with pytest.raises(AnswerLogError, match=r"no variant 'other'.*pick one of 'candidate'"):
        evaluate_answers(log, followed, control="other")


def test_hashed_session_ids_join_clicks_hashed_with_the_same_key():
    log = pd.DataFrame([answer(7, 0, [1, 2, 3])])
    log["session_id"] = session_hash(np.array([7]), "k")
    readout = evaluate_answers(log, clicks((7, 2, 5)), session_id_key="k")
    assert readout.group("overall").metrics["hit_rate@5"].value == 1.0


def test_clicks_without_the_named_columns_say_which_and_how_to_name_them():
    frame = pd.DataFrame({"user_session": [1], "product": [2], "ts": [3]})
    with pytest.raises(AnswerLogError, match=r"no column 'session_id'.*--session-column"):
        evaluate_answers(pd.DataFrame([answer(1, 0, [2])]), frame)
    columns = ClickColumns(session="user_session", item="product", time="ts")
    readout = evaluate_answers(pd.DataFrame([answer(1, 0, [2])]), frame, columns=columns)
    assert readout.group("overall").judged == 0  # its click came before the answer


@pytest.mark.parametrize("name", ["clicks.parquet", "clicks.csv"])
def test_a_broken_clicks_file_is_named(tmp_path, name):
    broken = tmp_path / name
    broken.write_bytes(b"PAR1 cut short" if name.endswith("parquet") else b"")
    with pytest.raises(
        AnswerLogError, match=rf"the clicks at '{re.escape(str(broken))}' cannot be read \("
    ):
        evaluate_answers(pd.DataFrame([answer(1, 0, [2])]), broken)


def test_the_chart_is_a_png(tmp_path):
    log, followed = synthetic_experiment(
        {"current": 0.5, "candidate": 0.5}, {"current": 0.3, "candidate": 0.45}, sessions=300
    )
    path = evaluate_answers(log, followed).chart(tmp_path / "readout.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
