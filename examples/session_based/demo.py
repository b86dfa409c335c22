"""Session-based recommendations end to end, on one machine without a GPU.

    python examples/session_based/demo.py [--interactions clicks.parquet [--columns
    YOURS=session_id,...]]
                                          [--output demo-output] [--backend pytorch|python]

raw clicks -> NVTabular workflow -> Transformers4Rec XLNet (trained here, on CPU) ->
``TransformWorkflow >> PredictPytorch >> TopK >> DecodeItemIds`` -> Triton model repository ->
tritonserver -> the schema-driven client -> the top-10 raw item ids of a few held-out sessions.

The repository is mixed when Triton's pytorch backend is built for this torch (the workflow on the
python backend; the model, TopK and DecodeItemIds compiled into one libtorch model), else all
python (the four operators fused into one python-backend model); ``--backend`` picks one.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: make `examples.session_based` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd

from examples.session_based import data, features, model
from merlin_torch_serving import (
    Client,
    DecodeItemIds,
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
    TritonServer,
)
from merlin_torch_serving.backends import built_for_running_torch
from merlin_torch_serving.backends.pytorch_build import BUILD_COMMAND
from merlin_torch_serving.client import column_names

MODEL_NAME = "session_recs"
TOP_K = 10
# Categorify's padding, null and out-of-vocabulary ids: never worth recommending
RESERVED_IDS = (0, 1, 2)


def recommendation_graph(
    workflow,
    session_model,
    *,
    k: int = TOP_K,
    backend: str = "python",
    workflow_backend: str = "python",
    compiled: str | None = None,
):
    """Raw clicks in; per session: its id, the k best raw item ids not yet clicked, their scores.
    ``backend`` is the model's, ``workflow_backend`` the workflow's ("pytorch": its TorchScript
    form, into which the model and the rest compile when they run on libtorch too); ``compiled``
    what their libtorch step is ("auto": an AOTInductor package where it can be, "torchscript";
    None: ``$MTS_COMPILED``)."""
    session_features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, backend=workflow_backend, compiled=compiled
    )
    recommendations = (
        session_features
        >> PredictPytorch(session_model, backend=backend, compiled=compiled)
        >> TopK(k, seen_items=session_features["item_id-list"], exclude_ids=RESERVED_IDS)
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    return session_features["session_id"] + recommendations


def choose_backend(requested: str | None) -> tuple[str, str]:
    """The backend of the model step and the repository it makes, in words: ``requested``, or
    "pytorch" when Triton's pytorch backend is built for this torch, else "python"."""
    built = built_for_running_torch() is not None
    if requested == "pytorch" and not built:
        raise SystemExit(
            "error: --backend pytorch needs Triton's pytorch backend built for this torch; run"
            f" `{BUILD_COMMAND} --sources PATH` (PATH: its release sources) or leave --backend out"
            " to serve the all-python repository"
        )
    backend = requested or ("pytorch" if built else "python")
    if backend == "pytorch":
        return (
            backend,
            (
                "the mixed repository: TransformWorkflow on the python backend; PredictPytorch,"
                " TopK and DecodeItemIds compiled into one libtorch model on Triton's pytorch"
                " backend"
            ),
        )
    reason = (
        ""
        if requested or built
        else f" (Triton's pytorch backend is not built for this torch; `{BUILD_COMMAND}` builds it)"
    )
    return (
        backend,
        (
            "the all-python repository: the four operators fused into one python-backend"
            f" model{reason}"
        ),
    )


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = _parse_args(argv)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    _step("1/6 interactions")
    if args.interactions:
        try:
            clicks = data.read_interactions(args.interactions, columns=args.columns)
        except (FileNotFoundError, ValueError) as error:
            raise SystemExit(f"error: {error}") from None
    else:
        clicks = data.generate_interactions(n_sessions=args.sessions, seed=args.seed)
        data.write_interactions(clicks, output / "interactions.parquet")
    train, held_out = data.split_by_time(clicks)
    print(
        f"{len(clicks):,} clicks in {clicks['session_id'].nunique():,} sessions over"
        f" {clicks['item_id'].nunique():,} items; {held_out['session_id'].nunique():,} latest"
        " sessions held out"
    )

    _step("2/6 NVTabular workflow")
    workflow = features.fit_workflow(train, output / "workflow")
    processed_train = features.transform(workflow, train)
    processed_held_out = features.transform(workflow, held_out)
    print(f"fitted and saved to {output / 'workflow'}; {len(processed_train):,} training sessions")

    _step("3/6 Transformers4Rec XLNet, trained on CPU")
    started = time.perf_counter()
    session_model = model.build_model(workflow.output_schema)
    model.train(session_model, processed_train, epochs=args.epochs, progress=True)
    recall = model.evaluate_recall(session_model, processed_held_out, k=TOP_K)
    popularity = model.popularity_recall(processed_train, processed_held_out, k=TOP_K)
    print(
        f"trained in {time.perf_counter() - started:.1f} s; held-out recall@{TOP_K}: {recall:.3f} "
        f"(most-popular baseline: {popularity:.3f})"
    )

    _step("4/6 ensemble, checked edge by edge, exported to a Triton model repository")
    backend, served_repository = choose_backend(args.backend)
    ensemble = Ensemble(
        recommendation_graph(workflow, session_model, backend=backend), workflow.input_schema
    )
    repository = output / "repository"
    exported = ensemble.export(repository, MODEL_NAME, overwrite=True)
    print(f"{repository}: {', '.join(exported.models)}")
    print(f"this is {served_repository}")

    _step("5/6 tritonserver")
    requested = held_out[held_out["session_id"].isin(held_out["session_id"].unique()[: args.show])]
    with TritonServer(repository) as server:
        print(f"serving {MODEL_NAME!r} at {server.grpc_url} (gRPC) and {server.http_url} (HTTP)")
        _step("6/6 recommendations for held-out sessions, from raw clicks through the client")
        answer = Client(server.grpc_url).infer(MODEL_NAME, requested)
    _print_recommendations(requested, answer)
    print(f"\nserved from {served_repository}")
    return answer


