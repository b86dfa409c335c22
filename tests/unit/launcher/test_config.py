"""The launcher's options and the tritonserver command line they make, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_torch_serving.launcher.config import Ports, ServerConfig
from merlin_torch_serving.launcher.server import TritonServer

BINARY = Path("/opt/tritonserver/bin/tritonserver")
BACKENDS = Path("/opt/tritonserver/backends")
PORTS = Ports(http=8000, grpc=8001, metrics=8002)


def command(config: ServerConfig, shm_prefix: str | None = "mts_1_") -> list[str]:
    return config.command(BINARY, BACKENDS, PORTS, shm_prefix)


def option(arguments: list[str], name: str) -> list[str]:
    return [
        argument.split("=", 1)[1] for argument in arguments if argument.startswith(f"--{name}=")
    ]


def test_the_command_names_the_repository_backends_and_ports(tmp_path):
    arguments = command(ServerConfig(tmp_path))
    assert arguments[0] == str(BINARY)
    assert option(arguments, "model-repository") == [str(tmp_path.resolve())]
    assert option(arguments, "backend-directory") == [str(BACKENDS)]
    assert (
        option(arguments, "http-port"),
        option(arguments, "grpc-port"),
        option(arguments, "metrics-port"),
    ) == (
        ["8000"],
        ["8001"],
        ["8002"],
    )
    # one bad model must not take the others down
    assert option(arguments, "exit-on-error") == ["false"]


def test_a_relative_repository_is_given_to_the_server_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert option(command(ServerConfig("models")), "model-repository") == [
        str(tmp_path.resolve() / "models")
    ]


def test_an_object_store_repository_is_given_to_the_server_as_the_url_it_is():
    assert option(command(ServerConfig("s3://bucket/models")), "model-repository") == [
        "s3://bucket/models"
    ]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # "none" runs explicit mode with every model loaded, so a failed model can be reloaded alone
        ("none", ["--model-control-mode=explicit", "--load-model=*"]),
        ("explicit", ["--model-control-mode=explicit"]),
        ("poll", ["--model-control-mode=poll", "--repository-poll-secs=3"]),
    ],
)
def test_each_model_control_mode_becomes_its_server_options(tmp_path, mode, expected):
    arguments = command(ServerConfig(tmp_path, model_control=mode, poll_interval_s=3))
    assert [
        a
        for a in arguments
        if a.startswith(("--model-control-mode", "--load-model", "--repository-poll"))
    ] == expected


def test_models_to_load_at_start_are_loaded_through_the_admin_api_not_the_command_line(tmp_path):
    arguments = command(ServerConfig(tmp_path, model_control="explicit", load_models=["a", "b"]))
    assert option(arguments, "load-model") == []


def test_the_server_gets_three_quarters_of_the_stop_timeout_to_exit_on_its_own(tmp_path):
    assert option(command(ServerConfig(tmp_path, stop_timeout_s=20)), "exit-timeout-secs") == ["15"]
    assert option(command(ServerConfig(tmp_path, stop_timeout_s=0.5)), "exit-timeout-secs") == ["1"]


def test_the_shared_memory_prefix_is_passed_to_the_python_backend_unless_the_caller_names_it(
    tmp_path,
):
    config = ServerConfig(tmp_path)
    assert not config.names_shared_memory
    assert option(command(config, "mts_7_"), "backend-config") == [
        "python,shm-region-prefix-name=mts_7_"
    ]

    own = "--backend-config=python,shm-region-prefix-name=mine_"
    theirs = ServerConfig(tmp_path, extra_args=[own])
    assert theirs.names_shared_memory
    assert [a for a in command(theirs, None) if "shm-region-prefix-name" in a] == [own]


def test_extra_arguments_come_last_so_they_override_the_launchers(tmp_path):
    arguments = command(ServerConfig(tmp_path, log_verbose=1, extra_args=["--log-verbose=2", 7]))
    assert arguments[-2:] == ["--log-verbose=2", "7"]
    assert option(arguments, "log-verbose") == ["1", "2"]


def test_unset_ports_are_filled_in_order_from_the_assigned_ones(tmp_path):
    config = ServerConfig(tmp_path, grpc_port=9001)
    assert config.requested_ports == {"http": None, "grpc": 9001, "metrics": None}
    assert config.ports([5000, 5002]) == Ports(http=5000, grpc=9001, metrics=5002)


def test_options_are_normalized(tmp_path):
    config = ServerConfig(
        str(tmp_path),
        model_control="explicit",
        load_models=["a"],
        poll_interval_s=2.0,
        start_timeout_s=5,
        log_path="x.log",
    )
    assert (config.repository, config.load_models, config.poll_interval_s, config.log_path) == (
        tmp_path,
        ("a",),
        2,
        Path("x.log"),
    )
    assert isinstance(config.poll_interval_s, int)
    assert isinstance(config.start_timeout_s, float)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"model_control": "sometimes"},
            ValueError,
            r"model_control must be one of \('none', 'explicit', 'poll'\), got 'sometimes'",
        ),
        (
            {"model_control": "explicit", "load_models": "reco"},
            TypeError,
            r"load_models must be a sequence of model names, got the string 'reco'",
        ),
        (
            {"load_models": ["reco"]},
            ValueError,
            r"load_models=\['reco'\] needs model_control='explicit'; with model_control='none'",
        ),
        (
            {"start_timeout_s": 0},
            ValueError,
            r"start_timeout_s must be a positive number of seconds, got 0",
        ),
        (
            {"stop_timeout_s": -1.0},
            ValueError,
            r"stop_timeout_s must be a positive number of seconds, got -1.0",
        ),
        (
            {"poll_interval_s": 0.5},
            ValueError,
            r"poll_interval_s must be a whole number of seconds, at least 1, got 0.5",
        ),
        (
            {"poll_interval_s": 0},
            ValueError,
            r"poll_interval_s must be a whole number of seconds, at least 1, got 0",
        ),
    ],
)
def test_bad_options_are_refused_when_the_server_is_created_naming_the_option(
    tmp_path, options, error, message
):
    with pytest.raises(error, match=message):
        ServerConfig(tmp_path, **options)
    with pytest.raises(error, match=message):
        TritonServer(tmp_path, **options)


def test_a_server_that_was_never_started_has_no_ports_yet(tmp_path):
    from merlin_torch_serving.exceptions import ServerError

    server = TritonServer(tmp_path)
    with pytest.raises(
        ServerError, match=r"the grpc port is chosen when the server starts; call start\(\) first"
    ):
        _ = server.grpc_url
    with pytest.raises(ServerError, match=r"tritonserver is not running; call start\(\)"):
        server.models()
