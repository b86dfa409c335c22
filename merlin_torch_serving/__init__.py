"""Serve session-based PyTorch recommenders and their NVTabular workflows on Triton.

The public API is re-exported here; each name lives in the module that owns its concept and is
imported on first use, so ``import merlin_torch_serving`` does not pay for torch.
"""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata
from typing import TYPE_CHECKING

from merlin_torch_serving.exceptions import (
    AddressError,
    AnswerLogError,
    ArtifactError,
    BackendBuildError,
    BackendNotAvailableError,
    BundleError,
    ExportError,
    InferenceError,
    InputError,
    MerlinTorchServingError,
    MissingColumnsError,
    ModelCheckError,
    ModelLoadError,
    ModelNotImportableError,
    ModelPreparationError,
    PortInUseError,
    RepositoryExistsError,
    RequestTimeoutError,
    SchemaError,
    ScoringError,
    ServerError,
    ServerExitedError,
    ServerNotFoundError,
    ServerStartTimeoutError,
    ServerUnavailableError,
    StoreError,
    UnknownModelError,
    WorkflowNotFittedError,
    WrongProtocolError,
)

__version__ = metadata.version("merlin-torch-serving")  # pyproject.toml's

# merlin-core warns on import that TensorFlow is missing; PyTorch serving never needs TensorFlow,
# so the warning only hides real ones (it was printed on every command).
warnings.filterwarnings(
    "ignore", message="Tensorflow dtype mappings did not load", category=UserWarning
)

_LAZY = {
    "AllItemsUnknown": "merlin_torch_serving.routing",
    "AsyncClient": "merlin_torch_serving.client.async_client",
    "BlockList": "merlin_torch_serving.live.rules",
    "CategoryVocabulary": "merlin_torch_serving.data.vocabulary",
    "ClickColumns": "merlin_torch_serving.evaluation",
    "Client": "merlin_torch_serving.client.schema_client",
    "DecodeItemIds": "merlin_torch_serving.ops",
    "EmbeddedSettings": "merlin_torch_serving.stores.settings",
    "Ensemble": "merlin_torch_serving.graph.ensemble",
    "Executor": "merlin_torch_serving.graph.executors",
    "ExactIndex": "merlin_torch_serving.retrieval",
    "Experiment": "merlin_torch_serving.routing",
    "ExportResult": "merlin_torch_serving.export.repository",
    "FeastFeatures": "merlin_torch_serving.multistage",
    "FewerKnownItems": "merlin_torch_serving.routing",
    "FilterCandidates": "merlin_torch_serving.multistage",
    "FilteredOut": "merlin_torch_serving.routing",
    "HNSWIndex": "merlin_torch_serving.retrieval",
    "IVFIndex": "merlin_torch_serving.retrieval",
    "ItemPopularity": "merlin_torch_serving.routing",
    "LocalExecutor": "merlin_torch_serving.graph.executors",
    "LogAnswers": "merlin_torch_serving.answer_log",
    "LookupFeatures": "merlin_torch_serving.multistage",
    "MergingExecutor": "merlin_torch_serving.graph.merging_executor",
    "ModelHealth": "merlin_torch_serving.client.health",
    "ModelOptions": "merlin_torch_serving.export.config",
    "ModelStatus": "merlin_torch_serving.client.health",
    "MostPopular": "merlin_torch_serving.routing",
    "ParquetFolder": "merlin_torch_serving.answer_log",
    "Predicate": "merlin_torch_serving.routing",
    "PredictPytorch": "merlin_torch_serving.ops",
    "Readout": "merlin_torch_serving.evaluation",
    "RedisSettings": "merlin_torch_serving.stores.settings",
    "RedisStream": "merlin_torch_serving.answer_log",
    "RetrieveTopK": "merlin_torch_serving.ops",
    "Route": "merlin_torch_serving.routing",
    "ScoringProgress": "merlin_torch_serving.scoring.dataset",
    "ScoringResult": "merlin_torch_serving.scoring.dataset",
    "ServingOperator": "merlin_torch_serving.ops",
    "SessionHistory": "merlin_torch_serving.live.history",
    "SoftmaxSampling": "merlin_torch_serving.multistage",
    "Store": "merlin_torch_serving.stores.base",
    "TopK": "merlin_torch_serving.ops",
    "TopKCandidates": "merlin_torch_serving.multistage",
    "TransformWorkflow": "merlin_torch_serving.ops",
    "Trending": "merlin_torch_serving.live.trending",
    "TrendingItems": "merlin_torch_serving.live.trending_items",
    "TritonExecutor": "merlin_torch_serving.graph.executors",
    "TritonServer": "merlin_torch_serving.launcher.server",
    "UnrollCandidates": "merlin_torch_serving.multistage",
    "evaluate_answers": "merlin_torch_serving.evaluation",
    "open_store": "merlin_torch_serving.stores.opening",
    "read_answers": "merlin_torch_serving.answer_log",
    "score_dataset": "merlin_torch_serving.scoring.dataset",
}

