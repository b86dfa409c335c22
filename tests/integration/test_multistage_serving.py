"""The multi-stage pipeline served on the real tritonserver, its features from a real Feast feature
server (``feast serve`` over a sqlite online store, in Feast's own environment) or from tables
exported with the repository: answers equal ``Ensemble.transform`` bit for bit over gRPC and HTTP,
for 1, 7 and 64 sessions holding unknown items, a session the store lacks, a session left with no
candidate, sessions left with fewer than k and an index that pads with -1; the counters count
those cases; the exported repository serves from another folder."""

from __future__ import annotations

import shutil
import time

import pandas as pd
import pytest

from examples.multi_stage import pipeline
from merlin_torch_serving import Client, Ensemble, IVFIndex
from merlin_torch_serving.graph import metrics
from tests.integration.test_metrics import scrape
from tests.multistage_fixtures import multistage_request
from tests.served import assert_async_client_answers_as_client, assert_frames_equal

pytestmark = pytest.mark.integration

FEAST, TABLE = "multistage_feast", "multistage_table"
K, CANDIDATES = 10, 30


def blocked_ids(workflow, xlnet, rows: pd.DataFrame) -> list[int]:
    """Every candidate the exact retrieval finds for the session of ``rows``: blocked, that session
    is left with none."""
    _session, filtered = pipeline.candidates_graph(workflow, xlnet, candidates=CANDIDATES)
    found = Ensemble(filtered, workflow.input_schema).transform(rows)
    return [int(i) for i in found["candidate_ids"][0]]


@pytest.fixture(scope="module")
def scenario(session_split, multistage_tables):
    """The held-out session every candidate of which is blocked."""
    held_out = session_split[1]
    lengths = held_out.groupby("session_id").size()
    emptied = int(lengths[lengths == 3].index[-1])
    return held_out[held_out["session_id"] == emptied]


@pytest.fixture(scope="module")
def ensembles(
    triton_server,
    pytorch_backend,
    session_workflow,
    xlnet,
    ranker,
    multistage_tables,
    feature_server,
    scenario,
    tmp_path_factory,
):
    """FEAST: exact retrieval, features from Feast, top-k. TABLE: an IVF index probing one list
    (rows padded with -1), features from exported tables, a softmax sample; exported into a folder
    of its own and moved into the server's repository."""
    workflow = session_workflow
    feast = Ensemble(
        pipeline.recommendations_graph(
            workflow,
            xlnet.eager,
            ranker,
            pipeline.FeatureSource(feast_url=feature_server.url, timeout_s=5.0),
            k=K,
            candidates=CANDIDATES,
            blocked=blocked_ids(workflow, xlnet.eager, scenario),
        ),
        workflow.input_schema,
    )
    feast.export(triton_server.repository, FEAST)
    table = Ensemble(
        pipeline.recommendations_graph(
            workflow,
            xlnet.eager,
            ranker,
            pipeline.FeatureSource(
                items=multistage_tables.items, sessions=multistage_tables.sessions
            ),
            k=K,
            candidates=CANDIDATES,
            index=IVFIndex(lists=32, probes=1),
            sampling={"temperature": 0.5, "seed": 7},
        ),
        workflow.input_schema,
    )
    exported = tmp_path_factory.mktemp("exported_elsewhere")
    result = table.export(exported, TABLE)
    for model in result.models:
        shutil.move(str(exported / model), str(triton_server.repository / model))
    shutil.rmtree(exported)
    for name in (FEAST, TABLE):
        triton_server.load(name)
    return {FEAST: feast, TABLE: table}


def request(session_split, tables, scenario, sessions: int, seed: int) -> pd.DataFrame:
    rows = multistage_request(session_split[1], tables, sessions, seed)
    if sessions > 1:
        rows = pd.concat([rows[~rows["session_id"].isin(scenario["session_id"])], scenario])
    return rows.reset_index(drop=True)


def client(triton_server, protocol: str) -> Client:
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    return Client(url, protocol=protocol)


@pytest.mark.parametrize("sessions", [1, 7, 64])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", [FEAST, TABLE])
def test_served_pipeline_answers_as_in_process(
    triton_server, ensembles, session_split, multistage_tables, scenario, model, protocol, sessions
):
    rows = request(session_split, multistage_tables, scenario, sessions, seed=sessions)

    served = client(triton_server, protocol).infer(model, rows)

    local = ensembles[model].transform(rows)
    assert_frames_equal(served, local)
    assert served["session_id"].tolist() == list(dict.fromkeys(rows["session_id"]))
    counts = served["item_count"].to_numpy()
    assert (counts <= K).all()
    for ids, count in zip(served["item_ids"], counts, strict=True):
        assert (ids[:count] >= 0).all()
        assert (ids[count:] == -1).all()
    if sessions > 1 and model == FEAST:
        emptied = served["session_id"] == scenario["session_id"].iloc[0]
        assert counts[emptied.to_numpy()].tolist() == [0]
        assert ((counts > 0) & (counts < K)).any(), "no session was left with fewer than k"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", [FEAST, TABLE])
