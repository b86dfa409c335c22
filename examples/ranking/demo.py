"""A click-through-rate ranking model end to end, on one machine without a GPU.

    python examples/ranking/demo.py [--output ranking-output] [--rows 20000] [--backend auto]

synthetic impressions -> row-per-row NVTabular workflow (Categorify, FillMissing, Normalize) ->
DLRM-style model (trained here, on CPU) -> ``TransformWorkflow >> PredictPytorch`` -> Triton model
repository (the workflow on the python backend, the model on libtorch when the server has it) ->
tritonserver -> the schema-driven client -> click probabilities of held-out impressions.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: make `examples.ranking` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import pandas as pd

from examples.ranking import data, features, model
from merlin_torch_serving import Client, Ensemble, PredictPytorch, TransformWorkflow, TritonServer

MODEL_NAME = "ctr"


def scoring_graph(workflow, ctr_model, *, backend: str = "pytorch", compiled: str | None = None):
    """Raw impression rows in; the click probability of each row out, in request order. With
    ``backend="pytorch"``, ``compiled`` says what the model's libtorch step is (see
    ``PredictPytorch``)."""
    return (
        workflow.input_schema.column_names
        >> TransformWorkflow(workflow)
        >> PredictPytorch(
            ctr_model,
            workflow.output_schema,
            model.output_schema(),
            backend=backend,
            compiled=compiled,
        )
    )


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = _parse_args(argv)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("merlin").setLevel(logging.WARNING)

    _step("1/5 impressions")
    impressions = data.generate_impressions(args.rows, seed=args.seed)
    train, held_out = data.split(impressions, seed=args.seed)
    print(
        f"{len(train):,} training rows, {len(held_out):,} held out; click rate"
        f" {train[data.LABEL_COLUMN].mean():.3f}"
    )

    _step("2/5 workflow (Categorify, FillMissing, Normalize)")
    workflow = features.fit_workflow(train, output / "workflow")
    train_features = features.transform(workflow, train)

    _step("3/5 model")
    ctr_model = model.build_model(workflow.output_schema)
    losses = model.train(
        ctr_model, train_features, train[data.LABEL_COLUMN].to_numpy(), epochs=args.epochs
    )
    print(f"loss per epoch: {', '.join(f'{loss:.3f}' for loss in losses)}")

    _step("4/5 export")
    server = TritonServer(output / "repository")
    backend = (
        args.backend
        if args.backend != "auto"
        else ("pytorch" if "pytorch" in server.backends() else "python")
    )
    ensemble = Ensemble(scoring_graph(workflow, ctr_model, backend=backend), workflow.input_schema)
    result = ensemble.export(output / "repository", MODEL_NAME, overwrite=True)
    print(f"model {backend!r} backend; steps: {', '.join(result.models)}")

    _step("5/5 serve and score held-out impressions")
    request = held_out.drop(columns=[data.LABEL_COLUMN])
    with server:
        scored = Client(server.grpc_url).infer(MODEL_NAME, request)
    in_process = ensemble.transform(request)  # with the torch threads served models use
    same = np.array_equal(
        scored[model.OUTPUT_COLUMN].to_numpy(), in_process[model.OUTPUT_COLUMN].to_numpy()
    )
    labels = held_out[data.LABEL_COLUMN].to_numpy()
    print(
        f"served == in-process: {same}; held-out AUC"
        f" {model.auc(scored[model.OUTPUT_COLUMN], labels):.3f}"
    )
    shown = held_out.head(args.show).assign(
        **{model.OUTPUT_COLUMN: scored[model.OUTPUT_COLUMN].head(args.show)}
    )
    print(shown.to_string(index=False))
    return scored


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", default="ranking-output", help="folder for the workflow and the repository"
    )
    parser.add_argument(
        "--rows", type=int, default=20_000, help="synthetic impressions to generate"
    )
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--backend",
        choices=["auto", "python", "pytorch"],
        default="auto",
        help="where the model runs; auto: libtorch when the server has it",
    )
    parser.add_argument("--show", type=int, default=8, help="held-out rows to print")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _step(title: str) -> None:
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
    main()
