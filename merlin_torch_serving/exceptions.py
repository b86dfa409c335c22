"""Every error this library raises, as one tree, so callers can catch at the level they care about.

    MerlinTorchServingError
    ├── SchemaError                 a graph edge whose columns, dtypes or shapes do not fit
    ├── InputError                  request data that does not match the ensemble's input schema
    │   └── MissingColumnsError     input columns the request does not have (all of them)
    ├── WorkflowNotFittedError      an NVTabular workflow handed over before it was fitted
    ├── AddressError                a server address that cannot be used as given
    ├── ModelPreparationError       a PyTorch model cannot run as asked (e.g. as TorchScript)
    ├── WorkflowError               an NVTabular workflow cannot be compiled or run on a request
    ├── ExportError                 a model repository could not be written
    │   ├── RepositoryExistsError   the target exists and overwriting was not asked for
    │   ├── ModelCheckError         model.pt does not behave the way its config.pbtxt says
    │   └── ModelNotImportableError an eager model cannot be loaded by the server's Python
    ├── ArtifactError               an exported step's files are not the ones its manifest lists
    ├── ServerError                 starting or talking to tritonserver failed
    │   ├── ServerNotFoundError     no tritonserver binary could be found
    │   ├── PortInUseError          a requested port is taken
    │   ├── ServerStartTimeoutError the server did not become ready in time
    │   ├── ServerExitedError       the server process ended on its own
    │   ├── ServerUnavailableError  the server cannot be reached, or is not ready
    │   │   └── WrongProtocolError  the port answers in the other protocol (HTTP vs gRPC)
    │   └── ModelLoadError          one or more models failed to load
    │       └── BackendNotAvailableError  a model needs a backend this server lacks
    ├── BackendBuildError           the pytorch backend could not be built
    ├── PackageError                an AOTInductor package cannot be compiled, or run on this CPU
    ├── BundleError                 a repository could not be made self-sufficient (bundle)
    ├── ScoringError                scoring a dataset could not start or finish
    ├── StoreError                  a store (sessions, rules, trending) failed or is unreachable
    ├── AnswerLogError              an answer log, or clicks to read it out with, cannot be read
    └── InferenceError              the server answered a request with an error
        ├── UnknownModelError       the server has no model of that name
        └── RequestTimeoutError     no answer came within the client's timeout

Each class builds its own message from structured fields, so messages stay consistent and the
fields stay available to code that handles the error. The first line of a message says what to
do; details (a server's log tail) follow on the next lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence


class MerlinTorchServingError(Exception):
    """Base class of every error raised by merlin_torch_serving."""

    def __reduce__(self):
        # rebuilt from its message and fields, not through __init__ (whose arguments differ from
        # class to class), so that an error raised in another process (a Dask worker) arrives as
        # itself
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[MerlinTorchServingError], args: tuple, fields: dict):
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


class SchemaError(MerlinTorchServingError):
    """A column at a graph edge is missing or has the wrong dtype or shape.

    Raised while the graph is built, naming the operator, the column, what it expects and what
    its parents provide.
    """

    def __init__(self, operator: str, column: str | None, expected: str, got: str, hint: str = ""):
        self.operator = operator
        self.column = column
        self.expected = expected
        self.got = got
        where = f"column {column!r} at the input of {operator}" if column else f"{operator}"
        message = f"{where}: expected {expected}, got {got}"
        if hint:
            message += f"; {hint}"
        super().__init__(message)


class InputError(MerlinTorchServingError):
    """Request data that does not fit the input schema, found before sending or by the model that
    refused it (``model`` names it then)."""

    # how the message reads, so that a refusal that crossed the wire can be read back (from_message)
    _MESSAGE = re.compile(
        r"input column '(?P<column>[^']*)': expected (?P<expected>.+?), got (?P<got>.+)", re.S
    )

    def __init__(
        self, column: str, expected: str, got: str, hint: str = "", *, model: str | None = None
    ):
        self.column = column
        self.expected = expected
        self.got = got
        self.hint = hint
        self.model = model
        message = f"input column {column!r}: expected {expected}, got {got}"
        if hint:
            message += f"; {hint}"
        if model:
            message = f"model {model!r} refused the request: {message}"
        super().__init__(message)

    @classmethod
    def from_message(cls, text: str, model: str | None = None) -> InputError | None:
        """The InputError whose message ``text`` ends with (as a served step words its refusal), or
        None; the model is the step the text names (``model 'x': input column ...``), else
        ``model``.
        """
        # the last one: a TorchScript error quotes the source of the check before its message
        match = next(reversed(list(cls._MESSAGE.finditer(text))), None)
        if match is None:
            return None
        got, _, hint = match.group("got").partition("; ")
        step = re.findall(r"model '([^']+)'", text[: match.start()])
        return cls(
            match.group("column"),
            match.group("expected"),
            got,
            hint,
            model=step[-1] if step else model,
        )


class MissingColumnsError(InputError):
    """The request lacks input columns; all of them are named, with what the request has instead."""

    def __init__(self, missing: Mapping[str, str], present: Sequence[str]):
        self.missing = dict(missing)  # column -> what it should hold
        self.present = list(present)
        first = next(iter(self.missing))
        self.column, self.expected, self.got, self.model = (
            first,
            self.missing[first],
            "no such column",
            None,
        )
        wanted = ", ".join(f"{name!r} ({described})" for name, described in self.missing.items())
        self.hint = f"the request has {', '.join(map(repr, self.present)) or 'no columns'}"
        MerlinTorchServingError.__init__(
            self,
            "name the request's columns as the model's inputs, or map yours to them: "
            f"columns={{'<your column>': {first!r}, ...}} (--columns YOURS={first},...)\n"
            f"missing input columns: {wanted}; {self.hint}",
        )


class WorkflowNotFittedError(MerlinTorchServingError):
    """An NVTabular workflow whose statistics (vocabularies, ranges) were never computed: it has
    no output schema, or some of its operators are not fitted."""

    def __init__(self, operators: Sequence[str]):
        self.operators = list(operators)
        listed = ", ".join(self.operators)
        unfitted = f" (operators without statistics: {listed})" if self.operators else ""
        super().__init__(
            "fit the NVTabular workflow first: workflow.fit(dataset), or load a fitted one with "
            f"nvtabular.Workflow.load(path); this one is not fitted{unfitted}"
        )


class AddressError(MerlinTorchServingError, ValueError):
    """A server address that cannot be used as given, e.g. with a scheme tritonclient refuses."""

    def __init__(self, url: str, fix: str, problem: str):
        self.url = url
        super().__init__(f"{fix}: {problem} (got {url!r})")


class ModelPreparationError(MerlinTorchServingError):
    """A PyTorch model cannot be prepared the way it was asked: it does not become TorchScript that
    answers like the eager module (libtorch needs TorchScript), or its file cannot be read."""

    def __init__(self, model: str, problem: str, hint: str = ""):
        self.model = model
        self.problem = problem
        super().__init__(f"model {model!r}: {problem}" + (f"; {hint}" if hint else ""))


class WorkflowError(MerlinTorchServingError, ValueError):
    """An NVTabular workflow cannot be compiled for serving, or cannot transform a request the way
    its schemas say (an output column of the wrong kind, nulls where its dtype has none, ...).

    Also a ``ValueError``, which is what callers caught before the fast path had errors of its own.
    """


class ExportError(MerlinTorchServingError):
    """A model repository could not be written; the previous repository is left as it was."""


class RepositoryExistsError(ExportError):
    """The export's target already holds models of that name; the message says how to replace
    them (``overwrite=True``) or add a version beside them (``add_version=True``)."""

    def __init__(self, path: str, models: Sequence[str]):
        self.path = path
        self.models = list(models)
        super().__init__(
            f"{path!r} already holds model(s) {', '.join(map(repr, self.models))}; pass"
            " overwrite=True to replace them or add_version=True to add a new version beside them"
        )


class ModelCheckError(ExportError):
    """A libtorch step breaks the contract of Triton's pytorch backend, or model.pt, called the way
    libtorch will call it, disagrees with its config."""

    def __init__(self, model: str, tensor: str | None, expected: str, got: str, hint: str = ""):
        self.model = model
        self.tensor = tensor  # e.g. "output 'scores'", None for the model as a whole
        self.expected = expected
        self.got = got
        message = (
            f"model {model!r} failed the libtorch check: {tensor or 'the model'} expected"
            f" {expected}, got {got}"
        )
        if hint:
            message += f"; {hint}"
        super().__init__(message)


class ArtifactError(MerlinTorchServingError):
    """An exported step refuses to load: a file differs from the sha256 its manifest records, is
    missing, or the step was written in a format this library version does not read."""

    def __init__(self, step: str, problem: str, hint: str, kind: str = "step"):
        self.step = step
        self.problem = problem
        super().__init__(f"{kind} {step!r} cannot be loaded: {problem}; {hint}")


class ModelNotImportableError(ExportError):
    """An eager model runs on the python backend by unpickling it there; the server's Python
    cannot load it, even with the classes it cannot import saved by value."""

    def __init__(self, class_path: str, reason: str):
        self.class_path = class_path
        self.reason = reason
        super().__init__(
            f"the model class {class_path!r} cannot be loaded by the server's Python ({reason}),"
            " so the python backend could not run the eager model. Classes of __main__ and of"
            " modules the server cannot import are saved by value, so what failed is something"
            " the model or its module holds or needs: make it picklable (no lock, open file or"
            " connection), install the module where the server runs, or make the model scriptable"
            " with torch.jit.script"
        )


class ServerError(MerlinTorchServingError):
    """Starting, supervising or querying a tritonserver process failed."""

    def __init__(self, message: str, log_tail: str = ""):
        self.log_tail = log_tail
        self.summary = message  # the message without the log tail
        if log_tail:
            message = f"{message}\n--- tritonserver log (last lines) ---\n{log_tail}"
        super().__init__(message)


class ServerNotFoundError(ServerError):
    """No tritonserver binary was found; the message lists where it looked and how to install or
    name one."""

    def __init__(self, searched: Sequence[str]):
        self.searched = list(searched)
        super().__init__(
            "no tritonserver binary found; looked in: "
            + "; ".join(self.searched)
            + ". Install the bundled server with `pip install 'merlin-torch-serving[server]'`"
            " (nvidia-pytriton), pass TritonServer(binary=...), or set MTS_TRITONSERVER to the"
            " binary's path"
        )


class PortInUseError(ServerError):
    """A port the server was asked to listen on is taken (another tritonserver, most often)."""

    def __init__(self, port: int, protocol: str, log_tail: str = "", hint: str = ""):
        self.port = port
        self.protocol = protocol
        hint = (
            hint
            or f"pass another {protocol} port, or 0 (or None) to let the operating system choose"
            " a free one"
        )
        super().__init__(f"{hint}: the {protocol} port {port} is already in use", log_tail)


class ServerStartTimeoutError(ServerError):
    """tritonserver did not become ready within ``start_timeout_s``; the message says what it was
    still waiting for."""

    def __init__(self, timeout_s: float, waiting_for: str, log_tail: str = ""):
        self.timeout_s = timeout_s
        super().__init__(
            f"tritonserver was not ready after {timeout_s:g} s (still waiting for {waiting_for}); "
            "raise start_timeout_s if the models are slow to load",
            log_tail,
        )


class ServerExitedError(ServerError):
    """tritonserver exited by itself (at start or while serving); ``log_tail`` holds the last lines
    of its log."""

    def __init__(self, returncode: int | None, log_tail: str = ""):
        self.returncode = returncode
        super().__init__(f"tritonserver exited with code {returncode}", log_tail)


class ServerUnavailableError(ServerError):
    """The server could not be reached (connection refused or reset, gRPC UNAVAILABLE) or was not
    ready. The request did not run, or running it again changes nothing (inference has no side
    effect), so retrying it is safe."""

    def __init__(self, url: str, detail: str, hint: str = ""):
        self.url = url
        self.detail = detail
        self.hint = hint
        message = f"tritonserver at {url} is not available: {detail}"
        super().__init__(f"{hint}\n{message}" if hint else message)


class WrongProtocolError(ServerUnavailableError):
    """The address answers, but in the other protocol.

    An HTTP client is on the gRPC port, or the reverse.
    """

    def __init__(self, url: str, protocol: str, detail: str):
        self.protocol = protocol
        other = "http" if protocol == "grpc" else "grpc"
        super().__init__(
            url,
            detail,
            f"{url} does not answer {protocol}: it looks like tritonserver's {other} port; pass"
            f" protocol={other!r} (--protocol {other}) or the server's {protocol} port",
        )


class ModelLoadError(ServerError):
    """One or more models failed to load; ``failures`` maps each model to its reason."""

    def __init__(self, failures: Mapping[str, str], log_tail: str = "", summary: str = ""):
        self.failures = dict(failures)
        lines = [f"  {name!r}: {reason}" for name, reason in self.failures.items()]
        summary = summary or f"{len(self.failures)} model(s) failed to load"
        super().__init__(f"{summary}:\n" + "\n".join(lines), log_tail)


class BackendNotAvailableError(ModelLoadError):
    """A model needs a backend (e.g. ``pytorch``) that this tritonserver does not have."""

    def __init__(
        self,
        failures: Mapping[str, str],
        missing: Mapping[str, str],
        available: Sequence[str],
        log_tail: str = "",
    ):
        self.missing = dict(missing)  # model -> backend it needs
        self.available = list(available)
        needs = ", ".join(f"model {m!r} needs backend {b!r}" for m, b in self.missing.items())
        summary = (
            f"{needs}, which this tritonserver does not have (it has:"
            f" {', '.join(self.available) or 'none'})."
        )
        if "pytorch" in self.missing.values():
            summary += (
                " The tritonserver bundled with nvidia-pytriton gets it once it is built for this"
                " torch: run `merlin-torch-serving build-backend pytorch --sources PATH` (PATH:"
                " Triton's pytorch_backend release sources, builds offline) or"
                " `merlin-torch-serving build-backend pytorch` (clones them; needs the network),"
                " then start the server again."
            )
        summary += (
            " Otherwise export with PredictPytorch(..., backend='python'), or run a tritonserver"
            " that has the backend (for example the NGC image"
            " nvcr.io/nvidia/tritonserver:<release>-py3, or TritonServer(backend_directory=...)"
            " pointing at a folder that holds it). Models that failed"
        )
        super().__init__(failures, log_tail, summary=summary)


class BackendBuildError(MerlinTorchServingError):
    """Building Triton's pytorch backend failed: a missing tool, bad sources, or the compiler."""


