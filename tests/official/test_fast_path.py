"""The official workflows on the fast path: every operator compiled but the end-to-end example's
custom ItemRecency, no request sent to NVTabular on the way, and the same arrays as NVTabular."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import assert_wire_equal, oracle
from tests.official.example import request_rows

CUSTOM_OPERATORS = {"getting_started": [], "end_to_end": ["ItemRecency"]}


def test_official_workflows_run_without_nvtabular_but_for_custom_operators(example, caplog):
    with caplog.at_level(logging.DEBUG, logger="merlin_torch_serving"):
        compiled = compile_workflow(example.workflow)
        for seed in range(5):
            rows = request_rows(example, 12, seed=300 + seed)
            compiled.transform(
                wire.to_wire(frames.frame_to_table(rows, example.workflow.input_schema))
            )

    assert [label for label, _ in compiled.fallbacks] == CUSTOM_OPERATORS[example.name]
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if "runs through NVTabular" in m] == [
        f"fast path: operator {label!r} runs through NVTabular: {label} has no compiled kernel"
        for label in CUSTOM_OPERATORS[example.name]
    ]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), n_sessions=st.integers(2, 24))
def test_official_workflows_on_the_fast_path_equal_nvtabular(example, seed, n_sessions):
    rows = request_rows(example, n_sessions, seed=seed)
    request = wire.to_wire(frames.frame_to_table(rows, example.workflow.input_schema))
    assert_wire_equal(
        compile_workflow(example.workflow).transform(request), oracle(example.workflow, request)
    )
