"""How a route runs one branch on the sessions sent to it: in-process, the branch's plan; served, a
call of the Triton ensemble the branch was exported as, through the python backend's business
logic scripting (BLS: ``pb_utils.InferenceRequest(...).exec()`` from the route's step).

Both take and return a ``TensorTable`` (the route's input rows for the branch, the branch's output
rows), so the route itself does not know where it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import InferenceError
from merlin_torch_serving.ops.sub_models import SubModel

if TYPE_CHECKING:
    from merlin_torch_serving.graph.plan import Plan


class Branch(Protocol):
    def run(self, table: TensorTable) -> TensorTable:
        """The branch's answer (its output columns, one row per row of ``table``)."""


class LocalBranch:
    """A branch run in this process: its plan, whose request is the route's input."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, table: TensorTable) -> TensorTable:
        return self.plan.run(table)


def hosted_branch(folder: str) -> LocalBranch:
    """A branch the export wrote as a python step inside the route's own (``inline``), loaded from
    ``folder`` once its files are checked, to run in the route's step."""
    from merlin_torch_serving.export.python_model import HostedStep
    from merlin_torch_serving.graph.plan import Plan

    step = HostedStep.load(folder, step=f"inline branch {folder!r}")
    return LocalBranch(Plan(step.input_schema, step.calls, step.outputs, step.output_schema))


class TritonBranch:
    """A branch served as a model of its own, called from the route's python step through BLS.

    Only the columns the branch reads cross; text travels as Triton's BYTES. A model that answers
    with an error (unloaded, failing) raises an ``InferenceError`` naming it.
    """

    def __init__(self, model: SubModel):
        self.model = model
        self.input_names = model.input_schema.column_names
        self.input_specs = wire.schema_specs(model.input_schema)
        request_names = self.input_names
        self.outputs = {
            spec.name: wire.response_name(spec.name, request_names)
            for spec in wire.schema_specs(model.output_schema)
        }

    def run(self, table: TensorTable) -> TensorTable:
        import triton_python_backend_utils as pb_utils

        selected = TensorTable({name: table[name] for name in self.input_names}, _unsafe=True)
        arrays = wire.to_wire(selected)
        inputs = [
            pb_utils.Tensor(spec.name, self._sent(wire.text_to_bytes(arrays[spec.name])))
            for spec in self.input_specs
        ]
        request = pb_utils.InferenceRequest(
            model_name=self.model.model,
            requested_output_names=list(self.outputs.values()),
            inputs=inputs,
        )
        response = request.exec()
        if response.has_error():
            raise InferenceError(self.model.model, response.error().message())
        answer = {}
        for name, sent_as in self.outputs.items():
            tensor = pb_utils.get_output_tensor_by_name(response, sent_as)
            if tensor is None:
                raise InferenceError(self.model.model, f"its answer has no output {sent_as!r}")
            answer[name] = wire.bytes_to_text(self._received(tensor.as_numpy()))
        return wire.from_wire(answer, self.model.output_schema)

    def _sent(self, array: np.ndarray) -> np.ndarray:
        return array[np.newaxis] if self.model.request_dim else array

    def _received(self, array: np.ndarray) -> np.ndarray:
        return array[0] if self.model.request_dim else array
