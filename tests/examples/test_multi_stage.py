"""The multi-stage example at a small size: every stage runs (a Feast feature server included), both
orders are judged on held-out sessions, and the served answers equal the in-process ones."""

import pytest

pytestmark = pytest.mark.integration


def test_the_multi_stage_demo_serves_what_it_computes_in_process(tmp_path, pytorch_backend):
    from examples.multi_stage import demo

    result = demo.main(
        [
            "--output",
            str(tmp_path / "demo"),
            "--sessions",
            "1500",
            "--items",
            "300",
            "--candidates",
            "40",
            "--d-model",
            "32",
            "--epochs",
            "1",
            "--ranker-epochs",
            "1",
            "--negatives",
            "5",
            "--show",
            "3",
        ]
    )

    assert result["served == in-process"] is True
    for order in ("retrieval order", "ranked order"):
        assert set(result[order]) == {"recall@10", "NDCG@10"}
        assert 0.0 <= result[order]["NDCG@10"] <= result[order]["recall@10"] <= 1.0
