"""The base class of every serving operator, and the contract between operators and the exporter.

An operator is a merlin.dag operator that also says which Triton backend hosts it, how to write
itself into (and read itself back from) a model repository, and, optionally, how it compiles into
the TorchScript of a libtorch step. The exporter (``merlin_torch_serving.export``) knows operators
through these hooks only, so a new operator is one class in one file.

Writing an operator
-------------------
Graph building and running (merlin.dag's hooks, plus a few of ours):

- ``expected_input_schema`` names the input columns with the dtype and shape wanted (checked as
  the graph is built); ``compute_output_schema`` says what comes out.
- ``transform(col_selector, TensorTable) -> TensorTable`` computes the outputs, without side
  effects; it runs in-process and inside the python backend alike.

Export (the contract the exporter relies on):

- ``backend``: ``"python"`` (the default) runs the operator in a python-backend model, fused with
  the python operators next to it; ``"pytorch"`` makes it a libtorch model of its own, which needs
  ``torchscript``. May be a property, decided per instance.
- ``config()``: the JSON-able form of the ``__init__`` keyword arguments that are not files.
- ``save_artifacts(folder)``: writes the files (a model, a vocabulary) into ``folder``.
- ``load_arguments(config, folder)``: a classmethod that turns ``config()`` and the files back into
  ``__init__``'s keyword arguments (by default ``config()`` itself). ``load`` calls
  ``cls(**load_arguments(...))``: ``__init__`` is the one way an operator is built, in-process and
  in the server alike, and ``load`` may not be overridden.
- ``format_version``: the version of what ``config()`` and the files hold. Bump it when their
  meaning changes; a step saved with another version refuses to load and says so. (The layout of
  the exported files around them has its own version, ``export.manifest.STEP_FORMAT_VERSION``.)
- ``parts()``: optional, the operators this one runs as in the plan (itself by default), for an
  operator split between backends.
- ``torchscript(input_schema)``: optional, the fusion hook. A ``torch.nn.Module`` whose
  ``forward`` takes one ``Dict[str, Tensor]`` of the operator's inputs in the wire format (keyed by
  the column names of ``input_schema``; a ragged list ``c`` as ``c__values`` and ``c__offsets``) and
  returns its outputs as a Tensor or a tuple of Tensors in output-schema order, or as a
  ``Dict[str, Tensor]`` keyed by output column (a ragged output ``c`` as ``c__values`` and
  ``c__offsets``). An operator with one that reads a libtorch step's outputs, which nothing but
  operators with a TorchScript form and the columns every answer carries read, is compiled into
  that step's model (``export.fusion``), which saves the scores of a whole catalog from crossing to
  a python step. Return ``None`` when the
  operator cannot run in TorchScript as configured (the default). Run the same TorchScript
  functions in ``transform`` and served answers equal in-process answers bit for bit. (TorchScript
  reads a module's class annotations as types: leave ``from __future__ import annotations`` out
  of the module that defines it.)

- ``exportable(input_schema)``: optional, the package hook. The same module contract as
  ``torchscript``, as an eager module that ``torch.export`` takes (no data-dependent Python
  control flow or errors while it exports: see ``aot.exportable``). A libtorch step whose
  operators all have one is compiled ahead of time into an AOTInductor package (``aot``), which
  this process runs too, instead of TorchScript; a step with an operator without one stays
  TorchScript. ``requires_package`` (an operator whose user asked for a package) makes a step that
  cannot be a package fail to export rather than fall back.

Sub-graphs (a route's branches, ``merlin_torch_serving.routing``):

- ``sub_graphs()``: graphs the operator runs on subsets of its rows, by name, built on the node it
  follows (declare them in ``dependencies`` too, so their schemas are computed). Each becomes a
  plan whose request is the operator's input, handed to ``bind_sub_plans`` to run in-process;
  the export writes each as a Triton ensemble of its own and tells the served operator its model
  in ``sub_models.json`` of its artifact folder (``ops.sub_models``). ``inline_sub_graphs()``
  names those to host in the operator's own python step instead (no model of their own).
- ``reloadable_config``: ``config()`` keys that a file beside the step model's config may override
  when it loads (``export.config.CONFIG_OVERRIDES_FILE``), so they change with a reload and no new
  export.

Serving: ``close()`` releases what an operator runs beside requests (the answer log's writer
thread) when its step stops, after finishing its work; ``graph.answering`` tells ``transform``
whom a run answers (served requests and their ids, batch scoring, or a call in this process).

A minimal fusible operator::

    class Scale(ServingOperator):
        def __init__(self, column: str, factor: float):
            super().__init__()
            self.column, self.factor = column, float(factor)

        def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
            return Schema([input_schema[self.column]])

        def transform(self, col_selector, transformable):
            values = torch.from_numpy(transformable[self.column].values)
            return TensorTable({self.column: scale(values, self.factor).numpy()}, _unsafe=True)

        def config(self):
            return {"column": self.column, "factor": self.factor}

        def torchscript(self, input_schema):
            # forward(inputs) -> scale(inputs[column], factor)
            return ScaleModule(self.column, self.factor)
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, ClassVar

from merlin.dag import BaseOperator, ColumnSelector, Node
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError

if TYPE_CHECKING:
    import torch

#: the Triton backends an operator can declare
BACKENDS = ("python", "pytorch")


class ServingOperator(BaseOperator):
    """A graph operator that runs in-process and on Triton with the same code (see the module's
    docstring for the hooks a subclass implements)."""

    #: the Triton backend that hosts the operator: "python" (fused with its python neighbours)
    #: or "pytorch" (a libtorch model of its own)
    backend: ClassVar[str] = "python"
    #: the version of what ``config()`` and ``save_artifacts`` write
    format_version: ClassVar[int] = 1
    #: ``config()`` keys a file beside a served step's config may override (see the docstring)
    reloadable_config: ClassVar[tuple[str, ...]] = ()
    #: a libtorch step holding the operator must be an AOTInductor package (see the docstring)
    requires_package: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "load" in cls.__dict__:
            raise TypeError(
                f"{cls.__qualname__} overrides ServingOperator.load; operators are rebuilt through"
                " __init__ only: override the classmethod load_arguments(config, artifact_path) to"
                " return __init__'s keyword arguments"
            )

    # ---- graph building ---------------------------------------------------------------------

    def expected_input_schema(self, input_schema: Schema) -> Schema | None:
        """The columns this operator needs from ``input_schema``, with the dtype and shape it
        expects; ``None`` takes every column it is given."""
        return None

    def compute_selector(
        self, input_schema, selector, parents_selector=None, dependencies_selector=None
    ) -> ColumnSelector:
        expected = self.expected_input_schema(input_schema)
        if expected is None:
            return super().compute_selector(input_schema, selector)
        missing = [name for name in expected.column_names if name not in input_schema.column_names]
        if missing:
            available = ", ".join(map(repr, input_schema.column_names)) or "no columns"
            raise SchemaError(
                self.label,
                missing[0],
                describe_column(expected[missing[0]]),
                f"no such column (its parents provide {available})",
            )
        return ColumnSelector(expected.column_names)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        expected = self.expected_input_schema(input_schema)
        if expected is None:
            return
        for want in expected:
            got = input_schema[want.name]
            if got.dtype.without_shape != want.dtype.without_shape or not _shapes_fit(want, got):
                raise SchemaError(
                    self.label, want.name, describe_column(want), describe_column(got)
                )

    def __rshift__(self, other):
        """``op >> op``: start a graph at this operator's own inputs."""
        return self.as_node() >> other

    def as_node(self) -> Node:
        """This operator applied to the columns it needs, as the root of a graph."""
        columns = self.root_columns()
        if not columns:
            raise SchemaError(
                self.label,
                None,
                "to know its input columns",
                "an operator without a declared input schema",
                "start the graph from column names instead, e.g. ['a', 'b'] >> op",
            )
        return ColumnSelector(columns) >> self

    def root_columns(self) -> list[str]:
        """The input columns this operator needs when it starts a graph."""
        return []

    def request_groups(self) -> list[str] | None:
        """Input columns whose rows must reach this operator in one request (a Groupby's keys: all
        clicks of a session); ``[]`` when it transforms rows independently, ``None`` when no split
        of a request is safe. Clients split big requests by these columns."""
        return []

    def non_null_inputs(self) -> list[str]:
        """Input columns in which a null (NaN, None) is a broken request rather than a missing
        value: ids, and keys that group rows. Requests holding one are refused at the step's entry.
        """
        return []

    def returned_columns(self) -> list[str]:
        """Output columns that every answer of the ensemble carries, whether or not the graph
        selects them (the session id, the mark of filtered sessions)."""
        return []

    def filtered_rows_column(self) -> str | None:
        """A bool output column that is True on placeholder rows (sessions this operator could
        not compute); the ensemble blanks every later result on those rows."""
        return None

    def handles_filtered_rows(self) -> bool:
        """True when the operator answers the rows a workflow filtered out itself (a route sends
        them to a fallback or blanks them), so the ensemble does not blank what it returns."""
        return False

    def sub_graphs(self) -> dict[str, Node]:
        """Graphs the operator runs on subsets of its rows, by name (see the module's docstring)."""
        return {}

    def inline_sub_graphs(self) -> list[str]:
        """Sub-graphs the export writes into the operator's own step, not as models of their own."""
        return []

    def bind_sub_plans(self, plans: dict) -> None:
        """The plans of ``sub_graphs()`` (``plan.Plan`` by name), built with the ensemble."""

    def warmup_requests(self) -> list:
        """Candidate requests (``TensorTable``s of this operator's input columns) to warm served
        models up with, best first; the export takes the first that no filter drops."""
        return []

    def services(self) -> list[dict[str, str]]:
        """Outside services the operator calls while it serves (a feature server), as
        ``{"name": ..., "url": ...}``; the export names them in the step's config, and health
        reports say whether each answers (``health.service_health``)."""
        return []

    def filtered_by(self, request) -> str | None:
        """What in this operator drops (part of) ``request``, for messages; None if nothing does."""
        return None

    def close(self) -> None:
        """Release what the operator holds while it serves (a thread, open files), once its step
        stops: Triton's ``finalize``. What it wrote must be complete when this returns."""

    # ---- export ----------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """JSON-able form of the ``__init__`` keyword arguments that are not files."""
        return {}

    def save_artifacts(self, artifact_path: str | os.PathLike | None = None) -> None:
        """Write the files this operator needs (model, vocabulary) into ``artifact_path``."""

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        """``__init__``'s keyword arguments, read back.

        They come from ``config()`` and the files ``save_artifacts`` wrote.
        """
        return dict(config)

    @classmethod
    def load(cls, config: dict[str, Any], artifact_path: str) -> ServingOperator:
        """The operator ``config()`` and ``save_artifacts`` describe, built by ``__init__``."""
        return cls(**cls.load_arguments(config, artifact_path))

    def parts(self) -> list[ServingOperator]:
        """The operators this one runs as in a plan, in order: itself by default. An operator that
        runs partly on one backend and partly on another (a workflow whose custom operator has no
        TorchScript form) returns one part per backend; each part reads the operator's inputs and
        the outputs of the parts before it, by column name, and the last part's outputs are the
        operator's."""
        return [self]

    def placement_notes(self) -> list[str]:
        """Why (part of) this operator runs on another backend than it was asked to, one sentence
        each naming the part and the reason; an export lists them in its warnings."""
        return []

    def torchscript(self, input_schema: Schema) -> torch.nn.Module | None:
        """The operator as a TorchScript-able module over wire tensors, or None (see the module's
        docstring); ``input_schema`` holds its input columns as the graph feeds them."""
        return None

    def exportable(self, input_schema: Schema) -> torch.nn.Module | None:
        """The operator as an eager module over wire tensors that torch.export takes, or None (see
        the module's docstring)."""
        return None

    @property
    def class_path(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}"


