"""Multi-stage recommendations end to end, on one machine without a GPU or a network.

    ./run python examples/multi_stage/demo.py [--output multi-stage-output] [--sessions 8000]

synthetic clicks -> NVTabular workflow -> a Transformers4Rec XLNet session model (trained here) ->
a Feast feature store (item and session features, applied and materialized into sqlite, served
by ``feast serve`` from Feast's own environment) -> a ranking model trained on impressions
derived from later sessions' clicks -> one ensemble: retrieve 200 candidates (the XLNet's
encoder and an item index), filter, look up Feast features, rank, top 10 -> tritonserver -> the
client -> raw item ids; and recall@10 / NDCG@10 of the retrieval order and of the ranked order on
held-out sessions.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: make `examples.multi_stage` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from examples.multi_stage import catalog, feature_store, pipeline, training
from examples.multi_stage import ranker as ranking
from examples.session_based import data, features, model
from merlin_torch_serving import Client, Ensemble, ExactIndex, IVFIndex, TritonServer

MODEL_NAME = "multi_stage"


def main(argv: list[str] | None = None) -> dict:
    """Runs the demo; returns recall@10 and NDCG@10 of both orders and whether served answers
    equal in-process ones."""
    args = _parse_args(argv)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    _step("1/7 clicks: session model's sessions, ranker's sessions, held-out sessions")
    clicks = data.generate_interactions(
        n_sessions=args.sessions, n_items=args.items, seed=args.seed
    )
    earlier, held_out = data.split_by_time(clicks, held_out_fraction=0.15)
    session_train, ranker_train = data.split_by_time(earlier, held_out_fraction=0.2)
    print(
        f"{session_train.session_id.nunique():,} / {ranker_train.session_id.nunique():,} /"
        f" {held_out.session_id.nunique():,} sessions"
    )

    _step("2/7 workflow and XLNet session model")
    workflow = features.fit_workflow(session_train, output / "workflow")
    session_model = model.build_model(workflow.output_schema, d_model=args.d_model)
    model.train(
        session_model,
        features.transform(workflow, session_train),
        epochs=args.epochs,
        progress=False,
    )
    session_model.eval()

    _step("3/7 Feast feature store: apply, materialize, serve")
    items = catalog.item_table(workflow, session_train, seed=args.seed)
    sessions = catalog.session_table(clicks["session_id"].unique(), seed=args.seed)
    repository = feature_store.write_repository(output / "feature_repo", items, sessions)
    feature_store.apply_and_materialize(repository)
    with feature_store.FeatureServer(repository) as feast:
        print(f"feature server {feast.url}: {len(items):,} items, {len(sessions):,} sessions")
        features_source = pipeline.FeatureSource(feast_url=feast.url, timeout_s=5.0)
        index = IVFIndex(lists=64, probes=16) if args.index == "ivf" else ExactIndex()
        options = {"candidates": args.candidates, "index": index}
        return _rank_and_serve(
            args, output, workflow, session_model, features_source, options, ranker_train, held_out
        )


def _rank_and_serve(
    args, output, workflow, session_model, features_source, options, ranker_train, held_out
):
    schema = workflow.input_schema
    _step("4/7 ranker: impressions from the ranker's sessions")
    _, _, rows = pipeline.ranking_rows_graph(workflow, session_model, features_source, **options)
    prefixes, targets = training.prefixes_and_targets(ranker_train)
    inputs, labels = training.impressions(
        Ensemble(rows, schema), prefixes, targets, negatives=args.negatives, seed=args.seed
    )
    print(f"{len(labels):,} impressions, {int(labels.sum()):,} clicked")
    ranker = ranking.build_ranker(
        catalog.category_count(workflow), catalog.PRICE_BUCKETS, catalog.TAG_IDS, catalog.DEVICES
    )
    losses = ranking.train(ranker, inputs, labels, epochs=args.ranker_epochs, seed=args.seed)
    print(f"loss per epoch: {', '.join(f'{loss:.3f}' for loss in losses)}")

    _step("5/7 retrieval order against ranked order, held-out sessions")
    prefixes, targets = training.prefixes_and_targets(held_out)
    server = TritonServer(output / "repository")
    backend = "pytorch" if "pytorch" in server.backends() else "python"
    ensemble = Ensemble(
        pipeline.recommendations_graph(
            workflow, session_model, ranker, features_source, ranker_backend=backend, **options
        ),
        schema,
    )
    _, filtered = pipeline.candidates_graph(workflow, session_model, **options)
    scores = {
        "retrieval order": training.judged(
            training.retrieval_order(Ensemble(filtered, schema), prefixes), targets
        ),
        "ranked order": training.judged(training.ranked_order(ensemble, prefixes), targets),
    }
    print(f"{len(targets):,} held-out sessions, each judged on its last click")
    for order, measured in scores.items():
        print(
            f"  {order:<16} " + "  ".join(f"{name} {value:.3f}" for name, value in measured.items())
        )

    _step("6/7 export")
    result = ensemble.export(output / "repository", MODEL_NAME, overwrite=True)
    print(f"ranker on the {backend!r} backend; steps: {', '.join(result.models)}")

    _step("7/7 serve and recommend for a few held-out sessions")
    request = prefixes[prefixes["session_id"].isin(targets.index[: args.show])]
    with server:
        client = Client(server.grpc_url)
        served = client.infer(MODEL_NAME, request)
        feast_health = [h for h in server.health() if h.services]
    in_process = ensemble.transform(request)
    same = all(
        np.array_equal(a, b)
        for column in ("item_ids", "item_scores", "item_count")
        for a, b in zip(served[column], in_process[column], strict=True)
    )
    print(f"served == in-process: {same}")
    for health in feast_health:
        state = ", ".join(
            f"{s.name} {'answers' if s.reachable else 'DOWN'}" for s in health.services
        )
        print(f"  {health.name}: {state}")
    for session in served.itertuples():
        ids = session.item_ids[: session.item_count].tolist()
        print(f"session {session.session_id} (next: {targets[session.session_id]}): {ids}")
    return {**scores, "served == in-process": same}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="multi-stage-output", help="where everything goes")
    parser.add_argument("--sessions", type=int, default=8000, help="synthetic sessions")
    parser.add_argument("--items", type=int, default=1000, help="items of the synthetic catalog")
    parser.add_argument("--candidates", type=int, default=200, help="retrieved per session")
    parser.add_argument("--index", choices=["exact", "ivf"], default="ivf")
    parser.add_argument("--d-model", type=int, default=64, help="the XLNet's width")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the session model")
    parser.add_argument("--ranker-epochs", type=int, default=4)
    parser.add_argument("--negatives", type=int, default=20, help="per session, for the ranker")
    parser.add_argument("--show", type=int, default=5, help="held-out sessions to serve")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _step(title: str) -> None:
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
    main()