def _print_recommendations(clicks: pd.DataFrame, answer: pd.DataFrame) -> None:
    history = clicks.sort_values("timestamp").groupby("session_id")["item_id"].apply(list)
    for row in answer.itertuples(index=False):
        recent = history[row.session_id][-5:]
        print(f"\nsession {row.session_id}: last clicks {recent}")
        print(f"  top-{len(row.item_ids)} items:  {list(map(int, row.item_ids))}")
        print(f"  scores:        {[round(float(s), 2) for s in row.item_scores]}")


def _step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add(
        "--interactions",
        help=(
            "a .parquet or .csv file of clicks (session_id, item_id, category, "
            "timestamp); default: synthetic clicks"
        ),
    )
    add(
        "--columns",
        type=column_names.argument,
        default=None,
        metavar="YOURS=EXPECTED,...",
        help=(
            "the file's names for the four columns, e.g."
            " user_session=session_id,product=item_id,category_code=category,ts=timestamp"
        ),
    )
    add(
        "--output",
        default="demo-output",
        help="folder for the workflow, the data and the model repository (default: %(default)s)",
    )
    add(
        "--sessions",
        type=int,
        default=5000,
        help="synthetic sessions to generate (default: %(default)s)",
    )
    add("--epochs", type=int, default=10, help="training epochs (default: %(default)s)")
    add(
        "--show",
        type=int,
        default=3,
        help="held-out sessions to recommend for (default: %(default)s)",
    )
    add("--seed", type=int, default=0, help="seed of the synthetic clicks (default: %(default)s)")
    add(
        "--backend",
        choices=("pytorch", "python"),
        default=None,
        help=(
            "backend of the model step: pytorch (the mixed repository; needs Triton's pytorch"
            " backend built) or python (all python); default: pytorch when it is built for this"
            " torch, else python"
        ),
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