def operator_class(class_path: str) -> type[ServingOperator]:
    """Import a ServingOperator subclass from its ``module.QualName`` path."""
    module_name, _, class_name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, ServingOperator)):
        raise TypeError(f"{class_path!r} is not a ServingOperator")
    return cls


def _shapes_fit(want: ColumnSchema, got: ColumnSchema) -> bool:
    """Whether a column of shape ``got`` can feed an input expecting ``want``.

    Scalars must meet scalars; a ragged expectation takes ragged lists, or fixed lists no longer
    than its maximum length (already padded upstream); a fixed-length expectation takes a fixed
    list of the same inner dims (an unknown inner dim takes any).
    """
    want_dims, got_dims = want.shape.dims, got.shape.dims
    want_rank = 1 if want_dims is None else max(len(want_dims), 1)
    got_rank = 1 if got_dims is None else max(len(got_dims), 1)
    if want_rank != got_rank:
        return False
    if want_rank == 1:
        return True
    if want.shape.is_ragged:
        if got.shape.is_ragged:
            return True
        max_length = want_dims[1].max
        return max_length is None or (got_dims[1].is_fixed and got_dims[1].max <= max_length)
    for want_dim, got_dim in zip(want_dims[1:], got_dims[1:], strict=True):
        if want_dim.is_fixed and (not got_dim.is_fixed or got_dim.max != want_dim.max):
            return False
    return True