class PackageError(MerlinTorchServingError):
    """A model could not be compiled ahead of time, or its package cannot run here."""


class BundleError(MerlinTorchServingError):
    """A repository could not be bundled with its Python environment (the message says what is
    missing and how to get it)."""


class ScoringError(MerlinTorchServingError):
    """Scoring a dataset could not start or finish: its input, its output folder or a partition
    that failed."""


class StoreError(MerlinTorchServingError):
    """A store (sessions, rules, trending counts) failed a call; ``where`` names it. Operators
    answer without their store instead; the API and the command line raise this."""

    def __init__(self, where: str, problem: str, hint: str = ""):
        self.where, self.problem = where, problem
        super().__init__(f"the store at {where} failed: {problem}" + (f"; {hint}" if hint else ""))


class AnswerLogError(MerlinTorchServingError):
    """An answer log, or the clicks its read-out joins, cannot be read as asked (then how to)."""


class InferenceError(MerlinTorchServingError):
    """The server answered with an error; ``model`` names the step that failed when known."""

    def __init__(self, model: str, message: str):
        self.model = model
        super().__init__(f"inference on {model!r} failed: {message}")


class UnknownModelError(InferenceError):
    """The server has no model of that name; ``available`` lists the ones it has."""

    def __init__(self, model: str, available: Sequence[str]):
        self.available = list(available)
        names = ", ".join(map(repr, self.available)) or "none"
        Exception.__init__(
            self, f"use one of the models this server has: {names}; it has no model {model!r}"
        )
        self.model = model


class RequestTimeoutError(InferenceError):
    """No answer within the client's timeout; the server may still be computing it."""

    def __init__(self, model: str, timeout_s: float, detail: str = ""):
        self.timeout_s = timeout_s
        super().__init__(
            model,
            f"no answer within timeout_s={timeout_s:g} s{f' ({detail})' if detail else ''}; send"
            " fewer rows per request (Client(max_rows_per_request=...)) or pass a larger"
            " timeout_s",
        )
