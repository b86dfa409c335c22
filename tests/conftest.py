"""Session fixtures shared by every test folder.

``triton_server``: one tritonserver per test session, in explicit model-control mode on an empty
repository; tests write model folders into ``triton_server.repository`` (see
tests/triton_models.py) or export ensembles there, and load them by name.
``toy_workflow`` / ``toy_model``: the small session-based setup of tests/toy_session.py;
``filtered_toy_workflow`` the same workflow with a Filter that drops one-click sessions;
``toy_client`` its graph served as "toy-client" on ``triton_server``.
``session_split`` / ``session_workflow`` / ``xlnet`` / ``gpt2`` / ``torchscript_model``: the
session-based example's clicks, workflow and three next-item models (tests/session_models.py).
``pytorch_backend``: Triton's pytorch backend built for this torch; a test that needs it fails,
naming the command that builds it, when it is not. ``pytorch_only_server``: a second tritonserver
whose backend folder holds that backend alone, for exports with no python step.
``ranking``: the ranking example (examples/ranking) at test size, trained once.
``tiny_package``: a tiny model's AOTInductor package (tests/aot_models.py), compiled once (and
cached by content across runs).

Servers run without failover (``MTS_FAILOVER=0``) unless a test asks for it: each would start two
more stubs per python model.

Every test starts with one torch thread (``one_torch_thread``), as the library runs models by
default in-process and served: tests that call an exported module or step directly compare it bit
for bit with those paths, and a product split over another number of threads may round
differently (MKL on an AMD EPYC did, for 5 to 9 rows over 2 threads).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import pandas as pd
import pytest

from merlin_torch_serving.backends.pytorch_build import BUILD_COMMAND, built_for_running_torch
from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.graph.threads import torch_threads
from merlin_torch_serving.launcher.server import TritonServer
from tests import session_models, toy_session

# Failover gives every python model two more stubs, and the suite starts some fifty servers: off
# here (servers started by tests and the commands they run read it), on where it is tested.
os.environ.setdefault("MTS_FAILOVER", "0")
# An AOTInductor package takes a minute to compile: libtorch steps stay TorchScript unless a test
# asks for a package (compiled="auto" or "package"), as the tests of packages do.
os.environ.setdefault("MTS_COMPILED", "torchscript")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One torch thread for the test (the thread count is per calling thread), restored after."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A running tritonserver on ports the OS assigns.

    A server that cannot start fails the tests.
    """
    server = TritonServer(
        tmp_path_factory.mktemp("triton_repository"),
        model_control="explicit",
        start_timeout_s=120.0,
        # a test kills a stub here, and tritonserver never finishes unloading the instance it
        # served: stop() ends it once the other models unloaded, this bounds it should that fail
        stop_timeout_s=6.0,
    )
    yield from _running(server, "the shared tritonserver")


@pytest.fixture(scope="session")
def pytorch_only_server(tmp_path_factory, pytorch_backend):
    """A running tritonserver whose backend folder holds Triton's pytorch backend alone (no python
    backend at all), as a serving image without Python has; explicit model control.

    A server that cannot start fails the tests.
    """
    from merlin_torch_serving.backends import pytorch_backend_directory

    server = TritonServer(
        tmp_path_factory.mktemp("pytorch_only_repository"),
        model_control="explicit",
        backend_directory=pytorch_backend_directory(),
        start_timeout_s=120.0,
        stop_timeout_s=6.0,
    )
    yield from _running(server, "the pytorch-only tritonserver")


