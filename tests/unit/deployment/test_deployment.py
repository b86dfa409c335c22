"""The deployment files: rendered from one place, the repository's deploy/ equal to the defaults,
every Kubernetes object valid against Kubernetes' own schemas (offline, kubernetes-validate), the
KServe InferenceService's pod and container parts too, and the Dockerfile copying only what exists.
"""

import re
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, schema_contents
from referencing import Registry, Resource

from merlin_torch_serving.cli import main
from merlin_torch_serving.deployment import deploy_files

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
KUBERNETES = latest_version()


def documents(text):
    return [document for document in yaml.safe_load_all(text) if document]


def test_the_repositorys_deploy_folder_is_what_the_defaults_render():
    rendered = deploy_files.render()
    on_disk = {path.relative_to(DEPLOY).as_posix() for path in DEPLOY.rglob("*") if path.is_file()}
    assert on_disk == set(rendered), (
        "deploy/ differs from deploy_files.render(): run `merlin-torch-serving deploy-files deploy`"
    )
    for relative, text in rendered.items():
        assert (DEPLOY / relative).read_text() == text, (
            f"deploy/{relative} is stale: run `merlin-torch-serving deploy-files deploy`"
        )


@pytest.mark.parametrize(
    "relative", sorted(path for path in deploy_files.render() if path.startswith("k8s/"))
)
def test_kubernetes_manifests_validate_offline(relative):
    for document in documents(deploy_files.render()[relative]):
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_manifests_agree_on_ports_probes_shared_memory_and_scaling():
    rendered = deploy_files.render()
    (deploy,) = documents(rendered["k8s/deployment.yaml"])
    (service,) = documents(rendered["k8s/service.yaml"])
    (hpa,) = documents(rendered["k8s/hpa.yaml"])
    (pdb,) = documents(rendered["k8s/pdb.yaml"])
    (rules,) = documents(rendered["k8s/prometheus-adapter-rules.yaml"])
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {port["name"]: port["port"] for port in service["spec"]["ports"]} == ports
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    labels = deploy["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == labels == pdb["spec"]["selector"]["matchLabels"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    (rule,) = yaml.safe_load(rules["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric
    assert "nv_inference_queue_duration_us" in rule["metricsQuery"]


def test_the_inference_services_pod_and_container_parts_validate_against_kubernetes_schemas():
    (service,) = documents(deploy_files.render()["kserve/inferenceservice.yaml"])
    assert (service["apiVersion"], service["kind"]) == (
        "serving.kserve.io/v1beta1",
        "InferenceService",
    )
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": service["metadata"]}, KUBERNETES
    )
    predictor = dict(service["spec"]["predictor"])
    model = dict(predictor.pop("model"))
    # KServe's own fields (v1beta1 ModelSpec and ComponentExtensionSpec); the rest is Kubernetes'
    kserve_model_fields = {
        "modelFormat",
        "runtime",
        "protocolVersion",
        "runtimeVersion",
        "storageUri",
    }
    kserve_component_fields = {
        "minReplicas",
        "maxReplicas",
        "scaleTarget",
        "scaleMetric",
        "containerConcurrency",
    }
    assert model["modelFormat"] == {"name": "triton"}
    assert model["protocolVersion"] == "v2"
    assert model["storageUri"].startswith("s3://")
    container = {key: value for key, value in model.items() if key not in kserve_model_fields}
    pod = {key: value for key, value in predictor.items() if key not in kserve_component_fields}
    _validate_definition("io.k8s.api.core.v1.Container", {"name": "kserve-container", **container})
    _validate_definition(
        "io.k8s.api.core.v1.PodSpec",
        {**pod, "containers": [{"name": "kserve-container", **container}]},
    )


def _validate_definition(definition, data):
    schemas = schema_contents(
        f"kubernetes-json-schema/v{KUBERNETES}-local-strict/_definitions.json", KUBERNETES
    )
    registry = Resource.from_contents(schemas) @ Registry()
    schema = {"$ref": f"{schemas['$id']}#/$defs/{definition}"}
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(data)


