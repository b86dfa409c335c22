"""What the launcher and the client both read of a model: the repository index, the statistics,
the probe that tells a client whether a python model's stub answers, and the outside services a
model's config names, each URL asked once."""

from __future__ import annotations

import http.server
import json
import threading

import numpy as np

from merlin_torch_serving.client.health import (
    SERVICES_PARAMETER,
    ModelStatus,
    failed_requests,
    model_statuses,
    probe_request,
    service_health,
    standbys_run,
)

# as tritonclient returns them: a list over HTTP, a message as JSON over gRPC
HTTP_INDEX = [
    {"name": "reco", "version": "1", "state": "READY"},
    {"name": "never_loaded"},
    {"name": "broken", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded\n"},
]
GRPC_INDEX = {
    "models": [
        {"name": "reco", "version": "1", "state": "READY", "reason": ""},
        {"name": "never_loaded"},
    ]
}


def test_the_repository_index_reads_the_same_over_http_and_grpc():
    assert model_statuses(HTTP_INDEX) == [
        ModelStatus("reco", 1, "READY", ""),
        ModelStatus("never_loaded", None, None, ""),
        ModelStatus("broken", 2, "UNAVAILABLE", "unloaded"),
    ]
    assert model_statuses(GRPC_INDEX) == model_statuses(HTTP_INDEX[:2])
    assert model_statuses({}) == []


def test_failed_requests_are_counted_per_model_version_and_zero_when_grpc_leaves_the_count_out():
    statistics = {
        "model_stats": [
            {
                "name": "reco",
                "version": "1",
                "inference_stats": {"fail": {"count": "3", "ns": "10"}},
            },
            {"name": "reco-0-step", "version": "1", "inference_stats": {"success": {"count": "9"}}},
            {"name": "never_loaded", "version": "", "inference_stats": {}},
        ]
    }
    assert failed_requests(statistics) == {
        ("reco", 1): 3,
        ("reco-0-step", 1): 0,
        ("never_loaded", 0): 0,
    }
    assert failed_requests({}) == {}


def test_an_ensembles_failed_requests_are_counted_once_though_the_server_counts_them_twice():
    # three requests failed in the ensemble's step, as tritonserver 2.51 reports them
    statistics = {
        "model_stats": [
            {"name": "reco", "version": "1", "inference_stats": {"fail": {"count": "6"}}},
            {"name": "reco-0-step", "version": "1", "inference_stats": {"fail": {"count": "3"}}},
        ]
    }
    assert failed_requests(statistics, ensembles=["reco"]) == {
        ("reco", 1): 3,
        ("reco-0-step", 1): 3,
    }


def test_the_probe_of_a_python_step_is_a_request_without_rows():
    config = {
        "backend": "python",
        "max_batch_size": 0,
        "input": [
            {"name": "items__values", "data_type": "TYPE_INT64", "dims": ["-1"]},
            {"name": "items__offsets", "data_type": "TYPE_INT32", "dims": ["-1"]},
            {"name": "scores", "data_type": "TYPE_FP32", "dims": ["-1", "4"]},
            {"name": "raw", "data_type": "TYPE_STRING", "dims": ["-1"]},
        ],
    }
    probe = probe_request(config)
    assert {name: (a.dtype, a.shape) for name, a in probe.items()} == {
        "items__values": (np.dtype("int64"), (0,)),
        "items__offsets": (np.dtype("int32"), (1,)),
        "scores": (np.dtype("float32"), (0, 4)),
        "raw": (np.dtype(object), (0,)),
    }
    assert probe["items__offsets"].tolist() == [0]
    # Triton refuses a batch of 0 items itself: a batched model gets one item of no rows
    batched = probe_request({**config, "max_batch_size": 8})
    assert {name: array.shape for name, array in batched.items()} == {
        name: (1, *shape)
        for name, (_, shape) in {n: (a.dtype, a.shape) for n, a in probe.items()}.items()
    }
    assert probe_request({"platform": "ensemble"}) is None


def test_a_model_whose_standby_an_ensemble_runs_is_found_in_the_ensembles_config():
    def ensemble(*steps):
        return {"ensemble_scheduling": {"step": [{"model_name": step} for step in steps]}}

    configs = [ensemble("reco-0-step-standby-2", "reco-1-model"), ensemble("other-0-step")]
    assert standbys_run(configs) == {"reco-0-step": "reco-0-step-standby-2"}
    assert standbys_run([ensemble("reco-0-step"), {"backend": "python"}]) == {}


def test_services_at_one_url_are_asked_once_and_each_reported():
    asked = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        names = ["session store", "rules store", "trending store"]
        listed = json.dumps([{"name": name, "url": url} for name in names])
        report = service_health({"parameters": {SERVICES_PARAMETER: {"string_value": listed}}})
    finally:
        server.shutdown()
        server.server_close()
    assert [(s.name, s.reachable, s.error) for s in report] == [
        (name, False, "HTTPError: HTTP Error 503: Service Unavailable") for name in names
    ]
    assert asked == ["/health"]