def _running(server: TritonServer, label: str):
    """``server`` started for a fixture and stopped after it; a start that fails fails the tests
    that use it (never a skip)."""
    try:
        server.start()
    except ServerError as error:
        pytest.fail(f"{label} could not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def toy_workflow(tmp_path_factory):
    return toy_session.fitted_workflow(tmp_path_factory.mktemp("toy_vocabularies"))


@pytest.fixture(scope="session")
def filtered_toy_workflow(tmp_path_factory):
    return toy_session.fitted_workflow(
        tmp_path_factory.mktemp("filtered_toy_vocabularies"), minimum_clicks=2
    )


@pytest.fixture(scope="session")
def toy_model(toy_workflow):
    """(TorchScript model, input schema, output schema)."""
    return toy_session.scripted_model(toy_workflow)


@pytest.fixture(scope="session")
def toy_client(triton_server, toy_workflow, toy_model):
    """The toy session graph (top 5) served as "toy-client" on the shared server, for the tests
    that only ask it (the clients', the web service example's): its Ensemble."""
    from merlin_torch_serving import Ensemble

    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, k=5), toy_workflow.input_schema
    )
    ensemble.export(triton_server.repository, "toy-client")
    triton_server.load("toy-client")
    return ensemble


@pytest.fixture(scope="session")
def pytorch_backend():
    """The cached build of Triton's pytorch backend.

    TritonServer lays it out for the bundled server.
    """
    built = built_for_running_torch()
    if built is None:
        pytest.fail(
            "Triton's pytorch (libtorch) backend is not built for this torch and the bundled"
            " tritonserver, so the libtorch tests cannot run. Build it once (under a minute) with"
            f" `./run {BUILD_COMMAND} --sources PATH`, PATH being Triton's pytorch_backend release"
            " sources (or leave --sources out to clone them; needs the network), or set"
            " MTS_PYTORCH_BACKEND_SOURCES=PATH and run `./run setup`",
            pytrace=False,
        )
    return built


@pytest.fixture(scope="session")
def tiny_package():
    from tests import aot_models

    return aot_models.tiny_package()


@pytest.fixture(scope="session")
def session_split():
    """(train, held_out) clicks of the session-based example, held out by time."""
    from examples.session_based import data

    return data.split_by_time(session_models.clicks(), held_out_fraction=0.2)


@pytest.fixture(scope="session")
def session_workflow(session_split, tmp_path_factory):
    from examples.session_based import features

    train, _ = session_split
    return features.fit_workflow(
        train,
        tmp_path_factory.mktemp("session_workflow"),
        max_sequence_length=session_models.MAX_SEQUENCE_LENGTH,
    )


@pytest.fixture(scope="session")
def xlnet(session_workflow, session_split):
    train, _ = session_split
    return session_models.xlnet(session_workflow, train)


@pytest.fixture(scope="session")
def gpt2(session_workflow):
    return session_models.gpt2(session_workflow)


@pytest.fixture(scope="session")
def torchscript_model(session_workflow):
    return session_models.torchscript(session_workflow)


class Ranking(NamedTuple):
    train: pd.DataFrame
    held_out: pd.DataFrame
    workflow: object  # fitted nvtabular.Workflow
    model: object  # trained examples.ranking.model.DLRM, in eval mode


@pytest.fixture(scope="session")
def ranking(tmp_path_factory):
    from examples.ranking import data, features, model

    impressions = data.generate_impressions(6_000, n_users=200, n_items=120, seed=3)
    train, held_out = data.split(impressions, seed=3)
    workflow = features.fit_workflow(train, tmp_path_factory.mktemp("ranking"))
    ctr_model = model.build_model(workflow.output_schema)
    model.train(
        ctr_model,
        features.transform(workflow, train),
        train[data.LABEL_COLUMN].to_numpy(),
        epochs=6,
    )
    return Ranking(train, held_out, workflow, ctr_model)


# the multi-stage tests' feature tables, Feast feature store and server, and ranker
from tests.multistage_fixtures import (  # noqa: E402, F401
    feature_repository,
    feature_server,
    multistage_tables,
    ranker,
)

# a real redis-server shared by the tests of stores and live sessions
from tests.redis_fixtures import redis_server  # noqa: E402, F401


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may be off (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile`` (as ``./run tests`` runs): whole files to each worker, the
    official examples' files as one, the long ones first (tests/scheduling.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.scheduling import LongestFirstScheduling

    return LongestFirstScheduling(config, log)
