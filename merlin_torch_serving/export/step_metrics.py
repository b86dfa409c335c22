"""Publishing a python step's counts through the python backend's metrics API, on the server's
Prometheus endpoint beside Triton's own ``nv_*`` metrics.

Every series carries the step's ``model`` label. Warm-up requests (the ``model_warmup`` runs
Triton sends each instance while loading it) are left out, so the counts are the traffic's;
Triton's own ``nv_inference_count`` counts them too.

    mts_requests_total{model}                     requests the step answered
    mts_sessions_total{model}                     rows it answered with (one per session)
    mts_filtered_sessions_total{model}            sessions the workflow's filters dropped (answered blank)
    mts_oov_ids_total{model,column}               out-of-vocabulary values Categorify met (fast path)
    mts_fastpath_fallbacks_total{model,operator}  workflow operators run through NVTabular
    mts_operator_seconds_total{model,operator}    time inside each operator of the (fused) step

A series appears with its first non-zero count. Each increment is a message to the server process, so one request costs one
per series it touched.
"""

from __future__ import annotations

from merlin_torch_serving import metrics

PREFIX = "mts_"
REQUESTS = "requests"
DESCRIPTIONS = {
    REQUESTS: "Requests a merlin_torch_serving python step answered (warm-up excluded)",
    metrics.SESSIONS: "Rows (sessions) a python step answered with",
    metrics.FILTERED_SESSIONS: "Sessions of the request that the workflow's filters dropped",
    metrics.OOV_IDS: "Out-of-vocabulary values Categorify met on the fast path, per column",
    metrics.FASTPATH_FALLBACKS: "Workflow operator runs that went through NVTabular instead of the fast path",
    metrics.OPERATOR_SECONDS: "Seconds spent inside each operator of a python step",
}


def prometheus_name(name: str) -> str:
    return f"{PREFIX}{name}_total"


def warmup_runs(model_config: dict) -> int:
    """How many requests Triton sends each instance while loading it (its ``model_warmup``)."""
    return sum(int(sample.get("count", 1) or 1) for sample in model_config.get("model_warmup", []))


class StepMetrics:
    """The counters of one model instance; ``publish`` adds what one request collected."""

    def __init__(self, pb_utils, model_name: str, warmup_requests: int):
        self._pb = pb_utils
        self._model = model_name
        self._warmup_left = warmup_requests
        self._families = {}
        self._series = {}

    def publish(self, collected: metrics.Collected) -> None:
        """Add one answered request's counts (nothing for a warm-up request)."""
        if self.skip_warmup():
            return
        self._add(REQUESTS, 1, ())
        for (name, labels), value in collected.totals.items():
            self._add(name, value, labels)

    def skip_warmup(self) -> bool:
        """True while the request at hand is one of the instance's warm-up requests (answered or
        not: a failed warm-up request is still one of them)."""
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return True
        return False

    def close(self) -> None:
        """Drop the series before their families, the order the python backend requires."""
        self._series.clear()
        self._families.clear()

    def _add(self, name: str, value: float, labels: tuple) -> None:
        if not value:
            return
        key = (name, labels)
        series = self._series.get(key)
        if series is None:
            family = self._families.get(name)
            if family is None:
                family = self._pb.MetricFamily(
                    name=prometheus_name(name),
                    description=DESCRIPTIONS.get(name, name),
                    kind=self._pb.MetricFamily.COUNTER,
                )
                self._families[name] = family
            series = self._series[key] = family.Metric(labels={"model": self._model, **dict(labels)})
        series.increment(float(value))
