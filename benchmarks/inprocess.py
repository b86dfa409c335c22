"""The limit: the same ensemble run in this process with the LocalExecutor, whole and operator by
operator, so a served latency can be compared with the compute it cannot avoid.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, LocalExecutor
from merlin_torch_serving.data import frames
from merlin_torch_serving.graph.plan import REQUEST, Ref, run_calls

# The operators whose sum is "the compute": the rest only converts or decodes.
COMPUTE_OPERATORS = ("TransformWorkflow", "PredictPytorch", "TopK")


def in_process_sender(ensemble: Ensemble, requests: list[pd.DataFrame]) -> Callable[[int], None]:
    """Request ``i`` is ``ensemble.transform`` of frame ``i`` (DataFrame in, DataFrame out)."""
    executor = LocalExecutor()

    def send(index: int) -> None:
        ensemble.transform(requests[index % len(requests)], executor)

    return send


def time_parts(
    ensemble: Ensemble, requests: list[pd.DataFrame], repetitions: int, time_budget_s: float
) -> dict[str, float]:
    """Median milliseconds of each part of ``ensemble.transform``, over ``repetitions`` requests
    (fewer if ``time_budget_s`` runs out) sent after one untimed pass over all ``requests``.

    The untimed pass lets anything that warms up per input shape (TorchScript's optimizing
    executor, when it is on) see every shape first, as the served systems do.

    Parts: the DataFrame-to-table conversion, every operator of the plan by its label, and the
    table-to-DataFrame conversion; ``compute sum`` adds the medians of COMPUTE_OPERATORS and
    ``total`` is the median of whole requests timed the same way.
    """
    plan = ensemble.plan
    samples: dict[str, list[float]] = {}
    compute_labels = {
        call.op.label for call in plan.calls if type(call.op).__name__ in COMPUTE_OPERATORS
    }
    for frame in requests:
        ensemble.transform(frame)
    deadline = time.perf_counter() + time_budget_s
    for index in range(repetitions):
        if index > 0 and time.perf_counter() >= deadline:
            break
        frame = requests[index % len(requests)]
        began = time.perf_counter()
        table = frames.frame_to_table(frame, ensemble.input_schema)
        _record(samples, "request to table", began)
        env = {Ref(REQUEST, name): column for name, column in table.items()}
        for call in plan.calls:
            began_call = time.perf_counter()
            run_calls([call], env, {})
            _record(samples, call.op.label, began_call)
        converted = time.perf_counter()
        outputs = {name: env[ref] for name, ref in plan.outputs.items()}
        frames.table_to_frame(TensorTable(outputs, _unsafe=True))
        _record(samples, "table to DataFrame", converted)
        _record(samples, "total", began)
    medians = {part: float(np.median(values)) for part, values in samples.items()}
    medians["compute sum"] = float(sum(medians[label] for label in compute_labels))
    return {part: round(ms, 4) for part, ms in medians.items()}


def _record(samples: dict[str, list[float]], part: str, began: float) -> None:
    samples.setdefault(part, []).append((time.perf_counter() - began) * 1000.0)
