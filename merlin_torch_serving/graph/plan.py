"""A merlin.dag graph flattened into an execution plan: operator calls wired by named column refs.

Selection, ``+`` and ``[]`` nodes only route columns, so they are resolved away here; what is left
is a list of operator calls, each reading columns produced by the request or by an earlier call.
The in-process executor runs a plan; the exporter cuts it into Triton steps. Both see one graph.
Two things every answer gets are added here: the columns operators return with every answer (the
session id), and the blanking of results computed from rows a workflow filtered out. An operator
with sub-graphs (a route's branches) gets each as a plan of its own, whose request is the
operator's input (``sub_plans``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from merlin.dag import ColumnSelector, Graph, Node
from merlin.dag.ops import ConcatColumns, GroupingOp, SelectionOp, SubsetColumns, SubtractionOp
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.exceptions import (
    InferenceError,
    InputError,
    MerlinTorchServingError,
    SchemaError,
)
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.filtered import BlankFilteredRows

_ROUTING_OPS = (SelectionOp, GroupingOp, ConcatColumns, SubsetColumns, SubtractionOp)
REQUEST = -1  # producer index of columns that come with the request


@dataclass(frozen=True)
class Ref:
    """Column ``column`` as produced by call ``producer`` (``REQUEST`` for request columns)."""

    producer: int
    column: str


@dataclass
class OpCall:
    """One operator applied to columns routed to it from the request or earlier calls."""

    index: int
    op: ServingOperator
    inputs: dict[str, Ref]
    input_schema: Schema
    output_schema: Schema
    #: the plans of the operator's sub-graphs, by name (see ``ServingOperator.sub_graphs``)
    sub_plans: dict[str, Plan] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.index}:{self.op.label}"


@dataclass
class Plan:
    input_schema: Schema
    calls: list[OpCall]
    outputs: dict[str, Ref]
    output_schema: Schema
    schemas: dict[Ref, ColumnSchema] = field(default_factory=dict)
    #: what in-process runs prepared for this plan (its packaged steps), by their settings
    runs: dict = field(default_factory=dict, repr=False, compare=False)

    def run(self, table: TensorTable, calls: list[OpCall] | None = None) -> TensorTable:
        """Run the plan (or the given subset of its calls) on a request table."""
        env = {Ref(REQUEST, name): column for name, column in table.items()}
        return TensorTable(run_calls(calls or self.calls, env, self.outputs), _unsafe=True)

    def request_groups(self) -> list[str] | None:
        """Request columns whose equal values must travel in one request (the session id), ``[]``
        when rows are independent, ``None`` when no split of a request is safe (see
        ``ServingOperator.request_groups``)."""
        found: list[str] = []
        for call in self.calls:
            keys = call.op.request_groups()
            if keys is None:
                return None
            refs = [call.inputs.get(key) for key in keys]
            names = [ref.column for ref in refs if ref is not None and ref.producer == REQUEST]
            if len(names) != len(refs):
                return None
            if names and found and names != found:
                return None
            found = names or found
        return found


def run_calls(calls: list[OpCall], env: dict, outputs: dict[str, Ref]) -> dict:
    """Run calls in order over ``env`` (Ref -> column) and return the requested output columns."""
    for call in calls:
        inputs = TensorTable({name: env[ref] for name, ref in call.inputs.items()}, _unsafe=True)
        started = time.perf_counter()
        try:
            result = call.op.transform(ColumnSelector(list(call.inputs)), inputs)
        except (InferenceError, InputError):
            # an InputError names the column the caller must fix; the operator does not matter
            raise
        except MerlinTorchServingError as exc:
            # our own errors already say what is wrong; add which operator said it
            raise InferenceError(call.name, str(exc)) from exc
        except Exception as exc:
            raise InferenceError(call.name, f"{type(exc).__name__}: {exc}") from exc
        metrics.count(metrics.OPERATOR_SECONDS, time.perf_counter() - started, operator=call.name)
        for name in call.output_schema.column_names:
            if name not in result.columns:
                raise InferenceError(
                    call.name,
                    f"the operator did not return its output column {name!r} "
                    f"(it returned {', '.join(map(repr, result.columns))})",
                )
            env[Ref(call.index, name)] = result[name]
    return {name: env[ref] for name, ref in outputs.items()}


def build_plan(output_node: Node, input_schema: Schema) -> Plan:
    """Compute and validate every node's schema, then flatten routing nodes away."""
    graph = Graph(output_node)
    try:
        graph.construct_schema(input_schema)
    except MerlinTorchServingError:
        raise
    except ValueError as exc:  # merlin.dag's own checks (e.g. a column missing from the request)
        raise SchemaError("the graph", None, "columns its operators can find", str(exc)) from exc

    refs: dict[int, dict[str, Ref]] = {}  # id(node) -> its output columns' refs
    calls: list[OpCall] = []
    schemas: dict[Ref, ColumnSchema] = {Ref(REQUEST, c.name): c for c in input_schema}
    for node in _postorder(graph.output_node, cut=set()):
        _flatten(node, refs, calls, schemas)

    outputs = _with_returned_columns(calls, refs[id(graph.output_node)])
    for call in list(calls):
        flag = call.op.filtered_rows_column()
        if flag:
            outputs = _blank_filtered_rows(call, flag, calls, outputs, schemas)
    output_schema = Schema([schemas[ref].with_name(name) for name, ref in outputs.items()])
    return Plan(input_schema, calls, outputs, output_schema, schemas)


