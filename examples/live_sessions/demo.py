"""Live sessions end to end: a browsing session replayed click by click against a served graph
that keeps each session's history in Redis, the block list changed while it runs, and a second
tritonserver sharing the same Redis.

    python examples/live_sessions/demo.py [--output live-demo-output] [--redis URL]

raw clicks -> NVTabular workflow -> Transformers4Rec XLNet (trained here, briefly) ->
``SessionHistory >> TransformWorkflow >> PredictPytorch >> TopK(block_list=...) >>
DecodeItemIds``, with ``TrendingItems`` beside it -> one model repository -> two tritonservers
-> one click per request, sent to each server in turn. A local redis-server is started in the
output folder unless ``--redis`` names one (``REDIS_PASSWORD`` holds its password, if any).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: make `examples` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd

from examples.live_sessions.redis_server import RedisServer
from examples.session_based import data, features, model
from examples.session_based.demo import choose_backend
from merlin_torch_serving import (
    BlockList,
    Client,
    DecodeItemIds,
    Ensemble,
    PredictPytorch,
    RedisSettings,
    SessionHistory,
    TopK,
    TransformWorkflow,
    Trending,
    TrendingItems,
    TritonServer,
    open_store,
)

MODEL_NAME = "live_recs"
TOP_K = 5
RESERVED_IDS = (0, 1, 2)
BLOCK_LIST = "out_of_stock"
#: clicks counted per item per hour, over the last day
TRENDING = Trending(bucket=3600, window=24)


def live_graph(workflow, session_model, store, *, backend: str = "python") -> Ensemble:
    """New clicks in; per session: its id, the ``TOP_K`` best raw item ids it has not clicked nor
    are blocked, and the ``TOP_K`` trending items it has not clicked."""
    history = SessionHistory(
        store, workflow.input_schema, max_clicks=20, ttl_s=1800, trending=TRENDING
    )
    session_features = history >> TransformWorkflow(workflow)
    recommendations = (
        session_features
        >> PredictPytorch(session_model, backend=backend)
        >> TopK(
            TOP_K,
            seen_items=session_features["item_id-list"],
            exclude_ids=RESERVED_IDS,
            block_list=BlockList(store, BLOCK_LIST, vocabulary=workflow),
        )
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    trending = (
        session_features
        >> TrendingItems(
            store,
            TRENDING,
            workflow,
            TOP_K,
            ids_column="trending_ids",
            scores_column="trending_scores",
        )
        >> DecodeItemIds(workflow, source_column="item_id", columns=("trending_ids",))
    )
    return Ensemble(
        session_features["session_id"] + recommendations + trending, workflow.input_schema
    )


def replay(
    clients: list[Client], session: pd.DataFrame, store, *, block_at: int = 3
) -> list[pd.DataFrame]:
    """Send ``session``'s clicks one per request, to each client in turn, and print each answer;
    after click ``block_at``, block the item then recommended first. Returns the answers."""
    answers = []
    with open_store(store) as opened:
        for position in range(len(session)):
            click = session.iloc[[position]]
            client = clients[position % len(clients)]
            answer = client.infer(MODEL_NAME, click)
            answers.append(answer)
            row = answer.iloc[0]
            print(
                f"click {position + 1} (item {int(click['item_id'].iloc[0])}) -> server"
                f" {position % len(clients) + 1}: recommended {list(map(int, row['item_ids']))},"
                f" trending {list(map(int, row['trending_ids']))}"
            )
            if position + 1 == block_at:
                blocked = int(row["item_ids"][0])
                opened.block(BLOCK_LIST, [str(blocked)])
                print(
                    f"  item {blocked} is out of stock: blocked in {BLOCK_LIST!r} (the command"
                    f" line: merlin-torch-serving rules block --store URL --list {BLOCK_LIST}"
                    f" {blocked})"
                )
                time.sleep(0.6)  # the graph reads its block list at most every 0.5 s
    return answers


def main(argv: list[str] | None = None) -> list[pd.DataFrame]:
    args = _parse_args(argv)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    _step("1/5 clicks, workflow and a briefly trained XLNet")
    clicks = data.generate_interactions(n_sessions=args.sessions, seed=args.seed)
    train, held_out = data.split_by_time(clicks)
    workflow = features.fit_workflow(train, output / "workflow")
    session_model = model.build_model(workflow.output_schema)
    model.train(session_model, features.transform(workflow, train), epochs=args.epochs)

    _step("2/5 Redis")
    with RedisServer(output / "redis") if args.redis is None else _Given(args.redis) as redis:
        store = RedisSettings(redis.url, password_env="REDIS_PASSWORD")
        print(f"sessions, rules and trending counts kept at {store.describe()}")

        _step("3/5 the live graph, exported")
        backend, _ = choose_backend(args.backend)
        repository = output / "repository"
        live_graph(workflow, session_model, store, backend=backend).export(
            repository, MODEL_NAME, overwrite=True
        )
        print(f"{repository}: SessionHistory heads the graph; the model runs on {backend}")

        _step("4/5 two tritonservers on the same repository and the same Redis")
        with TritonServer(repository) as first, TritonServer(repository) as second:
            clients = [Client(first.grpc_url), Client(second.grpc_url)]
            lengths = held_out.groupby("session_id")["session_id"].transform("size")
            session_id = held_out.loc[lengths >= 6, "session_id"].iloc[0]
            session = held_out[held_out["session_id"] == session_id].sort_values("timestamp")
            _step(f"5/5 session {session_id}, one click per request, the servers taking turns")
            answers = replay(clients, session, store)
            with open_store(store) as opened:
                print(f"stored: {len(opened.clicks(str(session_id)))} clicks; forgetting it")
                opened.forget(str(session_id))
                opened.unblock(BLOCK_LIST, opened.blocked(BLOCK_LIST))
            for client in clients:
                client.close()
    return answers


class _Given:
    """A Redis named on the command line, used as it is."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        pass


def _step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--output", default="live-demo-output", help="folder for everything it writes")
    add("--redis", default=None, help="a Redis URL to use instead of starting redis-server")
    add("--sessions", type=int, default=2000, help="synthetic sessions (default: %(default)s)")
    add("--epochs", type=int, default=2, help="training epochs (default: %(default)s)")
    add("--seed", type=int, default=0, help="seed of the synthetic clicks")
    add("--backend", choices=("pytorch", "python"), default=None, help="the model step's backend")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
