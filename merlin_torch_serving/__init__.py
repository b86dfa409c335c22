"""Serve session-based PyTorch recommenders and their NVTabular workflows on Triton.

The public API is re-exported here; each name lives in the module that owns its concept.
"""

from merlin_torch_serving.exceptions import (
    BackendNotAvailableError,
    ExportError,
    InferenceError,
    InputError,
    MerlinTorchServingError,
    ModelCheckError,
    ModelLoadError,
    PortInUseError,
    RepositoryExistsError,
    SchemaError,
    ServerError,
    ServerExitedError,
    ServerNotFoundError,
    ServerStartTimeoutError,
)

from merlin_torch_serving.ensemble import Ensemble
from merlin_torch_serving.executors import Executor, LocalExecutor
from merlin_torch_serving.export.config import ModelOptions
from merlin_torch_serving.ops import DecodeItemIds, PredictPytorch, ServingOperator, TopK, TransformWorkflow
from merlin_torch_serving.vocabulary import CategoryVocabulary

__version__ = "0.1.0"

__all__ = [
    "CategoryVocabulary",
    "DecodeItemIds",
    "Ensemble",
    "Executor",
    "LocalExecutor",
    "ModelOptions",
    "PredictPytorch",
    "ServingOperator",
    "TopK",
    "TransformWorkflow",
    "BackendNotAvailableError",
    "ExportError",
    "InferenceError",
    "InputError",
    "MerlinTorchServingError",
    "ModelCheckError",
    "ModelLoadError",
    "PortInUseError",
    "RepositoryExistsError",
    "SchemaError",
    "ServerError",
    "ServerExitedError",
    "ServerNotFoundError",
    "ServerStartTimeoutError",
]
