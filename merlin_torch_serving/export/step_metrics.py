"""Publishing a python step's counts through the python backend's metrics API, on the server's
Prometheus endpoint beside Triton's own ``nv_*`` metrics.

Every series carries the step's ``model`` label. Warm-up requests (the ``model_warmup`` runs
Triton sends each instance while loading it, and the launcher's requests through the whole
ensemble, which carry the request parameter ``WARMUP_REQUEST_PARAMETER``) are left out, so the
counts are the traffic's; Triton's own ``nv_inference_count`` counts them too.

    mts_requests_total{model}                     requests the step answered
    mts_sessions_total{model}                     rows it answered with (one per session)
    mts_filtered_sessions_total{model}            sessions the workflow's filters dropped (blank)
    mts_oov_ids_total{model,column}               out-of-vocabulary values Categorify met (fast)
    mts_fastpath_fallbacks_total{model,operator}  workflow operators run through NVTabular
    mts_operator_seconds_total{model,operator}    time inside each operator of the (fused) step
    mts_invalid_candidates_total{model}           -1 ids (an index's padding) dropped
    mts_excluded_candidates_total{model}          candidates dropped as seen or blocked
    mts_short_answers_total{model}                sessions answered with fewer than k items
    mts_empty_answers_total{model}                sessions answered with no item at all
    mts_missing_entities_total{model,lookup}      keys a feature lookup did not find (defaults)
    mts_unanswered_entities_total{model,lookup}   keys answered with defaults: no feature server
    mts_feature_server_errors_total{model,lookup} calls to a feature server that failed
    mts_branch_calls_total{model,branch}          calls of a route's branch (one per request)
    mts_branch_seconds_total{model,branch}        time inside them (mean: seconds / calls)
    mts_branch_errors_total{model,branch}         sessions whose branch failed
    mts_store_errors_total{model,store}           calls to a store that failed or were skipped
    mts_unstored_clicks_total{model}              clicks answered from the request alone
    mts_answer_log_written_total{model}           answers the answer log wrote (one per session)
    mts_answer_log_dropped_total{model}           answers it dropped: its queue full, writes failing
    mts_answer_log_failed_flushes_total{model}    its flushes that failed (a full disk, Redis down)

A step that hosts a route counts its sessions per branch that answered them (and per variant,
with an experiment): ``mts_sessions_total{model,branch[,variant]}``.

A series appears with its first non-zero count. Each increment is a message to the server process
that waits for its answer (~12 us on an idle machine, a scheduler time slice or more on a busy
one), so a request only adds its counts to a pending total, and a thread of the stub publishes
that total once a second (``FLUSH_INTERVAL_S``), off the request path: a scrape sees a request
within about a second.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from merlin_torch_serving.graph import metrics

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0

#: a request parameter that marks a warm-up request sent through a whole ensemble (Triton forwards
#: an ensemble request's parameters to its steps; see ``launcher.warmup``)
WARMUP_REQUEST_PARAMETER = "mts_warmup"

PREFIX = "mts_"
REQUESTS = "requests"
DESCRIPTIONS = {
    REQUESTS: "Requests a merlin_torch_serving python step answered (warm-up excluded)",
    metrics.SESSIONS: "Rows (sessions) a python step answered with",
    metrics.FILTERED_SESSIONS: "Sessions of the request that the workflow's filters dropped",
    metrics.OOV_IDS: "Out-of-vocabulary values Categorify met on the fast path, per column",
    metrics.FASTPATH_FALLBACKS: (
        "Workflow operator runs that went through NVTabular instead of the fast path"
    ),
    metrics.OPERATOR_SECONDS: "Seconds spent inside each operator of a python step",
    metrics.INVALID_CANDIDATES: "Candidate ids below 0 (an index's padding) dropped",
    metrics.EXCLUDED_CANDIDATES: "Candidates dropped as seen by the session or blocked",
    metrics.SHORT_ANSWERS: "Sessions answered with fewer items than asked for",
    metrics.EMPTY_ANSWERS: "Sessions answered with no item (no candidate survived)",
    metrics.MISSING_ENTITIES: "Keys a feature lookup did not find, answered with the defaults",
    metrics.UNANSWERED_ENTITIES: (
        "Keys answered with the defaults because the feature server failed or was skipped"
    ),
    metrics.FEATURE_SERVER_ERRORS: "Calls to a feature server that failed (refused, timed out)",
    metrics.BRANCH_CALLS: "Calls of a route's branch (one per request that sent it sessions)",
    metrics.BRANCH_SECONDS: "Seconds spent inside the calls of a route's branch",
    metrics.BRANCH_ERRORS: "Sessions whose route branch failed (answered by a fallback, or blank)",
    metrics.STORE_ERRORS: "Calls to a store (sessions, rules, trending) that failed, or skipped",
    metrics.UNSTORED_CLICKS: "Clicks answered from the request alone: the store did not take them",
    metrics.ANSWER_LOG_WRITTEN: "Answered sessions the answer log wrote",
    metrics.ANSWER_LOG_DROPPED: (
        "Answered sessions the answer log dropped: its queue was full while writes failed"
    ),
    metrics.ANSWER_LOG_FAILED_FLUSHES: "Answer log flushes that failed (disk full, Redis down)",
}


def prometheus_name(name: str) -> str:
    return f"{PREFIX}{name}_total"


def is_warmup_request(request) -> bool:
    """Whether the python backend's ``request`` carries ``WARMUP_REQUEST_PARAMETER``."""
    parameters = getattr(request, "parameters", None)  # python backends before 23.10 have none
    if parameters is None:
        return False
    try:
        return WARMUP_REQUEST_PARAMETER in json.loads(parameters() or "{}")
    except (TypeError, ValueError):
        return False


