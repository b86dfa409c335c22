"""Ensembles warmed end to end once they load, before the launcher hands the server over.

Triton warms each step model on its own (``model_warmup``, sent straight to its instances while it
loads) and refuses a warm-up for an ensemble. The first request through an ensemble was then the
first to cross its scheduler, the frontend it came by and the hand-over between its steps, and
found steps idle since they loaded (a libtorch step is ready seconds before a python step that
imports torch, and any step's last warm-up ran a poll interval or more before the server was
called ready); a python step's CPU a request also keeps falling over its first few dozen requests
(the interpreter specialises its bytecode, the allocators settle), so three warm-up runs leave it
short of its steady cost.

The launcher therefore sends every ensemble the request its export saved beside it
(``export.warmup_files.read_request_sample``; ``ModelOptions.warmup_count`` times over gRPC, then
once over HTTP) when the server starts and after ``TritonServer.load``. Each carries the request
parameter ``step_metrics.WARMUP_REQUEST_PARAMETER``, which Triton forwards to every step: the
steps rehearse them (``graph.rehearsal``: a live session stores nothing) and their own metrics leave
them out, as for Triton's warm-up (Triton's statistics count both; the steps of a route's branches,
which its step calls by BLS, neither rehearse nor leave them out).
An ensemble read from object storage, or exported without a sample (``warmup_count=0``, or a
graph that failed on every warm-up candidate), is not warmed this way; a warm-up that fails is
logged and the server serves on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from merlin_torch_serving.data import wire
from merlin_torch_serving.export.step_metrics import WARMUP_REQUEST_PARAMETER
from merlin_torch_serving.export.warmup_files import read_request_sample

logger = logging.getLogger("merlin_torch_serving")
#: how long one warm-up request may take
REQUEST_TIMEOUT_S = 60.0


def warm_up_ensembles(
    repository: Path | str, models: Iterable[str], grpc_url: str, http_url: str
) -> list[str]:
    """Send each of ``models`` that has a saved request its warm-up; the ensembles warmed."""
    if not isinstance(repository, Path):
        return []
    warmed = []
    for model in models:
        sample = read_request_sample(repository / model)
        if sample is None:
            continue
        arrays, count = sample
        began = time.monotonic()
        try:
            for protocol, url, times in (("grpc", grpc_url, count), ("http", http_url, 1)):
                _send(protocol, url, model, arrays, times)
        except Exception as error:  # a warm-up never stops the server from serving
            logger.warning("ensemble %r: its end-to-end warm-up failed: %s", model, error)
            continue
        logger.info(
            "ensemble %r warmed end to end (%d requests in %.0f ms)",
            model,
            count + 1,
            (time.monotonic() - began) * 1000.0,
        )
        warmed.append(model)
    return warmed


def _send(protocol: str, url: str, model: str, arrays: dict, times: int) -> None:
    """Send ``arrays`` to ``model`` ``times`` times over ``protocol``, one at a time."""
    if protocol == "grpc":
        import tritonclient.grpc as module

        client = module.InferenceServerClient(url)
        timeout = {"client_timeout": REQUEST_TIMEOUT_S}
    else:
        import tritonclient.http as module

        client = module.InferenceServerClient(
            url, connection_timeout=REQUEST_TIMEOUT_S, network_timeout=REQUEST_TIMEOUT_S
        )
        timeout = {}
    try:
        inputs = []
        for name, array in arrays.items():
            tensor = module.InferInput(name, list(array.shape), wire.triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        for _ in range(times):
            client.infer(model, inputs, parameters={WARMUP_REQUEST_PARAMETER: True}, **timeout)
    finally:
        client.close()
