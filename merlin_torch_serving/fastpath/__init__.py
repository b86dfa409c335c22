"""A serving fast path for NVTabular workflows: compiled once at export, run on numpy arrays.

``compile_workflow(workflow).transform(columns)`` equals ``workflow.transform`` in the wire format,
except that a Groupby's rows whose sort keys tie keep the request's order (see ``ordering``).
"""

from merlin_torch_serving.fastpath.compiled import CompiledWorkflow
from merlin_torch_serving.fastpath.compiler import compile_workflow

__all__ = ["CompiledWorkflow", "compile_workflow"]
