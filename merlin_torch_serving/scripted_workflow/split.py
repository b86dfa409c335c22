"""Splitting a workflow whose operators do not all have a TorchScript form: the ones without (a
custom operator, ``LogOp``) and what they read run first, in a python step, on the fast path (the
head); everything else runs in TorchScript after it (the tail), reading the columns the head
sends beside the request's.

A head runs on the request's rows: it may hold no Groupby, Filter or other operator that changes
rows (a custom operator is checked to keep them, per request). Nodes that only select request
columns run in both parts. When no such split exists the whole workflow stays with python, and the
reason says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import nvtabular as nvt
from merlin.dag import Node
from merlin.dag.ops.selection import SelectionOp
from merlin.schema import ColumnSchema
from nvtabular import ops as nvt_ops

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.compiler import describe_operator, nodes_in_run_order
from merlin_torch_serving.scripted_workflow.compiler import Compiled, compile_nodes
from merlin_torch_serving.scripted_workflow.head import Head

#: operators whose output rows are not the request's
_ROW_CHANGING = (nvt_ops.Groupby, nvt_ops.Filter, nvt_ops.Dropna)


@dataclass(frozen=True)
class Split:
    """A workflow cut in two: ``head``, the ``tail`` compiled after it, and why each operator of
    the head runs there (operator, reason); ``problem`` when there is no such cut."""

    head: Head | None
    tail: Compiled | None
    reasons: list[tuple[str, str]]
    problem: str | None = None


def split(workflow: nvt.Workflow, non_null_inputs: list[str], first: Compiled) -> Split:
    """The head and the tail after it, or why the workflow has no such split."""
    nodes = nodes_in_run_order(workflow.output_node)
    parents = [set(node.parents) for node in first.nodes]
    failures = _own_failures(first, frozenset())
    reasons = dict(failures)
    in_head: set[int] = set()
    for _ in range(len(nodes)):
        in_head |= _with_ancestors(set(failures), parents)
        changing = [
            describe_operator(nodes[i].op) for i in sorted(in_head) if _changes_rows(nodes[i])
        ]
        if changing:
            return Split(None, None, [], f"{changing[0]} would have to run before it")
        head = _head(workflow, nodes, parents, in_head)
        if isinstance(head, str):
            return Split(None, None, [], head)
        tail = compile_nodes(workflow, non_null_inputs, head)
        failures = _own_failures(tail, head.external)
        reasons.update(failures)
        if not failures:
            return Split(head, tail, [(tail.nodes[i].label, reasons[i]) for i in sorted(reasons)])
    # every pass adds a node to the head, so the loop has returned before this
    return Split(None, None, [], "its operators without a TorchScript form keep reaching further")


def _own_failures(compiled: Compiled, external: frozenset[int]) -> dict[int, str]:
    """Node position -> why it has no TorchScript form of its own (not merely a parent's)."""
    return {
        position: node.reason
        for position, node in enumerate(compiled.nodes)
        if position not in external and node.reason is not None and not node.follows_uncompiled
    }


def _with_ancestors(roots: set[int], parents: list[set[int]]) -> set[int]:
    found, stack = set(), list(roots)
    while stack:
        position = stack.pop()
        if position not in found:
            found.add(position)
            stack.extend(parents[position])
    return found


def _changes_rows(node: Node) -> bool:
    return isinstance(node.op, _ROW_CHANGING)


def _selects_request(node: Node) -> bool:
    """A node that only picks request columns: it runs in both parts."""
    return not node.parents_with_dependencies and (
        node.op is None or isinstance(node.op, SelectionOp)
    )


def _head(workflow, nodes: list[Node], parents: list[set[int]], in_head: set[int]) -> Head | str:
    """The head of these nodes, or why it cannot send its columns to the tail."""
    external = frozenset(i for i in in_head if not _selects_request(nodes[i]))
    read_by_tail = {
        parent
        for position, own in enumerate(parents)
        if position not in external
        for parent in own
        if parent in external
    }
    if len(nodes) - 1 in external:
        read_by_tail.add(len(nodes) - 1)  # the workflow's output comes from the head
    columns: dict[str, tuple[int, str]] = {}
    schema: dict[str, ColumnSchema] = {}
    # the request columns the tail takes as they are: a column the head sends under the same name
    # (Categorify's encoded ids beside the raw ones) travels under a name of its own
    taken = {c.name for c in workflow.input_schema if wire.is_carried_by_tensors(c)}
    for position in sorted(read_by_tail):
        for column in nodes[position].output_schema:
            try:
                np.dtype(wire.column_numpy_dtype(column))
            except TypeError:
                operator = describe_operator(nodes[position].op)
                return f"{column.name!r} has no dtype in {operator}'s schema"
            sent = column.name
            if sent in taken or sent in columns:
                sent = f"{column.name}.{position}"
            columns[sent] = (position, column.name)
            schema[sent] = column.with_name(sent)
    return Head(frozenset(in_head), external, columns, schema)
