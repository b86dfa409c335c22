"""Datetimes and whole-column reductions in scripted functions (filled in below)."""

from __future__ import annotations

from merlin_torch_serving.scripted_workflow.expressions import Value


def extension(evaluator, what, owner, name, arguments, keywords) -> Value | None:
    return None


def as_rows(value: Value) -> str:
    return value.source
