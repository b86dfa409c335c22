"""Examples of serving with merlin_torch_serving: a session-based and a ranking recommender, a
multi-stage pipeline, and a web service that asks a served ensemble."""

import warnings

# merlin-core (imported by NVTabular) warns that TensorFlow is missing; these examples use PyTorch
# only.
warnings.filterwarnings(
    "ignore", message="Tensorflow dtype mappings did not load", category=UserWarning
)
# NVTabular calls CPU mode experimental on every Dataset, its own outputs included; these examples
# run it on CPU on purpose.
warnings.filterwarnings(
    "ignore", message="Initializing an NVTabular Dataset in CPU mode", category=UserWarning
)
