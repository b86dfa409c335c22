"""Where an ensemble runs: in this process or on a Triton server, behind one small interface.

``Ensemble.transform(data, executor=...)`` hands its plan and the request table to an executor and
gets the response table back; which executor it is does not change anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

from merlin.table import TensorTable

from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.graph.threads import torch_threads

if TYPE_CHECKING:  # the plan imports the operators, and with them torch
    from merlin_torch_serving.graph.plan import Plan


class Executor(Protocol):
    """Where ``Ensemble.run`` runs a plan: in this process (``LocalExecutor``, ``MergingExecutor``)
    or on a server (``TritonExecutor``); any object with this ``execute`` will do."""

    def execute(self, plan: Plan, request: TensorTable) -> TensorTable:
        """Run an ensemble's ``plan`` on a request table (columns of its input schema) and return
        the table of its output schema."""


class LocalExecutor:
    """Runs the ensemble's operators in this process, in plan order.

    Parameters
    ----------
    torch_threads
        torch's intra-op threads while the ensemble runs (the process's setting is restored
        after). 1 by default, as exported step models default to (``ModelOptions``), so that
        in-process and served answers are equal bit for bit; and a one-session request gains
        nothing from a second thread, which on a busy machine waits whole scheduler time slices
        for a core (measured: 50 to 150 ms instead of 2 ms on 2 shared cores). ``None`` keeps the
        process's own setting (for large offline batches on an idle machine).
    instruction_set
        What the libtorch steps compiled ahead of time are compiled for here (see
        ``ModelOptions.instruction_set``): this CPU by default. Served and in-process answers are
        equal bit for bit when both run packages compiled alike (instruction set and threads).
    """

    def __init__(self, torch_threads: int | None = 1, instruction_set: str = "native"):
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1 or None, got {torch_threads!r}")
        self.torch_threads = torch_threads
        self.instruction_set = instruction_set

    def execute(self, plan: Plan, request: TensorTable) -> TensorTable:
        # the libtorch steps the export compiles into packages run as those packages
        from merlin_torch_serving.aot import inprocess

        with torch_threads(self.torch_threads):
            return inprocess.run(
                plan,
                request,
                threads=self.torch_threads,
                instruction_set_name=self.instruction_set,
            )


class TritonExecutor:
    """Runs the ensemble as exported to a tritonserver, under the model name it was exported as.

    Parameters
    ----------
    client
        A ``Client``, or a ``host:port`` URL to build one for.
    model
        The ensemble's model name on the server (the ``name`` given to ``Ensemble.export``).
    protocol
        With a URL: ``"grpc"`` or ``"http"``.
    """

    def __init__(self, client, model: str, protocol: Literal["grpc", "http"] = "grpc"):
        from merlin_torch_serving.client.schema_client import Client

        self.client = client if isinstance(client, Client) else Client(client, protocol)
        self.model = model

    def execute(self, plan: Plan, request: TensorTable) -> TensorTable:
        served = self.client.schemas(self.model)
        if served.output_schema.column_names != plan.output_schema.column_names:
            raise SchemaError(
                f"served model {self.model!r}",
                None,
                f"the ensemble's outputs {plan.output_schema.column_names}",
                f"{served.output_schema.column_names}",
                "export this ensemble under that name, or point the executor at the right model",
            )
        return self.client.infer_table(self.model, request)