def test_a_broken_manifest_is_refused():
    (deploy,) = documents(deploy_files.render()["k8s/deployment.yaml"])
    deploy["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {
        "named": "http"
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBERNETES, strict=True)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.libtorch"])
def test_the_dockerfiles_copy_only_files_of_the_repository(dockerfile):
    text = (DEPLOY / dockerfile).read_text()
    sources = []
    for line in re.findall(r"^(?:COPY|ADD)\s+(.+)$", text, flags=re.MULTILINE):
        words = shlex.split(line)
        if any(word.startswith("--from=") for word in words):
            continue  # from an earlier stage of the build, not the repository
        sources += [word for word in words if not word.startswith("--")][:-1]
    assert sources, "the Dockerfile copies nothing from the repository"
    for source in sources:
        assert (ROOT / source).exists(), (
            f"deploy/{dockerfile} copies {source!r}, which the repository does not have"
        )
    assert re.search(r"^FROM python:3\.11", text, flags=re.MULTILINE)
    assert "build-backend pytorch" in text


def test_the_python_image_serves_through_the_library():
    text = (DEPLOY / "Dockerfile").read_text()
    assert '".[server,s3]"' in text
    assert "merlin-torch-serving serve" in text


def test_the_libtorch_image_carries_no_python_and_runs_tritonserver_itself():
    text = (DEPLOY / "Dockerfile.libtorch").read_text()
    final = text[text.rindex("\nFROM ") :]  # the image that runs: its last stage
    assert final.startswith("\nFROM debian:bookworm-slim")
    assert not re.search(r"python|pip|venv", final.replace("/pytriton/", "/"))
    assert f"COPY --from=build {deploy_files.RUNTIME_DIR} {deploy_files.RUNTIME_DIR}" in final
    assert "lay_out_libtorch_runtime" in text  # the build stage lays the runtime out
    entrypoint = next(line for line in final.splitlines() if line.startswith("ENTRYPOINT "))
    assert f"{deploy_files.RUNTIME_DIR}/pytriton/tritonserver/bin/tritonserver" in entrypoint
    assert f"--backend-directory={deploy_files.RUNTIME_DIR}/backends" in entrypoint


def test_deploy_files_renders_the_settings_given(tmp_path, capsys):
    assert (
        main(
            [
                "deploy-files",
                str(tmp_path),
                "--image",
                "registry.example/reco:7",
                "--repository",
                "s3://b/m",
                "--replicas",
                "3",
            ]
        )
        == 0
    )
    (deploy,) = documents((tmp_path / "k8s" / "deployment.yaml").read_text())
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/reco:7"
    assert deploy["spec"]["replicas"] == 3
    assert {"name": "MODEL_REPOSITORY", "value": "s3://b/m"} in container["env"]
    (hpa,) = documents((tmp_path / "k8s" / "hpa.yaml").read_text())
    assert hpa["spec"]["minReplicas"] == 3
    assert str(tmp_path / "Dockerfile") in capsys.readouterr().out


def entrypoint_serve_arguments(dockerfile: str) -> list[str]:
    """The arguments the image's ENTRYPOINT gives ``merlin-torch-serving`` (its shell line)."""
    line = next(line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT"))
    command = yaml.safe_load(line.removeprefix("ENTRYPOINT "))[2]
    return shlex.split(command.removeprefix("exec merlin-torch-serving "))[:-1]


def test_the_image_serves_every_interface_with_the_admin_apis_restricted():
    from merlin_torch_serving.cli.arguments import build_parser
    from merlin_torch_serving.launcher.access import DEFAULT_RESTRICTED_APIS

    arguments = entrypoint_serve_arguments(deploy_files.render()["Dockerfile"])
    parsed = build_parser().parse_args(arguments)
    assert (parsed.command, parsed.host) == ("serve", "0.0.0.0")
    assert parsed.restricted_apis == DEFAULT_RESTRICTED_APIS


def test_the_pods_take_the_admin_key_from_a_secret_they_cannot_start_without():
    rendered = deploy_files.render()
    (deploy,) = documents(rendered["k8s/deployment.yaml"])
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    (isvc,) = documents(rendered["kserve/inferenceservice.yaml"])
    model = isvc["spec"]["predictor"]["model"]
    expected = {
        "name": "MTS_ADMIN_KEY",
        "valueFrom": {
            "secretKeyRef": {
                "name": "merlin-torch-serving-admin",
                "key": "admin-key",
                "optional": False,
            }
        },
    }
    assert expected in container["env"]
    assert expected in model["env"]


def test_kserves_stock_tritonserver_restricts_the_admin_apis_with_the_secrets_key():
    (isvc,) = documents(deploy_files.render()["kserve/inferenceservice.yaml"])
    arguments = isvc["spec"]["predictor"]["model"]["args"]
    rule = "model-repository,shared-memory,statistics,trace,logging:mts-admin-key=$(MTS_ADMIN_KEY)"
    assert arguments == [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]
