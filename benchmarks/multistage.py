"""The multi-stage pipeline measured side by side: this project's ensemble (retrieve 100
candidates from an IVF index with the session example's XLNet encoder, filter, look up item and
session features from exported tables, rank every candidate on libtorch, softmax-sample 10)
in-process and served, the Triton floor of as many no-op steps, and Merlin Systems 23.08 serving
the same pipeline with its own operators (benchmarks/merlin_multistage.py says what was
substituted), both as Merlin ships it and with each step's result kept for the request (a change
to its executor made here, benchmarks/merlin_executor.py, not Merlin's).

    ./run bench --only multistage [--quick]

Writes results/multistage.{json,md}: one-session p50 through ``Client`` over gRPC against
(in-process + floor) and against both Merlin figures, sessions/s with 8 clients sending 32
sessions a request (Merlin: one session a request, all its operators can answer), and where each
side's time goes: per-operator timers inside Merlin's executor model beside this project's steps'
own counters, each with Triton's count of the models a request ran (benchmarks/breakdown.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from merlin.schema import ColumnSchema, Schema

from benchmarks import breakdown
from benchmarks.environment import BUSY_MACHINE_CORES, OtherCpuLoad
from benchmarks.floor import FLOOR_MODEL, ensemble_step_count, write_floor_repository
from benchmarks.load import LoadSettings, run_load
from benchmarks.memory import server_processes
from benchmarks.merlin_multistage import SUBSTITUTION_NOTE, export_merlin_multistage
from benchmarks.systems import _infer_input, _tritonclient, merlin_tritonclient, project_client
from benchmarks.workload import MAX_SEQUENCE_LENGTH, build_workload
from examples.multi_stage import catalog
from examples.session_based import data
from examples.session_based import features as session_features
from merlin_torch_serving import (
    DecodeItemIds,
    Ensemble,
    FilterCandidates,
    IVFIndex,
    LookupFeatures,
    PredictPytorch,
    RetrieveTopK,
    SoftmaxSampling,
    TransformWorkflow,
    TritonServer,
    UnrollCandidates,
)
from merlin_torch_serving.data import frames, wire

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODEL, MERLIN_MODEL = "multistage", "executor_model"
#: copies of Merlin's executor model running benchmarks/merlin_executor.py: stock with timers, and
#: with each step's result kept for the request (timed too)
MERLIN_TIMED, MERLIN_KEPT = "executor_model_timed", "executor_model_kept"
CANDIDATES, TOP_K, TEMPERATURE = 100, 10, 1.0
INDEX = IVFIndex(lists=64, probes=16)
ITEM_FEATURES = {"category": "int64", "price_bucket": "int64", "popularity": "float32"}
# every request of a setting (16 different ones) is sent twice before timing, so that whatever warms
# up per input shape (TorchScript's optimizing executor in Merlin's steps) has met each
FULL = LoadSettings(warmup_requests=32, timed_requests=300, time_budget_s=6.0)
QUICK = LoadSettings(warmup_requests=32, timed_requests=30, time_budget_s=1.0)


class BenchRanker(torch.nn.Module):
    """A ranker of scalar features only, which both pipelines can feed: embeddings of category,
    price bucket and device, the popularity, an MLP."""

    def __init__(self, categories: int, dim: int = 8):
        super().__init__()
        self.category = torch.nn.Embedding(categories, dim)
        self.price = torch.nn.Embedding(catalog.PRICE_BUCKETS, dim)
        self.device = torch.nn.Embedding(catalog.DEVICES, dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(3 * dim + 1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        vectors = torch.cat(
            [
                self.category(
                    inputs["category"].reshape(-1).clamp(0, self.category.num_embeddings - 1)
                ),
                self.price(
                    inputs["price_bucket"].reshape(-1).clamp(0, self.price.num_embeddings - 1)
                ),
                self.device(inputs["device"].reshape(-1).clamp(0, self.device.num_embeddings - 1)),
                inputs["popularity"].reshape(-1, 1).to(torch.float32),
            ],
            dim=1,
        )
        return torch.sigmoid(self.mlp(vectors)).reshape(-1)


RANKER_INPUTS = Schema(
    [
        ColumnSchema(n, dtype=np.int64 if d == "int64" else np.float32, dims=(None,))
        for n, d in ITEM_FEATURES.items()
    ]
    + [ColumnSchema("device", dtype=np.int64, dims=(None,))]
)
RANKER_OUTPUTS = Schema([ColumnSchema("click_probability", dtype=np.float32, dims=(None,))])


def project_graph(workflow, session_model, ranker, items: pd.DataFrame, sessions: pd.DataFrame):
    session = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    retrieve = RetrieveTopK(
        CANDIDATES,
        session_model,
        index=INDEX,
        seen_items=session["item_id-list"],
        exclude_ids=[0, 1, 2],
    )
    filtered = (
        session
        >> PredictPytorch(session_model, backend="python", output="session_embedding")
        >> retrieve
        >> DecodeItemIds(workflow, columns=["item_ids"])
        >> FilterCandidates()
    )
    device = session["session_id"] >> LookupFeatures(
        sessions, key="session_id", features={"device": "int64"}
    )
    rows = filtered >> UnrollCandidates(device)
    item_features = rows["candidate_ids"] >> LookupFeatures(
        items, key="item_id", column="candidate_ids", features=ITEM_FEATURES
    )
    ranked = (rows + item_features) >> PredictPytorch(
        ranker, RANKER_INPUTS, RANKER_OUTPUTS, backend="pytorch"
    )
    ordered = ranked >> SoftmaxSampling(
        TOP_K, filtered["candidate_ids"], temperature=TEMPERATURE, session_key=session["session_id"]
    )
    return session["session_id"] + ordered, retrieve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only multistage", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="requests sent before timing each setting (default 32: every request twice)",
    )
    arguments = parser.parse_args(argv)
    settings = QUICK if arguments.quick else FULL
    if arguments.warmup is not None:
        settings = LoadSettings(arguments.warmup, settings.timed_requests, settings.time_budget_s)
    load_before = os.getloadavg()
    began = time.perf_counter()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-multistage-") as scratch:
        work = Path(scratch)
        _say("building the workload (clicks, workflow, one epoch of XLNet)")
        workload = build_workload(work, session_counts=(1, 32), progress=False)
        workflow = workload.workflow
        clicks = data.generate_interactions()
        train, _ = data.split_by_time(clicks)
        items = catalog.item_table(workflow, train)
        sessions = catalog.session_table(clicks["session_id"].unique())
        ranker = torch.jit.script(BenchRanker(catalog.category_count(workflow)).eval())

        graph, retrieve = project_graph(workflow, workload.session_model, ranker, items, sessions)
        ensemble = Ensemble(graph, workflow.input_schema)
        ensemble.export(work / "project", MODEL)
        steps = ensemble_step_count(work / "project", MODEL)
        merlin_index = _merlin_index(retrieve, work / "faiss")
        encoded_features = _features_by_encoded_id(workflow, items)
        devices = np.zeros(int(sessions["session_id"].max()) + 1, dtype=np.int64)
        devices[sessions["session_id"].to_numpy()] = sessions["device"].to_numpy()
        merlin_outputs = export_merlin_multistage(
            workflow,
            workload.session_model,
            ranker,
            merlin_index,
            encoded_features,
            devices,
            work / "merlin",
            candidates=CANDIDATES,
            top_k=TOP_K,
            temperature=TEMPERATURE,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        timers = {
            name: breakdown.add_executor_variant(
                work / "merlin", name, keep_results=keep, timers_dir=work
            )
            for name, keep in ((MERLIN_TIMED, False), (MERLIN_KEPT, True))
        }
        write_floor_repository(work / "floor", steps, workflow.input_schema)

        one = workload.requests[1]
        many = workload.requests[32]
        rows, breakdowns = {}, {}
        _say("in-process, one session")
        rows["in-process"] = _in_process(ensemble, one, settings)
        _say("the NVTabular workflow alone, as Merlin runs it and with results kept")
        workflow_calls = breakdown.workflow_in_process(workflow, one)
        for key, repository in (
            ("floor", work / "floor"),
            ("project", work / "project"),
            ("merlin", work / "merlin"),
        ):
            with TritonServer(repository, start_timeout_s=300.0) as server:
                _say(f"{key}: served")
                measured = _served(
                    key,
                    server,
                    workflow.input_schema,
                    merlin_outputs,
                    (one, many),
                    settings,
                    timers,
                )
                for name, (row, split) in measured.items():
                    rows[name] = row
                    if split is not None:
                        breakdowns[name] = split
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - began, 1),
        "steps": steps,
        "substitution": SUBSTITUTION_NOTE,
        "warmup_requests": settings.warmup_requests,
        "rows": rows,
        "breakdowns": breakdowns,
        "workflow_in_process": workflow_calls,
        "merlin_core": _version("merlin-core"),
    }
    record["targets"] = _targets(rows)
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    stem = "multistage-quick" if arguments.quick else "multistage"
    (arguments.output_dir / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (arguments.output_dir / f"{stem}.md").write_text(_markdown(record))
    print(_markdown(record))
    return 0


def _in_process(ensemble: Ensemble, requests: list[pd.DataFrame], settings: LoadSettings) -> dict:
    tables = [frames.frame_to_table(frame, ensemble.input_schema) for frame in requests]

    def make_sender():
        return lambda index: ensemble.run(tables[index % len(tables)])

    with OtherCpuLoad() as other:
        result = run_load(make_sender, 1, settings)
    return _summary(result, 1, other)


def _served(key, server, request_schema, merlin_outputs, requests, settings, timers) -> dict:
    """Row name -> (its summary, its breakdown or None), for the settings of system ``key``."""
    url = server.grpc_url
    one, many = requests

    def measured(make_sender, clients: int, sessions: int, model: str, **split) -> tuple:
        with OtherCpuLoad(lambda: [p.pid for p in server_processes(server.pid)]) as other:
            result, parts = breakdown.measure(
                make_sender, clients, settings, http_url=server.http_url, model=model, **split
            )
        return _summary(result, sessions, other), parts if clients == 1 else None

    if key == "floor":

        def make_floor():
            module, client, timeout = _tritonclient("grpc", url)
            prebuilt = [
                [
                    _infer_input(module, n, a)
                    for n, a in wire.to_wire(frames.frame_to_table(f, request_schema)).items()
                ]
                for f in one
            ]
            return lambda i: client.infer(FLOOR_MODEL, prebuilt[i % len(prebuilt)], **timeout)

        return {"floor": measured(make_floor, 1, 1, FLOOR_MODEL)}
    if key == "project":
        path = project_client(MODEL)
        return {
            "project, 1 session x 1 client": measured(
                lambda: path.make_sender(url, "grpc", one),
                1,
                1,
                MODEL,
                metrics_url=server.metrics_url,
            ),
            "project, 32 sessions x 8 clients": measured(
                lambda: path.make_sender(url, "grpc", many), 8, 32, MODEL
            ),
        }
    rows = {}
    for model, label, timed in (
        (MERLIN_MODEL, "merlin", False),
        (MERLIN_TIMED, "merlin with timers", True),
        (MERLIN_KEPT, "merlin, results kept", True),
    ):
        path = merlin_tritonclient(model, request_schema, merlin_outputs)
        split = {"timers": timers[model]} if timed else {}
        _say(f"{label}: one session a request, 1 then 8 clients")
        rows[f"{label}, 1 session x 1 client"] = measured(
            lambda path=path: path.make_sender(url, "grpc", one), 1, 1, model, **split
        )
        if model != MERLIN_TIMED:  # the timed copy is there for its breakdown
            rows[f"{label}, 1 session x 8 clients"] = measured(
                lambda path=path: path.make_sender(url, "grpc", one), 8, 1, model
            )
    return rows


def _summary(result, sessions: int, other: OtherCpuLoad) -> dict:
    return {
        "p50_ms": round(result.percentile_ms(50), 3),
        "p99_ms": round(result.percentile_ms(99), 3),
        "requests": result.requests,
        "sessions_per_s": round(result.requests_per_s * sessions, 1),
        "other_cpu_cores": round(other.other_cores, 3),
    }


def _targets(rows: dict) -> dict:
    served = rows["project, 1 session x 1 client"]["p50_ms"]
    limit = rows["in-process"]["p50_ms"] + rows["floor"]["p50_ms"]
    throughput = rows["project, 32 sessions x 8 clients"]["sessions_per_s"]
    targets = {"served p50 / (in-process + floor)": round(served / limit, 2)}
    for label in ("merlin", "merlin, results kept"):
        p50 = rows[f"{label}, 1 session x 1 client"]["p50_ms"]
        merlin_throughput = rows[f"{label}, 1 session x 8 clients"]["sessions_per_s"]
        targets[f"{label}: p50 / served p50"] = round(p50 / served, 2)
        targets[f"{label}: sessions/s, served / merlin's"] = round(
            throughput / merlin_throughput, 2
        )
    return targets


def _markdown(record: dict) -> str:
    lines = [
        "# Multi-stage pipeline: this project against Merlin Systems 23.08",
        "",
        f"Load average before {record['load_average_before']}, after"
        f" {record['load_average_after']}; {record['seconds']} s; {record['steps']} steps;"
        f" {record['warmup_requests']} requests before timing each setting. Other CPU: cores"
        " other processes and virtual machines took while a row was measured (`!` above"
        f" {BUSY_MACHINE_CORES:g}: the row was disturbed).",
        "",
        "| setting | p50 ms | p99 ms | requests | sessions/s | other CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in record["rows"].items():
        other = row.get("other_cpu_cores", 0.0)
        lines.append(
            f"| {name} | {row['p50_ms']} | {row['p99_ms']} | {row['requests']} |"
            f" {row['sessions_per_s']} | {other:.2f}{' !' if other > BUSY_MACHINE_CORES else ''} |"
        )
    lines += ["", "| target | measured |", "| --- | ---: |"]
    lines += [f"| {name} | {value} |" for name, value in record["targets"].items()]
    lines += ["", "## Where the time goes", "", *merlin_cause(record), ""]
    for name, split in record["breakdowns"].items():
        lines += [*breakdown.markdown(name, split), ""]
    lines += [*breakdown.workflow_markdown(record["workflow_in_process"]), ""]
    lines += [MERLIN_NOTE, "", record["substitution"], ""]
    return "\n".join(lines)


MERLIN_NOTE = (
    "`merlin` is Merlin's executor model as Merlin exports it. `merlin with timers` is a copy of it"
    " whose executor times each operator (benchmarks/merlin_executor.py, made for this benchmark:"
    " the same executor, timed), and `merlin, results kept` a copy whose executor also keeps each"
    " step's result for the request, so that a node read by several branches runs once: a change"
    " to merlin-core's LocalExecutor made here, not Merlin's (Merlin has no setting for it). Each"
    " copy calls a copy of Merlin's workflow model whose NVTabular workflow runs on the same"
    " executor (timed; timed and results kept), and the same ranker model. Triton model rows: how"
    " many times a request ran the model and for how long (Triton's statistics)."
)


def merlin_cause(record: dict) -> list[str]:
    """Where Merlin's time goes, in a sentence each, from the breakdowns of this run."""
    split = record["breakdowns"]
    timed = split.get("merlin with timers, 1 session x 1 client")
    kept = split.get("merlin, results kept, 1 session x 1 client")
    if timed is None or kept is None:
        return []
    rows = record["rows"]
    served = rows["project, 1 session x 1 client"]["p50_ms"]
    workflow = _busiest(timed)
    kept_workflow = next(r for r in kept["executor"]["steps"] if r["step"] == workflow["step"])
    return [
        f"Merlin's executor (merlin-core {record['merlin_core']}) keeps no step's result within a"
        " request: every branch that reads a shared node runs everything above it again, so"
        f" {workflow['step']} ran {workflow['calls']:g} times a request and took"
        f" {workflow['ms']:.1f} of the {timed['executor']['whole_ms']:.1f} ms the executor model"
        " spent on it" + _repeated_inside(timed, kept) + ".",
        "",
        f"With each step's result kept for the request it ran {kept_workflow['calls']:g} time(s)"
        f" ({kept_workflow['ms']:.1f} ms), and Merlin answered in"
        f" {rows['merlin, results kept, 1 session x 1 client']['p50_ms']:.1f} ms p50 against"
        f" {rows['merlin, 1 session x 1 client']['p50_ms']:.1f} ms as shipped: x"
        f"{rows['merlin, results kept, 1 session x 1 client']['p50_ms'] / served:.1f} and x"
        f"{rows['merlin, 1 session x 1 client']['p50_ms'] / served:.1f} this project's"
        f" {served:.2f} ms.",
    ]


