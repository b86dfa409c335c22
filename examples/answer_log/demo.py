"""An experiment read out from its answer log, on one machine without a GPU.

    ./run python examples/answer_log/demo.py [--output experiment-output] [--in-process]

The routing example's experiment: the current XLNet (trained here) against a candidate that is
deliberately worse (the same network, never trained), half the sessions each by a stable hash of
the session id, sessions of unknown items to the most popular items. Every answer is logged by
``LogAnswers`` into a folder of parquet files. The held-out sessions are replayed click by click
against the served graph (``simulate``: each next click is the data's, stamped after the answer
it follows), and the read-out joins the log with those clicks: hit rate, recall and MRR of the
next click per variant and branch with 95 % intervals, the difference between the variants, the
better one named; a chart, and the impressions dataset (every item shown, clicked or not) that
a ranker trains on.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: make `examples.answer_log` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.answer_log import simulate
from examples.session_based import data, features, model
from merlin_torch_serving import (
    AllItemsUnknown,
    ClickColumns,
    Client,
    DecodeItemIds,
    Ensemble,
    Experiment,
    ItemPopularity,
    LogAnswers,
    MostPopular,
    ParquetFolder,
    PredictPytorch,
    Route,
    TopK,
    TransformWorkflow,
    TritonServer,
    evaluate_answers,
)
from merlin_torch_serving.evaluation.impressions import write_impressions

MODEL_NAME = "experiment"
TOP_K = 10
RESERVED_IDS = (0, 1, 2)  # Categorify's padding, null and out-of-vocabulary ids


def experiment_graph(workflow, current, candidate, popularity, log_folder, *, split=0.5):
    """Raw clicks in; per session the top 10 raw item ids of its variant's model (``current`` or
    ``candidate``, ``split`` of the sessions to the candidate), or the most popular items for a
    session of unknown items; every answer logged into ``log_folder``: (ensemble, its log)."""
    session_features = workflow.input_schema.column_names >> TransformWorkflow(workflow)

    def ranked_by(t4r):
        return (
            session_features
            >> PredictPytorch(t4r, backend="python")
            >> TopK(TOP_K, seen_items=session_features["item_id-list"], exclude_ids=RESERVED_IDS)
            >> DecodeItemIds(workflow, source_column="item_id")
        )

    popular = (
        session_features
        >> MostPopular(popularity, TOP_K)
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    route = Route(
        {"current": ranked_by(current), "candidate": ranked_by(candidate), "popular": popular},
        rules=[(AllItemsUnknown(), "popular")],
        default=Experiment("xlnet-candidate", {"current": 1 - split, "candidate": split}),
        fallback="popular",
        inline=["current", "candidate", "popular"],  # one python step answers it all
    )
    log = LogAnswers(ParquetFolder(log_folder), session_ids=session_features["session_id"])
    return Ensemble(session_features >> route >> log, workflow.input_schema), log


def main(argv: list[str] | None = None) -> dict:
    """Runs the demo; returns the read-out, the better variant and where its files are."""
    args = _parse_args(argv)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    _step("1/5 clicks, workflow, the current XLNet (trained) and the candidate (untrained)")
    clicks = data.generate_interactions(
        n_sessions=args.sessions, n_items=args.items, seed=args.seed
    )
    train, held_out = data.split_by_time(clicks, held_out_fraction=0.2)
    workflow = features.fit_workflow(train, output / "workflow")
    current = model.build_model(workflow.output_schema, d_model=args.d_model, seed=args.seed)
    model.train(current, features.transform(workflow, train), epochs=args.epochs, progress=False)
    candidate = model.build_model(workflow.output_schema, d_model=args.d_model, seed=args.seed + 1)
    current.eval()
    candidate.eval()
    popularity = ItemPopularity.fit(train, workflow)
    replayed = held_out[held_out["session_id"].isin(held_out["session_id"].unique()[: args.replay])]
    return run_experiment(workflow, current, candidate, popularity, replayed, output, args.serve)


def run_experiment(workflow, current, candidate, popularity, replayed, output: Path, serve: bool):
    """Steps 2 to 5 of the demo (see the module's docstring) on ``replayed`` sessions."""
    log_folder, clicks_file = output / "answers", output / "clicks.parquet"
    _step("2/5 the routed graph, every answer logged to " + str(log_folder))
    ensemble, log = experiment_graph(workflow, current, candidate, popularity, log_folder)
    started = time.perf_counter()
    sessions = replayed["session_id"].nunique()
    if serve:
        ensemble.export(output / "repository", MODEL_NAME, overwrite=True)
        _step("3/5 tritonserver; held-out sessions replayed click by click through the client")
        with TritonServer(output / "repository") as server:
            client = Client(server.grpc_url)
            simulate.replay(replayed, lambda rows: client.infer(MODEL_NAME, rows), clicks_file)
        # a graceful stop publishes the log's last file
    else:
        _step("3/5 held-out sessions replayed click by click, in this process")
        simulate.replay(replayed, ensemble.transform, clicks_file)
        log.close()  # write and publish what is queued
    print(f"{sessions} sessions replayed in {time.perf_counter() - started:.1f} s")

    _step("4/5 the read-out: the log joined with the clicks that followed each answer")
    readout = evaluate_answers(
        log_folder,
        clicks_file,
        columns=ClickColumns(time=simulate.CLICKED_AT),
        control="current",
    )
    print(readout.table())
    chart = readout.chart(output / "readout.png")
    print(f"chart: {chart}")

    _step("5/5 the impressions dataset: every item shown, clicked or not")
    impressions = readout.impressions()
    path = write_impressions(impressions, output / "impressions.parquet")
    print(
        f"{path}: {len(impressions):,} items shown, {int(impressions['clicked'].sum()):,} clicked"
    )
    better = readout.better_variant()
    print(f"\nthe better variant: {better or 'none found'}")
    return {
        "readout": readout,
        "better": better,
        "log": log_folder,
        "clicks": clicks_file,
        "impressions": path,
        "chart": chart,
    }


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="experiment-output", help="where everything goes")
    parser.add_argument("--sessions", type=int, default=3000, help="synthetic sessions")
    parser.add_argument("--items", type=int, default=1000, help="items of the synthetic catalog")
    parser.add_argument("--d-model", type=int, default=32, help="the XLNets' width")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the current XLNet")
    parser.add_argument("--replay", type=int, default=400, help="held-out sessions replayed")
    parser.add_argument(
        "--in-process",
        dest="serve",
        action="store_false",
        help="answer in this process (Ensemble.transform logs the same) instead of serving",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _step(title: str) -> None:
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
    main()