def test_async_client_answers_what_client_answers(
    triton_server, ensembles, session_split, multistage_tables, scenario, model, protocol
):
    requests = [
        request(session_split, multistage_tables, scenario, sessions, seed=sessions)
        for sessions in (1, 7, 64)
    ]
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    assert_async_client_answers_as_client(url, protocol, model, requests)


def test_the_counters_count_each_case_the_pipeline_answered_around(
    triton_server, ensembles, session_split, multistage_tables, scenario
):
    rows = request(session_split, multistage_tables, scenario, 7, seed=21)
    with metrics.collecting() as expected:
        ensembles[FEAST].transform(rows)
    totals = {key: value for key, value in expected.totals.items() if key[0] != "operator_seconds"}
    names = {name for name, _ in totals}
    assert {metrics.EMPTY_ANSWERS, metrics.SHORT_ANSWERS, metrics.MISSING_ENTITIES} <= names
    before = _settled(triton_server)

    client(triton_server, "grpc").infer(FEAST, rows)

    python_steps = sum(
        1
        for model in triton_server.repository.iterdir()
        if model.name.startswith(f"{FEAST}-") and (model / "1" / "model.py").exists()
    )
    after = _scraped_after(triton_server, before, python_steps)
    for (name, labels), count in totals.items():
        if name == metrics.SESSIONS:
            continue  # counted per step (each step answers its own rows)
        got = _total(after, name, dict(labels)) - _total(before, name, dict(labels))
        assert got == count, f"mts_{name}_total{dict(labels)}"


def test_the_table_pipeline_drops_the_indexs_padding_and_counts_it(
    ensembles, session_split, multistage_tables, scenario
):
    rows = request(session_split, multistage_tables, scenario, 7, seed=3)

    with metrics.collecting() as counted:
        answer = ensembles[TABLE].transform(rows)

    invalid = sum(
        v for (name, _), v in counted.totals.items() if name == metrics.INVALID_CANDIDATES
    )
    assert invalid > 0
    assert (answer["item_count"] >= 0).all()


def test_a_repository_exported_elsewhere_and_moved_serves_from_its_new_folder(
    triton_server, ensembles, session_split, multistage_tables, scenario
):
    rows = request(session_split, multistage_tables, scenario, 7, seed=5)
    config = (triton_server.repository / TABLE / "config.pbtxt").read_text()

    served = client(triton_server, "http").infer(TABLE, rows)

    assert "exported_elsewhere" not in config
    assert_frames_equal(served, ensembles[TABLE].transform(rows))


def _scraped_after(triton_server, before: str, steps: int, timeout_s: float = 15.0) -> str:
    """The metrics once ``steps`` more requests were published by the FEAST ensemble's python
    steps than in ``before`` (each step's thread publishes every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(triton_server.metrics_url)
        if (
            _total(text, "requests", {}) - _total(before, "requests", {}) >= steps
            or time.monotonic() > deadline
        ):
            return text
        time.sleep(0.2)


def _settled(triton_server, timeout_s: float = 15.0) -> str:
    """The metrics once two scrapes a publishing interval apart agree (earlier tests' requests are
    published within about a second)."""
    deadline = time.monotonic() + timeout_s
    text = scrape(triton_server.metrics_url)
    while time.monotonic() < deadline:
        time.sleep(1.2)
        again = scrape(triton_server.metrics_url)
        if again == text:
            break
        text = again
    return text


def _total(text: str, name: str, labels: dict, model_prefix: str = f"{FEAST}-") -> float:
    """The sum of ``mts_<name>_total`` over the series of the models starting with the prefix."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(f"mts_{name}_total{{"):
            continue
        series, number = line.rsplit(" ", 1)
        if f'model="{model_prefix}' not in series:
            continue
        if all(f'{key}="{item}"' in series for key, item in labels.items()):
            total += float(number)
    return total


@pytest.mark.parametrize("model", [FEAST, TABLE])
def test_a_request_without_sessions_is_answered_without_rows(
    triton_server, ensembles, session_split, multistage_tables, scenario, model
):
    rows = request(session_split, multistage_tables, scenario, 7, seed=8).iloc[:0]

    served = client(triton_server, "grpc").infer(model, rows)

    assert len(served) == 0
    assert_frames_equal(served, ensembles[model].transform(rows))