def _repeated_inside(timed: dict, kept: dict) -> str:
    """What NVTabular's executor ran more times a workflow call than with results kept."""
    repeated = []
    for workflow, inner in timed.get("workflows", {}).items():
        once = kept.get("workflows", {}).get(workflow)
        if once is None:
            continue
        stock_calls = _calls_a_workflow_call(inner)
        kept_calls = _calls_a_workflow_call(once)
        repeated += [
            f"{step} {calls:g} times instead of {kept_calls[step]:g}"
            for step, calls in stock_calls.items()
            if step in kept_calls and calls > kept_calls[step] and "routing" not in step
        ]
    if not repeated:
        return ""
    return "; inside each workflow call NVTabular's executor, the same LocalExecutor, ran " + (
        ", ".join(repeated)
    )


def _calls_a_workflow_call(inner: dict) -> dict[str, float]:
    per_call = inner["calls"] / inner["requests"]
    return {row["step"]: row["calls"] / per_call for row in inner["steps"] if "calls" in row}


def _busiest(split: dict) -> dict:
    """The operator of Merlin's executor that took the most time a request."""
    return max(
        (row for row in split["executor"]["steps"] if "calls" in row), key=lambda row: row["ms"]
    )


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _merlin_index(retrieve, folder: Path) -> Path:
    """The faiss index this project's RetrieveTopK built, probing as many lists, for QueryFaiss."""
    import faiss

    folder.mkdir(parents=True, exist_ok=True)
    retrieve.item_index.save(str(folder))
    index = faiss.read_index(str(folder / "items.faiss"))
    faiss.extract_index_ivf(index).nprobe = INDEX.probes
    path = folder / "merlin_items.faiss"
    faiss.write_index(index, str(path))
    return path


def _features_by_encoded_id(workflow, items: pd.DataFrame) -> dict[str, np.ndarray]:
    """The item table's scalar features as arrays indexed by encoded item id (0 where none)."""
    raw_ids = session_features.item_id_lookup(workflow)
    table = items.set_index("item_id")
    known = raw_ids >= 0
    arrays = {}
    for name, dtype in ITEM_FEATURES.items():
        values = np.zeros(len(raw_ids), dtype=dtype)
        values[known] = table[name].reindex(raw_ids[known]).fillna(0).to_numpy().astype(dtype)
        arrays[name] = values
    return arrays


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
