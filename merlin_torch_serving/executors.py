"""Where an ensemble runs: in this process or on a Triton server, behind one small interface.

``Ensemble.transform(data, executor=...)`` hands the request table to an executor and gets the
response table back; which executor it is does not change anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from merlin.table import TensorTable

from merlin_torch_serving.exceptions import SchemaError

if TYPE_CHECKING:
    from merlin_torch_serving.ensemble import Ensemble


class Executor(Protocol):
    def execute(self, ensemble: "Ensemble", request: TensorTable) -> TensorTable:
        """Run ``ensemble`` on a request table (columns of its input schema) and return the
        table of its output schema."""


class LocalExecutor:
    """Runs the ensemble's operators in this process, in plan order."""

    def execute(self, ensemble: "Ensemble", request: TensorTable) -> TensorTable:
        return ensemble.plan.run(request)


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

    def __init__(self, client, model: str, protocol: str = "grpc"):
        from merlin_torch_serving.client import Client

        self.client = client if isinstance(client, Client) else Client(client, protocol)
        self.model = model

    def execute(self, ensemble: "Ensemble", request: TensorTable) -> TensorTable:
        served = self.client.schemas(self.model)
        if served.output_schema.column_names != ensemble.output_schema.column_names:
            raise SchemaError(
                f"served model {self.model!r}",
                None,
                f"the ensemble's outputs {ensemble.output_schema.column_names}",
                f"{served.output_schema.column_names}",
                "export this ensemble under that name, or point the executor at the right model",
            )
        return self.client.infer_table(self.model, request)
