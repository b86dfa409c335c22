"""Triton backends for the bundled tritonserver: laying out its backend folder (``layout``), what
the nvidia-pytriton wheel provides (``bundle``), and building the pytorch backend
(``pytorch_build``).
"""

from merlin_torch_serving.backends.layout import (
    bundled_backend_directory,
    python_backend_directory,
    pytorch_backend_directory,
)
from merlin_torch_serving.backends.pytorch_build import (
    BuiltBackend,
    build_pytorch_backend,
    built_for_running_torch,
    built_pytorch_backend,
)

__all__ = [
    "BuiltBackend",
    "build_pytorch_backend",
    "built_for_running_torch",
    "built_pytorch_backend",
    "bundled_backend_directory",
    "python_backend_directory",
    "pytorch_backend_directory",
]
