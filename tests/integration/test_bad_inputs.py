"""Bad requests, as a careless or hostile client sends them, on every path a request can take:
the Client over gRPC and HTTP, raw tritonclient, and in-process.

Every case is either answered exactly as in-process answers the same request, or refused with an
error naming the column; never a crash, a traceback naming nothing, or an answer computed from the
wrong rows. After each served case the server must still be healthy and answer a normal request.

Five ensembles are served: raw clicks through the workflow (``clicks``), ragged sessions straight
into the model on the python backend (``sessions``: the offsets cases), on Triton's pytorch
backend (``sessions_libtorch``: the same cases, checked inside the TorchScript) and compiled ahead
of time (``sessions_package``: checked inside the package, whose messages name the column without
quoting the values), and a workflow whose item ids are floats (``float_ids``: a NaN id can
travel).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from merlin_torch_serving import (
    Client,
    Ensemble,
    InputError,
    PredictPytorch,
    TopK,
)
from merlin_torch_serving.client import chunks
from merlin_torch_serving.data import frames, tables, wire
from tests import toy_session
from tests.served import assert_frames_equal, raw_infer

pytestmark = pytest.mark.integration

PATHS = ["in-process", "client-grpc", "client-http", "raw-tritonclient"]
MODELS = {
    "clicks": "bad-clicks",
    "sessions": "bad-sessions",
    "sessions_libtorch": "bad-sessions-libtorch",
    "sessions_package": "bad-sessions-package",
    "float_ids": "bad-float-ids",
}
ROW_LIMIT = 100_000  # ModelOptions' default, which these exports keep


@pytest.fixture(scope="module")
def ensembles(triton_server, toy_workflow, toy_model, tmp_path_factory, pytorch_backend):
    scripted, model_inputs, model_outputs = toy_model
    float_train = toy_session.interactions().astype({"item_id": "float64"})
    float_workflow = toy_session.fitted_workflow(
        tmp_path_factory.mktemp("float_ids"), train=float_train
    )
    built = {
        "clicks": Ensemble(
            toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
        ),
        **{
            key: Ensemble(
                model_inputs.column_names
                >> PredictPytorch(scripted, model_inputs, model_outputs, backend=backend)
                >> TopK(3, seen_items="item_id-list", exclude_ids=[0, 1, 2]),
                model_inputs,
            )
            for key, backend in (("sessions", "python"), ("sessions_libtorch", "pytorch"))
        },
        "sessions_package": Ensemble(
            model_inputs.column_names
            >> PredictPytorch(
                toy_session.eager_model(toy_workflow),
                model_inputs,
                model_outputs,
                backend="pytorch",
                compiled="package",
            )
            >> TopK(3, seen_items="item_id-list", exclude_ids=[0, 1, 2]),
            model_inputs,
        ),
        "float_ids": Ensemble(
            toy_session.session_graph(float_workflow, toy_session.scripted_model(float_workflow)),
            float_workflow.input_schema,
        ),
    }
    for key, ensemble in built.items():
        ensemble.export(triton_server.repository, MODELS[key])
        triton_server.load(MODELS[key])
    return built


# ---- the cases -----------------------------------------------------------------------------------


def clicks(n_sessions=3, seed=40, **changes):
    """Raw clicks of the toy interactions as a dict of lists.

    ``changes`` replace columns, or drop them when None.
    """
    data = {
        name: values.tolist()
        for name, values in toy_session.interactions(n_sessions, seed=seed).items()
    }
    for name, values in changes.items():
        if values is None:
            del data[name]
        else:
            data[name] = values(data) if callable(values) else values
    return data


def one_long_session(rows: int) -> dict:
    rng = np.random.default_rng(1)
    return {
        "session_id": np.full(rows, 77, dtype=np.int64),
        "item_id": rng.integers(500, 540, rows),
        "category": rng.integers(0, 7, rows),
        "timestamp": np.arange(rows, dtype=np.int64),
    }


def many_sessions(rows: int) -> dict:
    rng = np.random.default_rng(2)
    return {
        "session_id": rng.integers(0, rows // 5, rows),
        "item_id": rng.integers(500, 540, rows),
        "category": rng.integers(0, 7, rows),
        "timestamp": rng.integers(0, 10**6, rows),
    }


def sessions(values, offsets, categories=None) -> dict:
    """Wire arrays of the sessions ensemble.

    Item lists are as given; category lists have the same shape.
    """
    values = np.asarray(values, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int32)
    return {
        "item_id-list__values": values,
        "item_id-list__offsets": offsets,
        "category-list__values": (
            np.ones(len(values), dtype=np.int64) if categories is None else categories[0]
        ),
        "category-list__offsets": offsets if categories is None else categories[1],
    }


@dataclass(frozen=True)
class Case:
    name: str
    ensemble: str
    request: dict  # columns (lists or arrays), or wire arrays when ``wire``
    names: tuple[str, ...] = ()  # a refusal must name one of these; () when it must be answered
    wire: bool = False


CASES = [
    Case("missing column", "clicks", clicks(timestamp=None), ("timestamp",)),
    Case("extra column", "clicks", clicks(price=lambda d: [1.5] * len(d["item_id"])), ("price",)),
    Case(
        "int32 ids (a safe cast)",
        "clicks",
        clicks(item_id=lambda d: np.asarray(d["item_id"], dtype=np.int32)),
        ("item_id",),
    ),
    Case(
        "float ids with fractions",
        "clicks",
        clicks(item_id=lambda d: [v + 0.5 for v in d["item_id"]]),
        ("item_id",),
    ),
    Case(
        "strings for ints",
        "clicks",
        clicks(item_id=lambda d: [str(v) for v in d["item_id"]]),
        ("item_id",),
    ),
    Case(
        "garbage strings",
        "clicks",
        clicks(item_id=lambda d: ["\x00<script>"] * len(d["item_id"])),
        ("item_id",),
    ),
    Case(
        "NaN and None in ids",
        "clicks",
        clicks(item_id=lambda d: [None] + d["item_id"][1:]),
        ("item_id",),
    ),
    Case(
        "uint64 overflow",
        "clicks",
        clicks(session_id=lambda d: np.full(len(d["session_id"]), 2**63 + 5, dtype=np.uint64)),
        ("session_id",),
    ),
    Case(
        "bools for ids",
        "clicks",
        clicks(item_id=lambda d: [True] * len(d["item_id"])),
        ("item_id",),
    ),
    Case(
        "lists where values are expected",
        "clicks",
        clicks(session_id=lambda d: [[v, v] for v in d["session_id"]]),
        ("session_id",),
    ),
    Case(
        "mismatched column lengths",
        "clicks",
        clicks(item_id=lambda d: d["item_id"][:-1]),
        ("item_id",),
    ),
    Case(
        "0 rows",
        "clicks",
        {
            name: np.zeros(0, dtype=np.int64)
            for name in ("timestamp", "item_id", "category", "session_id")
        },
    ),
    Case(
        "unseen ids",
        "clicks",
        clicks(item_id=lambda d: [10**9 + i for i in range(len(d["item_id"]))]),
    ),
    Case("a session of 100k clicks", "clicks", one_long_session(ROW_LIMIT)),
    Case(
        "more rows than the server's limit",
        "clicks",
        many_sessions(ROW_LIMIT + 1),
        ("timestamp", "item_id", "category", "session_id"),
    ),
    Case(
        "NaN in a float-typed id",
        "float_ids",
        clicks(item_id=lambda d: [np.nan] + [float(v) for v in d["item_id"][1:]]),
        ("item_id",),
    ),
    Case(
        "empty sessions", "sessions", {"item_id-list": [[5, 6], []], "category-list": [[1, 2], []]}
    ),
    Case("no sessions", "sessions", {"item_id-list": [], "category-list": []}),
    Case(
        "offsets going back",
        "sessions",
        sessions([5, 6, 7], [0, 2, 1, 3]),
        ("item_id-list__offsets",),
        wire=True,
    ),
    Case(
        "offsets not starting at 0",
        "sessions",
        sessions([5, 6, 7], [1, 3]),
        ("item_id-list__offsets",),
        wire=True,
    ),
    Case(
        "offsets ending before the values",
        "sessions",
        sessions([5, 6, 7], [0, 2]),
        ("item_id-list__offsets",),
        wire=True,
    ),
    Case(
        "offsets ending past the values",
        "sessions",
        sessions([5, 6, 7], [0, 5]),
        ("item_id-list__offsets",),
        wire=True,
    ),
    Case(
        "offsets of the wrong length",
        "sessions",
        sessions(
            [5, 6, 7], [0, 1, 3], categories=(np.ones(3, np.int64), np.array([0, 3], np.int32))
        ),
        ("item_id-list", "category-list"),
        wire=True,
    ),
    Case(
        "offsets tensor missing",
        "sessions",
        {
            name: array
            for name, array in sessions([5, 6, 7], [0, 1, 3]).items()
            if name != "item_id-list__offsets"
        },
        ("item_id-list", "item_id-list__offsets"),
        wire=True,
    ),
    Case(
        "ids outside the catalog",
        "sessions",
        {"item_id-list": [[5, 10**6]], "category-list": [[1, 1]]},
        ("item_id-list",),
    ),
    Case(
        "negative ids",
        "sessions",
        {"item_id-list": [[-3, 5]], "category-list": [[1, 1]]},
        ("item_id-list",),
    ),
]
# the session cases again, on an ensemble whose only step is a libtorch model: TorchScript, and an
# AOTInductor package (but a missing tensor, which Triton refuses before any step runs, whatever
# its backend)
CASES += [
    dataclasses.replace(case, name=f"{case.name} on {form}", ensemble=f"sessions_{form}")
    for form in ("libtorch", "package")
    for case in CASES
    if case.ensemble == "sessions" and case.name != "offsets tensor missing"
]


# ---- the paths -----------------------------------------------------------------------------------


def send(path: str, case: Case, ensemble: Ensemble, server) -> tuple[pd.DataFrame | None, str]:
    """(answer, "") or (None, the refusal's message) along ``path``."""
    model = MODELS[case.ensemble]
    try:
        if path == "in-process":
            if case.wire:
                return (
                    frames.table_to_frame(
                        ensemble.run(wire.from_wire(case.request, ensemble.input_schema))
                    ),
                    "",
                )
            return ensemble.transform(case.request), ""
        if path.startswith("client"):
            protocol = path.split("-")[1]
            with Client(
                server.grpc_url if protocol == "grpc" else server.http_url, protocol
            ) as client:
                if case.wire:
                    return (
                        frames.table_to_frame(
                            client.infer_table(
                                model, wire.from_wire(case.request, ensemble.input_schema)
                            )
                        ),
                        "",
                    )
                return client.infer(model, case.request), ""
        names = output_names(ensemble)
        served = raw_infer(
            grpcclient, server.grpc_url, model, raw_arrays(case, ensemble), list(names)
        )
        table = wire.from_wire(
            {names[k]: wire.bytes_to_text(v) for k, v in served.items()}, ensemble.output_schema
        )
        return frames.table_to_frame(table), ""
    except InputError as error:
        return None, str(error)
    except InferenceServerException as error:
        if path != "raw-tritonclient":
            pytest.fail(f"tritonclient's error escaped the library on {path}: {error}")
        return None, error.message()


def raw_arrays(case: Case, ensemble: Ensemble) -> dict:
    """What a raw client sends: wire arrays as given, ragged lists in the wire format, and click
    columns as numpy makes them of the values (no check, no cast)."""
    if case.wire:
        return case.request
    if case.ensemble.startswith("sessions"):
        return wire.to_wire(frames.frame_to_table(case.request, ensemble.input_schema))
    arrays = {}
    for name, values in case.request.items():
        array = np.asarray(values)
        if array.dtype == object and any(value is None for value in array.ravel()):
            array = pd.Series(list(values), dtype=float).to_numpy()  # None travels as NaN
        arrays[name] = array.astype(object) if array.dtype.kind in "US" else array
    return arrays


def output_names(ensemble: Ensemble) -> dict:
    """Wire name an output travels under -> its wire name in the output schema."""
    request_names = ensemble.input_schema.column_names
    names = {}
    for column in ensemble.output_schema:
        sent = wire.response_name(column.name, request_names)
        for spec in wire.column_specs(column):
            names[sent + spec.name[len(column.name) :]] = spec.name
    return names


def requests_sent(path: str, case: Case, ensemble: Ensemble) -> list:
    """The request tables ``path`` sent for ``case``.

    The Client splits what the server would refuse.
    """
    table = (
        wire.from_wire(raw_arrays(case, ensemble), ensemble.input_schema)
        if case.wire
        else frames.frame_to_table(case.request, ensemble.input_schema)
    )
    if not path.startswith("client"):
        return [table]
    return list(chunks.split(table, ensemble.plan.request_groups(), ROW_LIMIT))


def in_process_answer(ensemble: Ensemble, requests: list) -> pd.DataFrame:
    """What the ensemble answers in-process to the same requests, one after the other."""
    return frames.table_to_frame(tables.concat([ensemble.run(request) for request in requests]))


def assert_server_healthy(server, ensembles):
    unhealthy = [m for m in server.health() if m.name.startswith("bad-") and not m.healthy]
    assert not unhealthy, f"models left unhealthy: {unhealthy}"
    rows = toy_session.interactions(3, seed=41)
    with Client(server.grpc_url) as client:
        answer = client.infer(MODELS["clicks"], rows)
    assert_frames_equal(answer, ensembles["clicks"].transform(rows))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_bad_request_is_answered_as_in_process_or_refused_naming_its_column(
    triton_server, ensembles, case, path
):
    ensemble = ensembles[case.ensemble]

    answer, refusal = send(path, case, ensemble, triton_server)

    if answer is not None:
        # an answer must be the one in-process computes for the same request(s), to the last bit
        assert_frames_equal(
            answer, in_process_answer(ensemble, requests_sent(path, case, ensemble))
        )
        if not case.names:
            assert len(answer) == _sessions_in(case, ensemble)
    else:
        assert case.names, f"{case.name!r} should be answered on {path}, was refused: {refusal}"
        if path == "raw-tritonclient" and case.ensemble == "sessions_libtorch":
            # Triton's pytorch backend answers with the whole TorchScript error: the traceback of
            # the check, then its message (the Client keeps only the message)
            refusal = refusal.strip().splitlines()[-1]
            assert refusal.startswith("builtins.ValueError: input column '"), refusal
        assert any(f"'{name}'" in refusal for name in case.names), (
            f"the refusal names none of {case.names}: {refusal}"
        )
        assert "Traceback" not in refusal
    if path != "in-process":
        assert_server_healthy(triton_server, ensembles)


def _sessions_in(case: Case, ensemble: Ensemble) -> int:
    if case.ensemble.startswith("sessions"):
        table = (
            wire.from_wire(case.request, ensemble.input_schema)
            if case.wire
            else frames.frame_to_table(case.request, ensemble.input_schema)
        )
        return tables.num_rows(table)
    return len(pd.unique(np.asarray(case.request["session_id"])))
