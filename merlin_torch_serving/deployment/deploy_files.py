"""Deployment files from one place: a container image recipe, Kubernetes manifests and a KServe
``InferenceService``, all agreeing on the ports, the model repository, shared memory and the cache.

``render(DeploySettings(...))`` returns every file as text, keyed by its path under ``deploy/``;
``merlin-torch-serving deploy-files OUT`` writes them. The repository's own ``deploy/`` folder is
``render(DeploySettings())`` (a test keeps the two equal), so edit here, not there.

    Dockerfile                         CPU image: Python 3.11, this library, the bundled
                                       tritonserver, Triton's libtorch backend built for its torch
    Dockerfile.libtorch                CPU image without Python, for exports whose steps are all
                                       libtorch models: tritonserver and the pytorch backend alone
    k8s/deployment.yaml                `merlin-torch-serving serve` on the repository URL; probes on
                                       Triton's health endpoints; /dev/shm in memory; resources;
                                       the admin key from a Secret
    k8s/service.yaml                   HTTP, gRPC and metrics ports (Prometheus scrape annotations)
    k8s/hpa.yaml                       scales on Triton's mean queue time per request
    k8s/pdb.yaml                       keeps all but one replica through voluntary disruptions
    k8s/prometheus-adapter-rules.yaml  the rule that turns Triton's counters into the HPA's metric
    kserve/inferenceservice.yaml       KServe's stock Triton runtime on a bundled repository, its
                                       admin APIs restricted with the same key
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from merlin_torch_serving.launcher.access import (
    ADMIN_KEY_ENV_VAR,
    DEFAULT_RESTRICTED_APIS,
    restriction_args,
)

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
#: where the image keeps the python-backend layout and the libtorch backend it built
IMAGE_CACHE_DIR = "/opt/merlin-torch-serving/cache"
#: where the image without Python keeps tritonserver and the pytorch backend (backends.runtime)
RUNTIME_DIR = "/opt/triton"
#: the HPA's metric: Triton's mean queue time per request over the last minute, in microseconds
QUEUE_METRIC = "triton_queue_us_per_request"


@dataclasses.dataclass(frozen=True)
class DeploySettings:
    """What differs between deployments; every file is rendered from these."""

    name: str = "merlin-torch-serving"
    namespace: str = "default"
    image: str = "merlin-torch-serving:0.1.0"
    #: the model repository: an s3://, gs:// or as:// URL the server reads (credentials from
    # ``secret``)
    repository: str = "s3://models/session-recommender"
    #: a bundled copy (``merlin-torch-serving bundle``) for KServe, whose Triton image lacks this
    # library
    bundled_repository: str = "s3://models/session-recommender-bundled"
    #: a Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION (optional in the
    # pod)
    secret: str = "model-store-credentials"
    #: a Secret whose ``admin-key`` entry is the key the admin APIs (model repository, shared
    # memory, statistics, trace, logging) want; the pods do not start without it, so no replica
    # ever runs with them open
    admin_secret: str = "merlin-torch-serving-admin"
    replicas: int = 2
    max_replicas: int = 8
    cpu: str = "2"
    memory: str = "4Gi"
    #: the python backend's shared memory: every request's tensors pass through it
    shm_size: str = "1Gi"
    #: scale out when requests wait longer than this in Triton's queue, on average
    queue_target_us: int = 20000
    #: NVIDIA's tritonserver release KServe runs: 24.10 is tritonserver 2.51, whose python-backend
    # stubs
    #: nvidia-pytriton ships (bundles carry one of them)
    triton_runtime_version: str = "24.10-py3"


def render(settings: DeploySettings = DeploySettings()) -> dict[str, str]:
    """Every deployment file: relative path -> text."""
    header = (
        "# Rendered by merlin_torch_serving.deployment.deploy_files"
        " (merlin-torch-serving deploy-files); edit there.\n"
    )
    files = {
        "Dockerfile": header + dockerfile(settings),
        "Dockerfile.libtorch": header + libtorch_dockerfile(settings),
    }
    for path, documents in {
        "k8s/deployment.yaml": [deployment(settings)],
        "k8s/service.yaml": [service(settings)],
        "k8s/hpa.yaml": [autoscaler(settings)],
        "k8s/pdb.yaml": [disruption_budget(settings)],
        "k8s/prometheus-adapter-rules.yaml": [adapter_rules(settings)],
        "kserve/inferenceservice.yaml": [inference_service(settings)],
    }.items():
        files[path] = header + yaml.safe_dump_all(documents, sort_keys=False)
    return files


def write(out: str | Path, settings: DeploySettings = DeploySettings()) -> list[Path]:
    """Write ``render(settings)`` under ``out``; returns the paths written."""
    written = []
    for relative, text in render(settings).items():
        path = Path(out) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def dockerfile(settings: DeploySettings) -> str:
    """Two stages: the first installs and builds (compilers, git), the second only runs.

    Build from the repository's root: ``docker build -f deploy/Dockerfile .``. torch is pinned to
    the CPU wheel by constraints.txt; pass the index that serves it (PyTorch's CPU wheel index) as
    ``--build-arg PIP_EXTRA_INDEX_URL=...``, or pip fetches the CUDA build.
    """
    return f"""\
{_build_stage()}RUN pip install -c constraints.txt ".[server,s3]"
# merlin-core breaks when this package is present; nothing here needs it
RUN pip uninstall --yes rapids-dask-dependency
# the python-backend layout for this Python and the libtorch backend, into MTS_CACHE_DIR
RUN merlin-torch-serving build-backend pytorch \\
    && python -c "from merlin_torch_serving.backends.layout import python_backend_directory as d; print(d())"

FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 1000 triton
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=1000:1000 {IMAGE_CACHE_DIR} {IMAGE_CACHE_DIR}
ENV PATH=/opt/venv/bin:$PATH MTS_CACHE_DIR={IMAGE_CACHE_DIR} PYTHONUNBUFFERED=1
USER 1000
EXPOSE {HTTP_PORT} {GRPC_PORT} {METRICS_PORT}
# the model repository (a folder mounted into the container, or an s3://, gs://, as:// URL)
ENV MODEL_REPOSITORY=/models
# every interface of the container (its network is the pod's); the admin APIs want the key in
# $MTS_ADMIN_KEY, or one made at start and known to nobody when it is unset
ENTRYPOINT ["/bin/sh", "-c", "exec merlin-torch-serving serve \\"$MODEL_REPOSITORY\\" --host 0.0.0.0 --http-port {HTTP_PORT} --grpc-port {GRPC_PORT} --metrics-port {METRICS_PORT} \\"$@\\"", "serve"]
"""  # noqa: E501 - the Dockerfile as it is written


def _build_stage() -> str:
    """The first stage of both images up to installing the library: a virtualenv with the pinned
    pip, the tools that build Triton's libtorch backend, and the library's sources."""
    return f"""\
FROM python:3.11-slim-bookworm AS build
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_EXTRA_INDEX_URL=${{PIP_EXTRA_INDEX_URL}} PIP_NO_CACHE_DIR=1 MTS_CACHE_DIR={IMAGE_CACHE_DIR}
# cmake, a compiler, git and RapidJSON build Triton's libtorch backend for this torch
RUN apt-get update && apt-get install -y --no-install-recommends \\
        build-essential cmake ninja-build git rapidjson-dev ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# pip 26.1 and newer refuse the metadata of merlin's packages
RUN pip install "pip>=23.2,<26.1"
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY merlin_torch_serving ./merlin_torch_serving
"""


def libtorch_dockerfile(settings: DeploySettings) -> str:
    """An image without Python, for exports whose steps are all libtorch models
    (``TransformWorkflow(..., backend="pytorch")`` with the model on libtorch): the first stage
    installs the library and builds the backend, as ``dockerfile`` does, and lays out the runtime
    (``backends.runtime``: tritonserver, its libraries, the pytorch backend and the part of
    libtorch it loads); the second copies that folder onto Debian and runs tritonserver itself.
    The same deployment manifests run it (set ``image``)."""
    return f"""\
{_build_stage()}RUN pip install -c constraints.txt ".[server]"
# the backend for this torch, then the runtime: no Python is copied into the image below
RUN merlin-torch-serving build-backend pytorch \\
    && python -c "from merlin_torch_serving.backends.runtime import lay_out_libtorch_runtime as f; f('{RUNTIME_DIR}')"

FROM debian:bookworm-slim
RUN useradd --create-home --uid 1000 triton
COPY --from=build {RUNTIME_DIR} {RUNTIME_DIR}
USER 1000
EXPOSE {HTTP_PORT} {GRPC_PORT} {METRICS_PORT}
# the model repository (a folder mounted into the container, or an s3://, gs://, as:// URL) of an
# export whose steps are all libtorch models
ENV MODEL_REPOSITORY=/models
ENTRYPOINT ["/bin/sh", "-c", "exec {RUNTIME_DIR}/pytriton/tritonserver/bin/tritonserver --model-repository=\\"$MODEL_REPOSITORY\\" --backend-directory={RUNTIME_DIR}/backends --http-port={HTTP_PORT} --grpc-port={GRPC_PORT} --metrics-port={METRICS_PORT} \\"$@\\"", "tritonserver"]
"""  # noqa: E501 - the Dockerfile as it is written


def _labels(settings: DeploySettings) -> dict:
    return {"app.kubernetes.io/name": settings.name, "app.kubernetes.io/component": "triton"}


def _metadata(settings: DeploySettings, name: str | None = None) -> dict:
    return {
        "name": name or settings.name,
        "namespace": settings.namespace,
        "labels": _labels(settings),
    }


def _ports() -> list[dict]:
    return [
        {"name": "http", "containerPort": HTTP_PORT},
        {"name": "grpc", "containerPort": GRPC_PORT},
        {"name": "metrics", "containerPort": METRICS_PORT},
    ]


def _shm_volume(settings: DeploySettings) -> dict:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}}


def _resources(settings: DeploySettings) -> dict:
    # requests = limits: the Guaranteed QoS class, so the pod is the last one evicted and its
    # CPU share is what the single torch thread per instance was sized for
    amounts = {"cpu": settings.cpu, "memory": settings.memory}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def deployment(settings: DeploySettings) -> dict:
    probe = lambda path, period, failures: {  # noqa: E731
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }
    container = {
        "name": "triton",
        "image": settings.image,
        "env": [
            {"name": "MODEL_REPOSITORY", "value": settings.repository},
            _admin_key_env(settings),
        ],
        "envFrom": [{"secretRef": {"name": settings.secret, "optional": True}}],
        "ports": _ports(),
        # loading, bundle extraction and warm-up may take minutes: liveness waits for startup
        "startupProbe": probe("/v2/health/ready", 5, 120),
        "readinessProbe": probe("/v2/health/ready", 5, 3),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "resources": _resources(settings),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(settings),
        "spec": {
            "replicas": settings.replicas,
            "selector": {"matchLabels": _labels(settings)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": _labels(settings)},
                "spec": {
                    # tritonserver's own exit timeout is 30 s; the stubs need a moment more
                    "terminationGracePeriodSeconds": 45,
                    "containers": [container],
                    "volumes": [_shm_volume(settings)],
                },
            },
        },
    }


def _admin_key_env(settings: DeploySettings) -> dict:
    """$MTS_ADMIN_KEY from the admin Secret; not optional, so a pod without it does not start."""
    return {
        "name": ADMIN_KEY_ENV_VAR,
        "valueFrom": {
            "secretKeyRef": {"name": settings.admin_secret, "key": "admin-key", "optional": False}
        },
    }


def service(settings: DeploySettings) -> dict:
    metadata = _metadata(settings)
    metadata["annotations"] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "selector": _labels(settings),
            "ports": [
                {"name": port["name"], "port": port["containerPort"], "targetPort": port["name"]}
                for port in _ports()
            ],
        },
    }


def autoscaler(settings: DeploySettings) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(settings),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": settings.name,
            },
            "minReplicas": settings.replicas,
            "maxReplicas": settings.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(settings.queue_target_us),
                        },
                    },
                }
            ],
            # scale in slowly: a new pod loads its models and warms up before it is ready
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def disruption_budget(settings: DeploySettings) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(settings),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels(settings)}},
    }


def adapter_rules(settings: DeploySettings) -> dict:
    """prometheus-adapter's rule for the HPA's metric: queue time over successful requests."""
    rule = {
        "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
        "resources": {
            "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        },
        "name": {"matches": "^nv_inference_queue_duration_us$", "as": QUEUE_METRIC},
        "metricsQuery": (
            "sum(rate(nv_inference_queue_duration_us{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>) /"
            " clamp_min(sum(rate(nv_inference_request_success{<<.LabelMatchers>>}[1m])) by"
            " (<<.GroupBy>>), 1e-9)"
        ),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(settings, f"{settings.name}-adapter-rules"),
        "data": {"config.yaml": yaml.safe_dump({"rules": [rule]}, sort_keys=False)},
    }


def inference_service(settings: DeploySettings) -> dict:
    """KServe's Triton runtime (NVIDIA's image, whose Python lacks this library) on a bundled
    repository: each python step carries its own environment and stub (EXECUTION_ENV_PATH)."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": _metadata(settings),
        "spec": {
            "predictor": {
                "minReplicas": settings.replicas,
                "maxReplicas": settings.max_replicas,
                "model": {
                    "modelFormat": {"name": "triton"},
                    "protocolVersion": "v2",
                    "runtimeVersion": settings.triton_runtime_version,
                    "storageUri": settings.bundled_repository,
                    # the stock runtime's tritonserver, restricted as `serve` restricts it;
                    # Kubernetes puts the Secret's key in place of $(MTS_ADMIN_KEY)
                    "args": restriction_args(f"$({ADMIN_KEY_ENV_VAR})", DEFAULT_RESTRICTED_APIS),
                    "env": [_admin_key_env(settings)],
                    "resources": _resources(settings),
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                },
                "volumes": [_shm_volume(settings)],
            }
        },
    }
