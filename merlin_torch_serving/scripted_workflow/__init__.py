"""The TorchScript form of a fitted NVTabular workflow: raw request columns in, the workflow's
outputs out, in one module that Triton's pytorch backend serves and this process runs alike.

``ScriptedWorkflow(workflow).transform(columns)`` equals ``workflow.transform`` in the wire format
(as the fast path does, whose per-operator checks it shares), except for the order of clicks whose
sort keys tie, which both keep in request order (see ``ordering``). Nodes without a TorchScript
form are listed with the reason.
"""

from merlin_torch_serving.scripted_workflow.scripted import ScriptedWorkflow

__all__ = ["ScriptedWorkflow"]
