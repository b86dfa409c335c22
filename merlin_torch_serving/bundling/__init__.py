"""Making a model repository self-sufficient: a packed Python environment (``environment``) placed
in every python step with the stub that runs it (``repository``)."""

from merlin_torch_serving.bundling.environment import (
    PackedEnvironment,
    pack_environment,
    serving_distributions,
)
from merlin_torch_serving.bundling.repository import BundleResult, bundle_repository

__all__ = [
    "BundleResult",
    "PackedEnvironment",
    "bundle_repository",
    "pack_environment",
    "serving_distributions",
]
