"""New experiment weights written into an exported repository: a file beside the route's step
config carries them, the step loads with them, and nothing the export wrote changes."""

import json

import pytest

from merlin_torch_serving import ArtifactError, Ensemble
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.manifest import verify_export
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.routing import Route, set_weights, weights_of
from tests import routed_graphs, toy_session


@pytest.fixture(scope="module")
def exported(filtered_toy_workflow, tmp_path_factory):
    workflow = filtered_toy_workflow
    model = toy_session.scripted_model(workflow)
    ensemble = Ensemble(routed_graphs.routed(workflow, model), workflow.input_schema)
    repository = tmp_path_factory.mktemp("routed")
    result = ensemble.export(repository, "routed")
    return repository, result


def route_of(step: HostedStep) -> Route:
    (route,) = [call.op for call in step.calls if isinstance(call.op, Route)]
    return route


def test_new_weights_go_beside_the_routing_steps_config_and_the_step_loads_with_them(exported):
    repository, _ = exported
    step = "routed-0-transformworkflow_route"
    # the export leaves the file in place, empty
    assert json.loads((repository / step / configs.CONFIG_OVERRIDES_FILE).read_text()) == {}
    assert weights_of(repository, "routed") == {"current": 0.5, "candidate": 0.5}
    step = set_weights(repository, "routed", {"current": 0.2, "candidate": 0.8})
    assert step == "routed-0-transformworkflow_route"
    assert weights_of(repository, "routed") == {"current": 0.2, "candidate": 0.8}
    overrides = json.loads((repository / step / configs.CONFIG_OVERRIDES_FILE).read_text())
    assert overrides == {"1": {"weights": {"current": 0.2, "candidate": 0.8}}}
    loaded = HostedStep.load(str(repository / step / "1"), overrides=overrides)
    assert dict(route_of(loaded).experiment.weights) == {"current": 0.2, "candidate": 0.8}
    verify_export(repository, "routed")  # every file the export wrote is as it was
    assert dict(route_of(HostedStep.load(str(repository / step / "1"))).experiment.weights) == {
        "current": 0.5,
        "candidate": 0.5,
    }


def test_weights_for_other_variants_or_experiments_are_refused(exported):
    repository, _ = exported
    with pytest.raises(ValueError, match=r"missing: \['candidate'\], unknown: \['other'\]"):
        set_weights(repository, "routed", {"current": 1, "other": 1})
    with pytest.raises(ValueError, match=r"has 0 route\(s\) with experiment 'nope'"):
        set_weights(repository, "routed", {"current": 1}, experiment="nope")
    with pytest.raises(ValueError, match=r"holds no export of ensemble 'missing'"):
        set_weights(repository, "missing", {"current": 1})


def test_a_step_refuses_overrides_of_settings_its_operators_keep_fixed(exported):
    repository, _ = exported
    step = "routed-0-transformworkflow_route"
    with pytest.raises(ArtifactError, match=r"overrides \['fast_path'\] of operator Transform"):
        HostedStep.load(str(repository / step / "1"), overrides={"0": {"fast_path": False}})
    with pytest.raises(ArtifactError, match=r"overrides \['fallback'\].*only 'weights'"):
        HostedStep.load(str(repository / step / "1"), overrides={"1": {"fallback": None}})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"1": {"weights": ', r"config_overrides.json' is not valid JSON \(Expecting value"),
        ("[1, 2]", r"config_overrides.json' holds '\[1, 2\]', where an object of call index"),
    ],
)
def test_a_broken_overrides_file_is_named_with_what_is_wrong_in_it(exported, content, message):
    repository, _ = exported
    step = "routed-0-transformworkflow_route"
    path = repository / step / configs.CONFIG_OVERRIDES_FILE
    kept = path.read_text()
    path.write_text(content)
    try:
        expected = rf"step '{step}' cannot be loaded: its '.*{message}.*fix the file or remove it"
        with pytest.raises(ArtifactError, match=expected):
            weights_of(repository, "routed")
        with pytest.raises(ArtifactError, match=expected):
            set_weights(repository, "routed", {"current": 0.1, "candidate": 0.9})
    finally:
        path.write_text(kept)
