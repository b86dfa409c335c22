"""Serving operators: each knows its schemas, transforms in-process, and exports itself."""

from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.decode import DecodeItemIds
from merlin_torch_serving.ops.pytorch import PredictPytorch
from merlin_torch_serving.ops.retrieve_topk import RetrieveTopK
from merlin_torch_serving.ops.topk import TopK
from merlin_torch_serving.ops.workflow import TransformWorkflow

__all__ = [
    "DecodeItemIds",
    "PredictPytorch",
    "RetrieveTopK",
    "ServingOperator",
    "TopK",
    "TransformWorkflow",
]
