"""The benchmarks' per-step breakdown (benchmarks/breakdown.py) turns snapshots taken around a timed
window into time and calls a request, without a server: Merlin's executor timers, this project's
step counters and Triton's statistics."""

from benchmarks import breakdown


def test_merlins_executor_timers_become_time_and_calls_a_request():
    before = {
        "requests": 10,
        "execute_s": 1.0,
        "transform_s": 0.9,
        "operators": {"TransformWorkflowTriton": {"seconds": 0.7, "calls": 70}},
    }
    after = {
        "requests": 14,
        "execute_s": 1.4,
        "transform_s": 1.26,
        "operators": {
            "TransformWorkflowTriton": {"seconds": 0.98, "calls": 98},
            "QueryFaiss": {"seconds": 0.004, "calls": 12},
        },
    }
    split = breakdown.executor_steps(before, after)
    assert split["requests"] == 4
    assert split["whole_ms"] == 100.0
    steps = {row["step"]: row for row in split["steps"]}
    assert steps["TransformWorkflowTriton"] == {
        "step": "TransformWorkflowTriton",
        "ms": 70.0,
        "calls": 7.0,
    }
    assert steps["QueryFaiss"] == {"step": "QueryFaiss", "ms": 1.0, "calls": 3.0}
    assert steps["executor between operators"]["ms"] == 19.0
    assert steps["request and response conversions"]["ms"] == 10.0


def test_a_workflow_models_timers_count_per_request_of_the_executor_that_called_it():
    before = {"requests": 0, "execute_s": 0.0, "transform_s": 0.0, "operators": {}}
    after = {
        "requests": 14,  # seven calls of the workflow model for each of 2 executor requests
        "execute_s": 0.28,
        "transform_s": 0.28,
        "operators": {"Groupby": {"seconds": 0.084, "calls": 42}},
    }
    split = breakdown.executor_steps(before, after, requests=2)
    assert (split["requests"], split["calls"]) == (2, 14)
    assert split["steps"][0] == {"step": "Groupby", "ms": 42.0, "calls": 21.0}
    table = "\n".join(breakdown.markdown("merlin", {"workflows": {"wf": split}, "models": {}}))
    assert "| NVTabular in `wf`: Groupby | 42.00 | 21 |" in table
    assert "| whole workflow model (`wf`) | 140.00 | 7 |" in table


def test_the_project_steps_counters_are_divided_by_their_own_requests_in_plan_order():
    model = "pipe-0-transformworkflow_topk"
    before = {
        ("mts_requests_total", model, ""): 5.0,
        ("mts_operator_seconds_total", model, "0:TransformWorkflow"): 0.005,
    }
    after = {
        ("mts_requests_total", model, ""): 15.0,
        ("mts_operator_seconds_total", model, "1:TopK(k=10)"): 0.002,
        ("mts_operator_seconds_total", model, "0:TransformWorkflow"): 0.015,
    }
    rows = breakdown.project_steps(before, after)["steps"]
    assert rows == [
        {"step": "0:TransformWorkflow", "model": model, "ms": 1.0},
        {"step": "1:TopK(k=10)", "model": model, "ms": 0.2},
    ]


def test_tritons_statistics_count_the_calls_of_each_model_a_request():
    def stats(count: int, ns: int) -> dict:
        return dict.fromkeys(
            ("success", "queue", "compute_input", "compute_infer", "compute_output"), (count, ns)
        )

    before = {"executor_model": stats(1, 10**6), "workflow": stats(7, 7 * 10**6)}
    # the entry model's own count may trail its answers: it counts as one call a request
    after = {"executor_model": stats(3, 5 * 10**6), "workflow": stats(21, 35 * 10**6)}
    calls = breakdown.model_calls(before, after, "executor_model", requests=2)
    assert calls["workflow"] == {"calls": 7.0, "ms_per_call": 2.0}
    assert calls["executor_model"]["calls"] == 1.0
    table = "\n".join(breakdown.markdown("merlin", {"models": calls}))
    assert "| Triton model `workflow` | 14.00 | 7 |" in table