def _flatten(
    node: Node,
    refs: dict[int, dict[str, Ref]],
    calls: list[OpCall],
    schemas: dict[Ref, ColumnSchema],
) -> None:
    """Add ``node`` to the plan being built: the refs of its output columns, and its operator
    call (with the plans of the operator's sub-graphs) unless it only routes columns."""
    upstream = _upstream_refs(node, refs)
    op = node.op
    if isinstance(op, _ROUTING_OPS):
        refs[id(node)] = {
            name: _find(name, upstream, node) for name in node.output_schema.column_names
        }
        return
    if not isinstance(op, ServingOperator):
        raise SchemaError(
            type(op).__name__,
            None,
            "a serving operator (TransformWorkflow, PredictPytorch, TopK, DecodeItemIds, ...)",
            f"{type(op).__module__}.{type(op).__name__}",
            "wrap NVTabular operators in an nvtabular.Workflow and use TransformWorkflow",
        )
    # the selector holds the columns the operator asked for, in the order it asked
    selected = node.selector.names if node.selector is not None else node.input_schema.column_names
    inputs = {name: _find(name, upstream, node) for name in selected}
    parts = op.parts()
    if parts != [op]:
        call = _append_parts(parts, inputs, calls, schemas)
        refs[id(node)] = {c.name: Ref(call.index, c.name) for c in node.output_schema}
        schemas.update({Ref(call.index, c.name): c for c in node.output_schema})
        return
    call = OpCall(
        index=len(calls),
        op=op,
        inputs=inputs,
        input_schema=node.input_schema.select_by_name(selected),
        output_schema=node.output_schema,
    )
    sub_graphs = op.sub_graphs()
    if sub_graphs:
        # a sub-graph starts from what the operator receives: the nodes above it are its request
        cut = {id(n) for n in _postorder(node.parents, cut=set())}
        call.sub_plans = {
            name: _sub_plan(op.label, name, output, cut, call.input_schema)
            for name, output in sub_graphs.items()
        }
        op.bind_sub_plans(call.sub_plans)
    calls.append(call)
    refs[id(node)] = {c.name: Ref(call.index, c.name) for c in node.output_schema}
    schemas.update({Ref(call.index, c.name): c for c in node.output_schema})


def _sub_plan(label: str, name: str, output: Node, cut: set[int], input_schema: Schema) -> Plan:
    """The plan of sub-graph ``name`` of operator ``label``, whose request is the operator's input
    (``input_schema``): the nodes in ``cut`` (above the operator) provide their columns by name."""
    refs: dict[int, dict[str, Ref]] = {}
    calls: list[OpCall] = []
    schemas: dict[Ref, ColumnSchema] = {Ref(REQUEST, c.name): c for c in input_schema}
    received = input_schema.column_names
    for node in _postorder(output, cut):
        if id(node) in cut:  # columns it does not receive are refused below, naming them
            refs[id(node)] = {c: Ref(REQUEST, c) for c in node.output_schema.column_names}
            continue
        _flatten(node, refs, calls, schemas)
    for call in calls:
        for ref in call.inputs.values():
            if ref.producer == REQUEST and ref.column not in received:
                raise SchemaError(
                    label,
                    ref.column,
                    f"columns it receives ({', '.join(map(repr, received))}) in its sub-graph"
                    f" {name!r}",
                    f"{call.op.label} reading {ref.column!r} from above the operator",
                    "build the sub-graph on the node the operator follows",
                )
    outputs = refs[id(output)]
    output_schema = Schema([schemas[ref].with_name(column) for column, ref in outputs.items()])
    # its request holds what it reads, no more: that is what crosses to its served model
    read = {ref.column for call in calls for ref in call.inputs.values() if ref.producer == REQUEST}
    read |= {ref.column for ref in outputs.values() if ref.producer == REQUEST}
    request_schema = input_schema.select_by_name([c for c in received if c in read])
    return Plan(request_schema, calls, outputs, output_schema, schemas)


