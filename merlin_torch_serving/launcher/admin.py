"""The server's admin endpoints (liveness, repository index, load and unload, model configs,
statistics) through ``tritonclient.http``, each carrying the server's admin key.

Each call opens a client and closes it: tritonclient's HTTP client is not safe to share between
threads, and a connection kept open would make tritonserver wait for it, up to its exit
timeout, when it is stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from merlin_torch_serving.client.health import ModelStatus, model_statuses
from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.launcher import access

#: how long a call other than load and unload may take
REQUEST_TIMEOUT_S = 10.0


class Refused(Exception):
    """The server answered a load or unload with an error.

    ``reason`` is its message, ``status`` the HTTP status.
    """

    def __init__(self, reason: str, status: str):
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Admin:
    """Admin calls to the server at ``url`` (``host:port`` of its HTTP endpoint).

    A call the server does not answer, or refuses, raises ``ServerError`` with ``log_tail()``
    appended; but a load or unload the server refuses raises ``Refused``, and one it does not
    finish in time ``TimeoutError``. ``before_error`` runs before a call that found nobody to
    answer raises: it may raise an error that says why (the server exited). ``admin_key`` is sent
    with every call (``launcher.access``).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = REQUEST_TIMEOUT_S,
        *,
        admin_key: str | None = None,
        log_tail: Callable[[], str] = str,
        before_error: Callable[[], None] = lambda: None,
    ):
        self.url = url
        self._headers = access.headers(admin_key)
        self._timeout_s = timeout_s
        self._log_tail = log_tail
        self._before_error = before_error

    def is_live(self) -> bool:
        """Whether GET /v2/health/live answers 200 within a second; False on any error."""
        try:
            return bool(self._call("is_server_live", timeout_s=1.0))
        except (ServerError, TimeoutError):
            return False

    def models(self) -> list[ModelStatus]:
        """The repository index: one ``ModelStatus`` per model folder.

        Each holds the state of every version the server knows.
        """
        return model_statuses(
            self._call("get_model_repository_index", what="the repository index request")
        )

    def load(self, name: str, timeout_s: float, *, config: str | None = None) -> None:
        """Load (or reload) model ``name``; returns once it is loaded. ``config`` (JSON) replaces
        the repository's config.pbtxt: when only its instances differ from the running config,
        Triton adds or removes instances in place."""
        extra = {"config": config} if config is not None else {}
        self._call("load_model", name, timeout_s=timeout_s, refusable=True, **extra)

    def unload(self, name: str, timeout_s: float) -> None:
        """Ask the server to unload model ``name``; it may still be unloading when this returns."""
        self._call("unload_model", name, timeout_s=timeout_s, refusable=True)

    def model_config(self, name: str, version: int | None = None) -> dict:
        """The config the server runs model ``name`` (``version``) with, as JSON."""
        return self._call("get_model_config", name, str(version or ""))

    def statistics(self) -> dict:
        """Every model version's inference statistics (read with ``client.health``'s parsers)."""
        return self._call("get_inference_statistics")

    def _call(
        self,
        method: str,
        *args: Any,
        timeout_s: float | None = None,
        what: str = "",
        refusable: bool = False,
        **keywords: Any,
    ) -> Any:
        from tritonclient.http import InferenceServerClient
        from tritonclient.utils import InferenceServerException

        timeout_s = timeout_s if timeout_s is not None else self._timeout_s
        what = what or method
        client = InferenceServerClient(
            self.url, connection_timeout=timeout_s, network_timeout=timeout_s
        )
        try:
            return getattr(client, method)(*args, headers=self._headers, **keywords)
        except InferenceServerException as error:
            if refusable:
                raise Refused(_message(error), str(error.status())) from None
            raise ServerError(
                f"tritonserver at {self.url} refused {what} (HTTP {error.status()}):"
                f" {_message(error)}",
                self._log_tail(),
            ) from None
        except TimeoutError:
            if refusable:
                raise  # the caller words it: it knows what a load or unload that takes long means
            raise ServerError(
                f"tritonserver at {self.url} did not answer {what} within {timeout_s:g} s",
                self._log_tail(),
            ) from None
        except OSError as error:
            self._before_error()
            raise ServerError(
                f"tritonserver at {self.url} did not answer {what}: {error}", self._log_tail()
            ) from error
        finally:
            client.close()


def _message(error: Any) -> str:
    return str(error.message()).strip().rstrip(";").strip() or "(empty answer)"
