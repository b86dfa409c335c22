"""The python steps' own Prometheus counters, scraped from the server after known requests."""

import re
import time
import urllib.request

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Client, Ensemble, ModelOptions, TransformWorkflow

pytestmark = pytest.mark.integration

MODEL = "metrics-workflow"
STEP = f"{MODEL}-0-transformworkflow"
QUIET = "metrics-off-workflow"
QUIET_STEP = f"{QUIET}-0-transformworkflow"


@pytest.fixture(scope="module")
def counting_workflow(tmp_path_factory):
    """Categorify -> Groupby -> Filter (sessions on a block list), and a Clip.

    The Clip has no fast-path kernel.
    """
    import nvtabular as nvt
    from merlin.io import Dataset

    train = pd.DataFrame(
        {
            "session_id": [1, 1, 2, 2, 3, 3],
            "item_id": [10, 11, 12, 10, 11, 12],
            "timestamp": [1, 2, 3, 4, 5, 6],
        }
    )
    items = ["item_id"] >> nvt.ops.Categorify(out_path=str(tmp_path_factory.mktemp("vocabulary")))
    sessions = (["session_id", "timestamp"] + items) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"]},
        name_sep="-",
    )
    kept = sessions >> nvt.ops.Filter(f=lambda frame: frame["session_id"] != 8)
    clipped = (
        kept["item_id-count"] >> nvt.ops.Clip(max_value=50) >> nvt.ops.Rename(postfix="-clipped")
    )
    workflow = nvt.Workflow(kept["session_id", "item_id-list"] + clipped)
    workflow.fit(Dataset(train, cpu=True))
    return workflow


def request_rows():
    # session 7: three known items; 8: blocked (filtered out); 9: two clicks, one item never seen
    return pd.DataFrame(
        {
            "session_id": [7, 7, 7, 8, 9, 9],
            "item_id": [10, 11, 12, 10, 11, 999],
            "timestamp": [1, 2, 3, 4, 5, 6],
        }
    )


def scrape(metrics_url):
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as answer:
        return answer.read().decode()


def scrape_when_published(metrics_url, model, requests, timeout_s=15.0):
    """The metrics once the step's thread has published ``requests`` requests.

    The thread publishes every second.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(metrics_url)
        if (
            value(text, "mts_requests_total", model=model) == requests
            or time.monotonic() > deadline
        ):
            return text
        time.sleep(0.2)


def value(text, name, **labels):
    """The value of series ``name`` whose labels include ``labels`` (None when absent)."""
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if all(found.get(key) == want for key, want in labels.items()):
                return float(match.group(2))
    return None


def test_scraped_counters_count_sessions_filtered_sessions_oov_ids_and_fallbacks(
    triton_server, counting_workflow
):
    ensemble = Ensemble(
        counting_workflow.input_schema.column_names >> TransformWorkflow(counting_workflow),
        counting_workflow.input_schema,
    )
    ensemble.export(triton_server.repository, MODEL)
    ensemble.export(triton_server.repository, QUIET, options=ModelOptions(metrics=False))
    for name in (MODEL, QUIET):
        # with three warm-up requests to the step, then three through the ensemble over gRPC and
        # one over HTTP (the launcher's), which the counters leave out
        triton_server.load(name)
    client = Client(triton_server.grpc_url)
    for _ in range(2):
        answer = client.infer(MODEL, request_rows())
        quiet_answer = client.infer(QUIET, request_rows())
    assert answer["session_id"].tolist() == [7, 8, 9]
    assert answer["filtered_out"].tolist() == [False, True, False]
    np.testing.assert_array_equal(answer["item_id-list"][2][1], 2)  # the out-of-vocabulary label
    pd.testing.assert_frame_equal(answer, quiet_answer)

    text = scrape_when_published(triton_server.metrics_url, STEP, requests=2)
    assert value(text, "mts_requests_total", model=STEP) == 2
    assert value(text, "mts_sessions_total", model=STEP) == 6
    assert value(text, "mts_filtered_sessions_total", model=STEP) == 2
    assert value(text, "mts_oov_ids_total", model=STEP, column="item_id") == 2
    assert value(text, "mts_fastpath_fallbacks_total", model=STEP, operator="Clip") == 2
    assert value(text, "mts_fastpath_fallbacks_total", model=STEP, operator="Categorify") is None
    assert value(text, "mts_operator_seconds_total", model=STEP, operator="0:TransformWorkflow") > 0
    # Triton's own counter counts the warm-up runs too
    assert value(text, "nv_inference_count", model=STEP) == 2 + 3 + 4
    # metrics=False: the step publishes nothing of its own
    assert f'model="{QUIET_STEP}"' not in "\n".join(
        line for line in text.splitlines() if line.startswith("mts_")
    )
    assert value(text, "nv_inference_count", model=QUIET_STEP) == 2 + 3 + 4
