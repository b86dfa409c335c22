"""Where the server spends a request: Triton's own per-model statistics (time in queue, time in the
model), differenced over a measurement, so client latency can be split into server and transport.
"""

from __future__ import annotations

import tritonclient.http as httpclient

from merlin_torch_serving.launcher import access

_PHASES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def snapshot(http_url: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per model, per phase: (count, total ns) since the server started."""
    client = httpclient.InferenceServerClient(http_url)
    try:
        # statistics are an admin API: the key of a server this user started is in its key file
        statistics = client.get_inference_statistics(
            headers=access.headers(access.find_admin_key(http_url))
        )
    finally:
        client.close()
    counters = {}
    for model in statistics.get("model_stats", []):
        inference = model.get("inference_stats", {})
        counters[model["name"]] = {
            phase: (
                int(inference.get(phase, {}).get("count", 0)),
                int(inference.get(phase, {}).get("ns", 0)),
            )
            for phase in _PHASES
        }
    return counters


def per_request_ms(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Mean milliseconds per request of each model between two snapshots, for models that ran.

    ``request_ms`` is the whole time Triton counts for the model (queue and compute); an
    ensemble's includes its steps, a step's includes its python stub round trip.
    """
    means = {}
    for model, phases in after.items():
        count = phases["success"][0] - before.get(model, {}).get("success", (0, 0))[0]
        if count <= 0:
            continue

        previous = before.get(model, {})
        mean_ms = {
            phase: round((total_ns - previous.get(phase, (0, 0))[1]) / count / 1e6, 4)
            for phase, (_, total_ns) in phases.items()
        }
        means[model] = {
            "requests": count,
            "request_ms": mean_ms["success"],
            "queue_ms": mean_ms["queue"],
            "compute_ms": round(
                mean_ms["compute_input"] + mean_ms["compute_infer"] + mean_ms["compute_output"], 4
            ),
        }
    return means


def server_version(http_url: str) -> str | None:
    client = httpclient.InferenceServerClient(http_url)
    try:
        return client.get_server_metadata().get("version")
    finally:
        client.close()
