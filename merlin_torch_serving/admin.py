"""The server's admin endpoints (model configs, statistics) through ``tritonclient.http``.

tritonclient's HTTP client is not safe to share between threads, so each thread that asks gets a
client of its own.
"""

from __future__ import annotations

import threading

from merlin_torch_serving.exceptions import ServerError


class Admin:
    def __init__(self, url: str, timeout_s: float):
        self.url = url
        self._timeout_s = timeout_s
        self._local = threading.local()

    def model_config(self, name: str, version: int | None = None) -> dict:
        """The config the server runs model ``name`` (``version``) with, as JSON."""
        return self._call("get_model_config", name, str(version or ""))

    def failed_requests(self) -> dict[tuple[str, int], int]:
        """``(model, version) -> requests answered with an error`` since each version loaded."""
        stats = self._call("get_inference_statistics")
        return {
            (entry["name"], int(entry["version"] or 0)): int(entry["inference_stats"]["fail"]["count"])
            for entry in stats.get("model_stats", [])
        }

    def _call(self, method: str, *args):
        from tritonclient.utils import InferenceServerException

        client = getattr(self._local, "client", None)
        if client is None:
            import tritonclient.http

            client = tritonclient.http.InferenceServerClient(
                self.url, connection_timeout=self._timeout_s, network_timeout=self._timeout_s
            )
            self._local.client = client
        try:
            return getattr(client, method)(*args)
        except (InferenceServerException, OSError) as error:
            raise ServerError(f"tritonserver at {self.url} did not answer {method}: {error}") from error
