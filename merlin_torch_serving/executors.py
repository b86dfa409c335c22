"""Where an ensemble runs: in this process or on a Triton server, behind one small interface.

``Ensemble.transform(data, executor=...)`` hands the request table to an executor and gets the
response table back; which executor it is does not change anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from merlin.table import TensorTable

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