__all__ = [
    "AddressError",
    "AllItemsUnknown",
    "AnswerLogError",
    "ArtifactError",
    "AsyncClient",
    "BackendBuildError",
    "BackendNotAvailableError",
    "BlockList",
    "BundleError",
    "CategoryVocabulary",
    "ClickColumns",
    "Client",
    "DecodeItemIds",
    "EmbeddedSettings",
    "Ensemble",
    "ExactIndex",
    "Executor",
    "Experiment",
    "ExportError",
    "ExportResult",
    "FeastFeatures",
    "FewerKnownItems",
    "FilterCandidates",
    "FilteredOut",
    "HNSWIndex",
    "IVFIndex",
    "InferenceError",
    "InputError",
    "ItemPopularity",
    "LocalExecutor",
    "LogAnswers",
    "LookupFeatures",
    "MergingExecutor",
    "MerlinTorchServingError",
    "MissingColumnsError",
    "ModelCheckError",
    "ModelHealth",
    "ModelLoadError",
    "ModelNotImportableError",
    "ModelOptions",
    "ModelPreparationError",
    "ModelStatus",
    "MostPopular",
    "ParquetFolder",
    "PortInUseError",
    "Predicate",
    "PredictPytorch",
    "Readout",
    "RedisSettings",
    "RedisStream",
    "RepositoryExistsError",
    "RequestTimeoutError",
    "RetrieveTopK",
    "Route",
    "SchemaError",
    "ScoringError",
    "ScoringProgress",
    "ScoringResult",
    "ServerError",
    "ServerExitedError",
    "ServerNotFoundError",
    "ServerStartTimeoutError",
    "ServerUnavailableError",
    "ServingOperator",
    "SessionHistory",
    "SoftmaxSampling",
    "Store",
    "StoreError",
    "TopK",
    "TopKCandidates",
    "TransformWorkflow",
    "Trending",
    "TrendingItems",
    "TritonExecutor",
    "TritonServer",
    "UnknownModelError",
    "UnrollCandidates",
    "WorkflowNotFittedError",
    "WrongProtocolError",
    "evaluate_answers",
    "open_store",
    "read_answers",
    "score_dataset",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'merlin_torch_serving' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from merlin_torch_serving.answer_log import LogAnswers, ParquetFolder, RedisStream, read_answers
    from merlin_torch_serving.client.async_client import AsyncClient
    from merlin_torch_serving.client.health import ModelHealth, ModelStatus
    from merlin_torch_serving.client.schema_client import Client
    from merlin_torch_serving.data.vocabulary import CategoryVocabulary
    from merlin_torch_serving.evaluation import ClickColumns, Readout, evaluate_answers
    from merlin_torch_serving.export.config import ModelOptions
    from merlin_torch_serving.export.repository import ExportResult
    from merlin_torch_serving.graph.ensemble import Ensemble
    from merlin_torch_serving.graph.executors import Executor, LocalExecutor, TritonExecutor
    from merlin_torch_serving.graph.merging_executor import MergingExecutor
    from merlin_torch_serving.launcher.server import TritonServer
    from merlin_torch_serving.live.history import SessionHistory
    from merlin_torch_serving.live.rules import BlockList
    from merlin_torch_serving.live.trending import Trending
    from merlin_torch_serving.live.trending_items import TrendingItems
    from merlin_torch_serving.multistage import (
        FeastFeatures,
        FilterCandidates,
        LookupFeatures,
        SoftmaxSampling,
        TopKCandidates,
        UnrollCandidates,
    )
    from merlin_torch_serving.ops import (
        DecodeItemIds,
        PredictPytorch,
        RetrieveTopK,
        ServingOperator,
        TopK,
        TransformWorkflow,
    )
    from merlin_torch_serving.retrieval import ExactIndex, HNSWIndex, IVFIndex
    from merlin_torch_serving.routing import (
        AllItemsUnknown,
        Experiment,
        FewerKnownItems,
        FilteredOut,
        ItemPopularity,
        MostPopular,
        Predicate,
        Route,
    )
    from merlin_torch_serving.scoring.dataset import ScoringProgress, ScoringResult, score_dataset
    from merlin_torch_serving.stores.base import Store
    from merlin_torch_serving.stores.opening import open_store
    from merlin_torch_serving.stores.settings import EmbeddedSettings, RedisSettings
