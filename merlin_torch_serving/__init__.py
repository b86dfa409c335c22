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

__version__ = "0.1.0"

__all__ = [
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
