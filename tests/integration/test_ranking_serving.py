"""The ranking example served on the real tritonserver: raw impressions in through the
schema-driven client over gRPC and HTTP (strings, unseen ids, missing values; 1, 7, 37, 64 and 500
rows), one click probability per row out, equal to the in-process ensemble and to the eager model
on NVTabular's own transform (within the tolerance of a package where the model is compiled ahead
of time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from examples.ranking import data, features, model
from examples.ranking.demo import scoring_graph
from merlin_torch_serving import Client, Ensemble
from merlin_torch_serving.aot.tolerance import SCORE_TOLERANCE
from merlin_torch_serving.tensors.batch_invariance import MIN_ROWS
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

pytestmark = pytest.mark.integration


def request_rows(ranking, n: int):
    rows = ranking.held_out.drop(columns=[data.LABEL_COLUMN]).copy()
    rows.loc[rows.index[:2], "item_id"] = [7, 8]  # never seen in training
    rows.loc[rows.index[2], "device"] = "smart-tv"
    rows.loc[rows.index[3:6], "user_age"] = np.nan
    return rows.head(n).sample(frac=1.0, random_state=n).reset_index(drop=True)


@pytest.mark.parametrize(
    ("backend", "compiled"),
    [("python", None), ("pytorch", "torchscript"), ("pytorch", "package")],
    ids=["all python", "mixed", "mixed, compiled ahead of time"],
)
def test_served_scores_equal_in_process_and_eager_scores(
    request, triton_server, ranking, backend, compiled
):
    if backend == "pytorch":
        request.getfixturevalue(
            "pytorch_backend"
        )  # fails, naming how to build it, when it is missing
    ensemble = Ensemble(
        scoring_graph(ranking.workflow, ranking.model, backend=backend, compiled=compiled),
        ranking.workflow.input_schema,
    )
    name = f"ctr-{backend}-{compiled}"
    ensemble.export(triton_server.repository, name)
    triton_server.load(name)
    clients = {
        "grpc": Client(triton_server.grpc_url),
        "http": Client(triton_server.http_url, protocol="http"),
    }

    for n in (1, 7, 37, 64, 250, 500):
        rows = request_rows(ranking, n)
        in_process = ensemble.transform(rows)[
            model.OUTPUT_COLUMN
        ].to_numpy()  # with the served thread count
        # float sums in the order the served model sums them: its thread count, and never fewer
        # than MIN_ROWS rows (see batch_invariance), so a smaller request runs repeated
        taller = pd.concat([rows] * -(-MIN_ROWS // n), ignore_index=True)
        with torch_threads(SERVED_TORCH_THREADS):
            eager = model.predict(ranking.model, features.transform(ranking.workflow, taller))[:n]
        for protocol, client in clients.items():
            served = client.infer(name, rows)[model.OUTPUT_COLUMN].to_numpy()
            np.testing.assert_array_equal(served, in_process, err_msg=f"{protocol}, {n} rows")
            if compiled == "package":  # compiled code sums in another order: within tolerance
                np.testing.assert_allclose(served, eager, rtol=0, atol=SCORE_TOLERANCE)
            else:
                np.testing.assert_array_equal(served, eager, err_msg=f"{protocol}, {n} rows")
