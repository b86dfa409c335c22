"""Generated configs against reviewed golden files (set MTS_UPDATE_GOLDEN=1 to rewrite them)."""

import os
from pathlib import Path

import pytest

from merlin_torch_serving import Ensemble, ModelOptions
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.ensemble_wiring import ensemble_config
from tests import toy_session

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def exported(toy_workflow, toy_model, tmp_path_factory):
    repository = tmp_path_factory.mktemp("golden") / "repository"
    mixed = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"),
        toy_workflow.input_schema,
    )
    fused = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    mixed.export(repository, "mixed")
    fused.export(repository, "fused")
    return repository


MODELS = [
    "mixed",
    "mixed-0-transformworkflow",
    "mixed-1-predictpytorch_topk",  # TopK compiled into the libtorch model
    "fused",
    "fused-0-transformworkflow_predictpytorch_topk",
]


@pytest.mark.parametrize("model", MODELS)
def test_generated_config_matches_golden_file(exported, model):
    generated = (exported / model / "config.pbtxt").read_text()
    golden = GOLDEN / f"{model}.pbtxt"
    if os.environ.get("MTS_UPDATE_GOLDEN"):
        golden.write_text(generated)
    assert generated == golden.read_text()


def test_golden_configs_parse_as_triton_model_configs():
    for model in MODELS:
        config = configs.from_pbtxt((GOLDEN / f"{model}.pbtxt").read_text())
        assert config.name == model


def test_model_options_reject_nonsense():
    with pytest.raises(ValueError, match="instance_count must be at least 1, got 0"):
        ModelOptions(instance_count=0)
    with pytest.raises(ValueError, match="warmup_count must be 0 or more, got -1"):
        ModelOptions(warmup_count=-1)
    with pytest.raises(ValueError, match="torch_threads must be at least 1 or None, got 0"):
        ModelOptions(torch_threads=0)


def test_warmup_can_be_turned_off(toy_workflow, toy_model, tmp_path):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    ensemble.export(tmp_path, "cold", options=ModelOptions(warmup_count=0))
    text = (tmp_path / "cold-0-transformworkflow_predictpytorch_topk" / "config.pbtxt").read_text()
    assert "model_warmup" not in text


@pytest.mark.parametrize(
    ("backend", "model", "parameter"),
    [
        (
            "python",
            "threads-0-transformworkflow_predictpytorch_topk",
            configs.TORCH_THREADS_PARAMETER,
        ),
        ("pytorch", "threads-1-predictpytorch_topk", "INTRA_OP_THREAD_COUNT"),
    ],
)
def test_torch_threads_reach_the_model_config(
    toy_workflow, toy_model, tmp_path, backend, model, parameter
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend=backend),
        toy_workflow.input_schema,
    )
    ensemble.export(tmp_path / "default", "threads")
    ensemble.export(tmp_path / "two", "threads", options=ModelOptions(torch_threads=2))
    ensemble.export(tmp_path / "torch", "threads", options=ModelOptions(torch_threads=None))

    def parameters(folder):
        return configs.from_pbtxt(
            (tmp_path / folder / model / "config.pbtxt").read_text()
        ).parameters

    assert (
        parameters("default")[parameter].string_value == "1"
    )  # one thread per instance unless asked
    assert parameters("two")[parameter].string_value == "2"
    assert parameter not in parameters("torch")  # torch's own default


def test_model_options_pass_through_to_every_config(toy_workflow, toy_model, tmp_path):
    options = ModelOptions(
        instance_count=2,
        instance_kind="KIND_AUTO",
        version_policy=[1, 2],
        response_cache=True,
        rate_limiter={"resources": [{"name": "cpu_slot", "count": 1}], "priority": 2},
        parameters={"shm-default-byte-size": "1048576"},
        execution_env="$$TRITON_MODEL_DIRECTORY/python-env",
        metrics=False,
    )
    graph = toy_session.session_graph(toy_workflow, toy_model, backend="pytorch")
    Ensemble(graph, toy_workflow.input_schema).export(tmp_path, "opts", options=options)
    python_step = configs.from_pbtxt(
        (tmp_path / "opts-0-transformworkflow" / "config.pbtxt").read_text()
    )
    libtorch_step = configs.from_pbtxt(
        (tmp_path / "opts-1-predictpytorch_topk" / "config.pbtxt").read_text()
    )
    ensemble = configs.from_pbtxt((tmp_path / "opts" / "config.pbtxt").read_text())
    for step in (python_step, libtorch_step):
        (group,) = step.instance_group
        assert (group.kind, group.count) == (group.KIND_AUTO, 2)
        assert [(r.name, r.count) for r in group.rate_limiter.resources] == [("cpu_slot", 1)]
        assert group.rate_limiter.priority == 2
        assert step.parameters["shm-default-byte-size"].string_value == "1048576"
        assert list(step.version_policy.specific.versions) == [1, 2]
    assert (
        python_step.parameters["EXECUTION_ENV_PATH"].string_value
        == "$$TRITON_MODEL_DIRECTORY/python-env"
    )
    assert "EXECUTION_ENV_PATH" not in libtorch_step.parameters  # a python-backend setting
    assert python_step.parameters[configs.METRICS_PARAMETER].string_value == "false"
    assert ensemble.response_cache.enable
    assert not python_step.response_cache.enable
    assert list(ensemble.version_policy.specific.versions) == [1, 2]


@pytest.mark.parametrize(
    ("policy", "field", "value"),
    [("all", "all", None), (3, "latest", 3), (None, None, None)],
)
def test_version_policy_forms(policy, field, value):
    config = ensemble_config(
        "e", *_tiny_schemas(), [], ["session_id"], ModelOptions(version_policy=policy)
    )
    assert config.version_policy.WhichOneof("policy_choice") == field
    if field == "latest":
        assert config.version_policy.latest.num_versions == value


def _tiny_schemas():
    from merlin.schema import ColumnSchema, Schema

    schema = Schema([ColumnSchema("x", dtype="int64")])
    return schema, schema, schema


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"instance_kind": "gpu"}, r"instance_kind must be one of \('KIND_CPU'"),
        ({"version_policy": 0}, "version_policy must be None, 'all', a number of newest versions"),
        ({"version_policy": []}, "version_policy must be None"),
        (
            {"rate_limiter": {"slots": 1}},
            r"rate_limiter is not valid in a Triton model config: .*no field named \"slots\"",
        ),
        (
            {"parameters": {"INTRA_OP_THREAD_COUNT": "2"}},
            r"parameters \['INTRA_OP_THREAD_COUNT'\] are set through ModelOptions' own fields",
        ),
        (
            {"parameters": {"merlin_torch_serving.metrics": "no"}},
            r"are set through ModelOptions' own fields .*metrics\)",
        ),
    ],
)
def test_model_options_reject_nonsense_passthrough(options, message):
    with pytest.raises(ValueError, match=message):
        ModelOptions(**options)