def warmup_runs(model_config: dict) -> int:
    """How many requests Triton sends each instance while loading it (its ``model_warmup``)."""
    return sum(int(sample.get("count", 1) or 1) for sample in model_config.get("model_warmup", []))


class StepMetrics:
    """The counters of one model instance: ``publish`` adds what one request collected to the
    pending totals, which a thread sends to the server every ``flush_interval_s``."""

    def __init__(
        self,
        pb_utils,
        model_name: str,
        warmup_requests: int,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ):
        self._pb = pb_utils
        self._model = model_name
        self._warmup_left = warmup_requests
        # pb_utils.MetricFamily and its Metric objects, made on first use
        self._families: dict[str, Any] = {}
        self._series: dict[metrics.Key, Any] = {}
        self._pending: dict[metrics.Key, float] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_every,
            args=(flush_interval_s,),
            name=f"mts-metrics-{model_name}",
            daemon=True,
        )
        self._flusher.start()

    def publish(self, collected: metrics.Collected, requests: int = 1) -> None:
        """Add the counts of what one call of the model answered, ``requests`` requests (nothing
        for a warm-up request: Triton sends those one a call)."""
        if self.skip_warmup():
            return
        with self._lock:
            pending = self._pending
            pending[(REQUESTS, ())] = pending.get((REQUESTS, ()), 0.0) + requests
            for key, value in collected.totals.items():
                pending[key] = pending.get(key, 0.0) + value

    def skip_warmup(self) -> bool:
        """True while the request at hand is one of the instance's warm-up requests (answered or
        not: a failed warm-up request is still one of them)."""
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return True
        return False

    def flush(self) -> None:
        """Send the pending totals to the server."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for (name, labels), value in pending.items():
            self._add(name, value, labels)

    def close(self) -> None:
        """Stop the thread, send what is pending, and drop the series before their families, the
        order the python backend requires."""
        self._stopped.set()
        self._flusher.join(timeout=10)
        self.flush()
        self._series.clear()
        self._families.clear()

    def _flush_every(self, interval_s: float) -> None:
        while not self._stopped.wait(interval_s):
            try:
                self.flush()
            except Exception:  # a lost batch of counts must not stop the ones after it
                logger.exception("publishing the metrics of model %r failed", self._model)

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
            series = self._series[key] = family.Metric(
                labels={"model": self._model, **dict(labels)}
            )
        series.increment(float(value))
