"""The request-scoped counters operators add to: kept only while a step host collects."""

from merlin_torch_serving.export.step_metrics import warmup_runs
from merlin_torch_serving.graph import metrics


def test_counts_outside_a_served_step_are_dropped():
    metrics.count(metrics.SESSIONS, 5)
    assert not metrics.is_collecting()
    with metrics.collecting() as collected:
        assert metrics.is_collecting()
    assert collected.totals == {}


def test_counts_add_up_per_name_and_labels_and_skip_zeros():
    with metrics.collecting() as collected:
        metrics.count(metrics.OOV_IDS, 2, column="item_id")
        metrics.count(metrics.OOV_IDS, 1, column="item_id")
        metrics.count(metrics.OOV_IDS, 4, column="category")
        metrics.count(metrics.FILTERED_SESSIONS, 0)
        with metrics.collecting() as inner:
            metrics.count(metrics.SESSIONS, 3)
    assert collected.totals == {
        (metrics.OOV_IDS, (("column", "item_id"),)): 3.0,
        (metrics.OOV_IDS, (("column", "category"),)): 4.0,
    }
    assert inner.totals == {(metrics.SESSIONS, ()): 3.0}


def test_warmup_runs_sum_the_counts_of_the_configs_samples():
    assert warmup_runs({}) == 0
    assert warmup_runs({"model_warmup": [{"name": "sample", "count": 3}, {"name": "other"}]}) == 4
