"""A schema-driven client: raw rows in, one DataFrame row per output row (session) out.

The client reads an ensemble's input and output schemas from the server (the exporter stores
them in the ensemble config), builds the request in the wire format, and turns the answer back
into named columns. gRPC and HTTP differ only in the tritonclient module used.

It is built for real traffic: a big input is sent in requests of whole sessions that fit the
server's row limit (see ``chunks``), every call has a timeout, every transport error is one of
the library's exceptions, and errors that are safe to retry are retried with backoff (see
``transport``). What it says and makes of the answers is ``conversation``'s, shared with
``AsyncClient``; this class carries it out with blocking calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.client import conversation, transport
from merlin_torch_serving.client.conversation import Progress, Steps, T
from merlin_torch_serving.client.health import ModelHealth, ModelStatus
from merlin_torch_serving.client.model_schemas import ModelSchemas, schemas_from_config

Protocol = Literal["grpc", "http"]

__all__ = ["Client", "ModelSchemas", "Progress", "Protocol", "schemas_from_config"]


class Client(conversation.ClientSettings):
    """Talks to one tritonserver over gRPC (default) or HTTP.

    The HTTP client is not safe to share between threads: give each thread a Client of its own
    (the gRPC one may be shared). Its connection stays open between calls; ``close()`` (or a
    ``with`` block) closes it, and ``TritonServer.stop()`` closes it when idle (see
    ``transport.Connection``). An asyncio service uses ``AsyncClient``, which takes the same
    arguments and answers the same.

    Parameters
    ----------
    url
        ``host:port`` of the server's gRPC or HTTP endpoint (``TritonServer.grpc_url`` /
        ``.http_url``), without a scheme.
    protocol
        ``"grpc"`` or ``"http"``.
    timeout_s
        How long one request may take before ``RequestTimeoutError`` (the HTTP client also uses it
        to connect).
    max_rows_per_request
        Split bigger inputs into requests of at most this many rows, by whole sessions (clicks
        of one session always travel together). None: as many as the served ensemble accepts
        (its ``ModelOptions.max_request_rows``).
    retries, retry_backoff_s
        Errors that are safe to retry (server unreachable, model reloading, stub restarting) are
        tried again up to ``retries`` times, waiting ``retry_backoff_s``, then twice that, ...
    admin_key
        Sent with ``models()`` and ``health()``, which read the server's restricted APIs (its
        repository index and statistics); inference needs no key. None: ``$MTS_ADMIN_KEY``, or
        the key file a ``TritonServer`` of this user wrote for this port on this machine (see
        ``TritonServer``); without one those two calls are refused.
    """

    def __init__(
        self,
        url: str,
        protocol: Protocol = "grpc",
        *,
        timeout_s: float = 60.0,
        max_rows_per_request: int | None = None,
        retries: int = 3,
        retry_backoff_s: float = 0.2,
        admin_key: str | None = None,
    ):
        self._conversation = conversation.Conversation(
            url,
            protocol,
            timeout_s=timeout_s,
            max_rows_per_request=max_rows_per_request,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            admin_key=admin_key,
        )
        self._connection = transport.Connection(self.url, protocol, self.timeout_s)

    def close(self) -> None:
        """Close the connection (tritonserver waits, when it stops, for open HTTP connections)."""
        self._connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- metadata ---------------------------------------------------------------------------

    def schemas(self, model: str) -> ModelSchemas:
        """The model's schemas: from the ensemble config's parameters when this library exported
        it, else derived from its config's tensors (``__values``/``__offsets`` pairs are ragged).
        Read once per model and client."""
        return self._run(self._conversation.schemas(model))

    def models(self) -> list[ModelStatus]:
        """The server's repository index: name, version and state of every model it knows."""
        return self._run(self._conversation.models())

    def health(self) -> list[ModelHealth]:
        """Each model the server knows, with whether its python-backend stubs answer.

        A server in another process cannot be looked into, so each READY python model gets a
        request of no rows: a running stub answers it (or refuses it), a dead one makes the
        server say the stub "is not healthy". Ensembles and libtorch models have no stubs. The
        outside services a model calls (a feature server) are asked from this process."""
        return self._run(self._conversation.health())

    def wait_until_ready(self, model: str | None = None, timeout_s: float = 60.0) -> None:
        """Return once the server is ready, or with ``model`` named once that model is (a server
        where another model failed to load stays not ready); ``ServerUnavailableError`` with the
        last reason after ``timeout_s``."""
        return self._run(self._conversation.wait_until_ready(model, timeout_s))

    # ---- inference --------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        *,
        columns: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> pd.DataFrame:
        """Send raw rows (a DataFrame, or a dict of columns: numpy arrays or lists, a list column
        holding a list or array per row) and get a DataFrame with one row per output row, columns
        in output-schema order.

        ``columns`` maps the data's column names to the model's input names
        (``{"user_session": "session_id"}``); answer columns named like a mapped input (the
        session id) come back under the data's name. ``progress(rows_sent, rows_in_all)`` is
        called after each request of a split input. ``request_id`` goes with every request as
        Triton's request id: an answer log (``LogAnswers``) records the answer under it."""
        return self._run(
            self._conversation.infer(model, data, columns, progress, "frame", request_id)
        )

    def infer_columns(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        *,
        columns: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        """``infer``, answering a dict of columns instead of a DataFrame, for callers without
        pandas at hand (a web service's JSON): a numpy array per column of one value per row, a
        2-D array (rows x length) per fixed-length list column, a list of arrays per ragged
        one."""
        return self._run(
            self._conversation.infer(model, data, columns, progress, "columns", request_id)
        )

    def infer_table(
        self,
        model: str,
        request: TensorTable,
        *,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> TensorTable:
        """Send a request table (columns of the input schema) and get the output table; a table
        bigger than the row limit goes in several requests of whole sessions. A missing or an
        extra column is an ``InputError`` naming it, before anything is sent."""
        return self._run(self._conversation.infer_table(model, request, progress, request_id))

    def _run(self, steps: Steps[T]) -> T:
        return conversation.run(steps, self._connection.call)
