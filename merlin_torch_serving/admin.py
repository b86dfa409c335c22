"""The server's admin endpoints (model configs, statistics) through ``tritonclient.http``.

Each call opens a client and closes it: tritonclient's HTTP client is not safe to share between
threads, and a connection kept open would make tritonserver wait for it, up to its exit
timeout, when it is stopped.
"""

from __future__ import annotations

from merlin_torch_serving.exceptions import ServerError


class Admin:
    def __init__(self, url: str, timeout_s: float):
        self.url = url
        self._timeout_s = timeout_s

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

        import tritonclient.http

        client = tritonclient.http.InferenceServerClient(
            self.url, connection_timeout=self._timeout_s, network_timeout=self._timeout_s
        )
        try:
            return getattr(client, method)(*args)
        except (InferenceServerException, OSError) as error:
            raise ServerError(f"tritonserver at {self.url} did not answer {method}: {error}") from error
        finally:
            client.close()