def _postorder(outputs: Node | list[Node], cut: set[int]) -> list[Node]:
    """The nodes that feed ``outputs`` (themselves included), each after the nodes it reads.

    Nodes in ``cut`` are listed but not descended into; an operator's sub-graphs are left out (they
    become sub-plans of its call).
    """
    order: list[Node] = []
    seen: set[int] = set()

    def visit(node: Node) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if id(node) not in cut:
            for upstream in _feeding(node):
                visit(upstream)
        order.append(node)

    for output in outputs if isinstance(outputs, list) else [outputs]:
        visit(output)
    return order


def _feeding(node: Node) -> list[Node]:
    """The nodes ``node`` reads, but the outputs of its operator's sub-graphs."""
    op = node.op
    inner = {id(n) for n in op.sub_graphs().values()} if isinstance(op, ServingOperator) else set()
    return [n for n in node.parents_with_dependencies if id(n) not in inner]


def _append_parts(
    parts: list[ServingOperator],
    inputs: dict[str, Ref],
    calls: list[OpCall],
    schemas: dict[Ref, ColumnSchema],
) -> OpCall:
    """One call per part of an operator (``ServingOperator.parts``), each reading the operator's
    inputs and the outputs of the parts before it by name; returns the last."""
    available = dict(inputs)
    call: OpCall | None = None
    for part in parts:
        offered = Schema([schemas[ref].with_name(name) for name, ref in available.items()])
        expected = part.expected_input_schema(offered)
        names = offered.column_names if expected is None else expected.column_names
        missing = [name for name in names if name not in available]
        if missing:
            raise SchemaError(part.label, missing[0], "the column from the part before it", "none")
        input_schema = offered.select_by_name(names)
        call = OpCall(
            index=len(calls),
            op=part,
            inputs={name: available[name] for name in names},
            input_schema=input_schema,
            output_schema=part.compute_output_schema(input_schema, ColumnSelector(names)),
        )
        calls.append(call)
        for column in call.output_schema:
            available[column.name] = Ref(call.index, column.name)
            schemas[Ref(call.index, column.name)] = column
    if call is None:
        raise SchemaError("an operator", None, "at least one part", "none")
    return call


def _with_returned_columns(calls: list[OpCall], outputs: dict[str, Ref]) -> dict[str, Ref]:
    """The graph's outputs after the columns every answer carries (``returned_columns``) that the
    graph does not select already: the session id and the mark of filtered sessions come first."""
    returned = {
        name: Ref(call.index, name)
        for call in calls
        for name in call.op.returned_columns()
        if name not in outputs
    }
    return {**returned, **outputs}


def _blank_filtered_rows(
    flagging: OpCall,
    flag: str,
    calls: list[OpCall],
    outputs: dict[str, Ref],
    schemas: dict[Ref, ColumnSchema],
) -> dict[str, Ref]:
    """Append a BlankFilteredRows call over the outputs computed downstream of ``flagging`` (from
    its placeholder rows, marked in its column ``flag``), and return the outputs with those
    columns taken from it."""
    downstream = {flagging.index}
    for call in calls:
        if call.op.handles_filtered_rows():  # it answers those rows itself (a route)
            continue
        if any(ref.producer in downstream for ref in call.inputs.values()):
            downstream.add(call.index)
    blanked = {
        name: ref
        for name, ref in outputs.items()
        if ref.producer in downstream and ref.producer != flagging.index
    }
    if not blanked:
        return outputs
    inputs = {**blanked, flag: Ref(flagging.index, flag)}
    input_schema = Schema([schemas[ref].with_name(name) for name, ref in inputs.items()])
    op = BlankFilteredRows(flag, list(blanked))
    call = OpCall(
        len(calls), op, inputs, input_schema, op.compute_output_schema(input_schema, None)
    )
    calls.append(call)
    schemas.update({Ref(call.index, c.name): c for c in call.output_schema})
    return {
        name: Ref(call.index, name) if name in blanked else ref for name, ref in outputs.items()
    }


def _upstream_refs(node: Node, refs: dict[int, dict[str, Ref]]) -> dict[str, Ref]:
    """Columns visible to a node: its parents' and dependencies' outputs, else the request."""
    upstream: dict[str, Ref] = {}
    sources = _feeding(node)
    for source in sources:
        for name, ref in refs[id(source)].items():
            upstream.setdefault(name, ref)
    if not sources:
        upstream = {name: Ref(REQUEST, name) for name in node.input_schema.column_names}
    return upstream


def _find(name: str, upstream: dict[str, Ref], node: Node) -> Ref:
    try:
        return upstream[name]
    except KeyError:
        raise SchemaError(
            node.op.label,
            name,
            "the column from an upstream node",
            "no upstream node provides it (they provide"
            f" {', '.join(map(repr, upstream)) or 'nothing'})",
        ) from None
