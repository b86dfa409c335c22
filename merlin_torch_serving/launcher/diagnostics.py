"""Reading tritonserver's log and answers: pure functions over their text, no process, no I/O.

The server says what went wrong in lines meant for people; these functions find the lines that
matter (why a model failed to load, which port was taken, which models are still loading) and
build the launcher's errors from them, so every error a server's log explains is worded here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from merlin_torch_serving.exceptions import (
    BackendNotAvailableError,
    ModelLoadError,
    PortInUseError,
    ServerError,
    ServerExitedError,
)

TAIL_LINES = 40

# Printed by every start on a machine without a GPU; the server runs fine, so errors leave them out.
_CPU_MACHINE_NOISE = (
    "NVML",
    "DCGM",
    "CudaDriverHelper",
    "CUDA driver version is insufficient",
    "CUDA memory pool",
)
_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*?Socket '[^']*:(\d+)' already in use")
_PROTOCOL_NAMES = {"HTTP": "HTTP", "GRPC": "gRPC", "METRICS": "metrics"}
_MISSING_BACKEND = re.compile(r"unable to find backend library for backend '([^']+)'")
# how an ensemble's load error quotes the error of a step it depends on (a python step's error
# ends with its traceback, over several lines)
_DEPENDENCY_FAILURE = re.compile(
    r"Model '([^']+)' loading failed with error: (.+?)(?=;\s*Model '|;?\s*$)", re.DOTALL
)
_TRITON_LOG_LINE = re.compile(r'^[IWE]\d{4} \S+ +\d+ \S+\] "?(.*?)"?$')
_PROTOBUF_ERROR_LINE = re.compile(r"^\[libprotobuf ERROR [^\]]*\] (.*)$")
_LOADING = re.compile(r'"loading: (.+?):\d+"')
#: what a stopping tritonserver logs once no request is in flight, before it unloads its models
_REQUESTS_DRAINED = "All models are stopped, unloading models"
_LOAD_ENDED = re.compile(r"(successfully loaded|failed to load) '([^']+)'")
_UNLOADED = re.compile(r"successfully unloaded '([^']+)'")


def log_tail(log: str, lines: int = TAIL_LINES) -> str:
    """The last lines of the log worth reading.

    GPU noise and tritonserver's usage text are left out.
    """
    kept = [
        line
        for line in log.splitlines()
        if line.strip() and not any(noise in line for noise in _CPU_MACHINE_NOISE)
    ]
    # A rejected argument is followed by a few hundred lines of usage that would push the
    # one line that matters out of the tail.
    usage = next(
        (index for index, line in enumerate(kept) if line.startswith("Usage: tritonserver")), None
    )
    if usage is not None:
        kept = kept[:usage] + ["(usage text left out; run `tritonserver --help`)"]
    return "\n".join(kept[-lines:])


def model_errors(log: str, name: str) -> str:
    """The server's error lines about model ``name``, for failures its API words vaguely."""
    lines = log.splitlines()
    quoted = f"'{name}'"
    messages = []
    for index, line in enumerate(lines):
        if quoted not in line or not re.match(r"E\d{4} ", line):
            continue
        # An unreadable config.pbtxt is explained by protobuf on the line before.
        if index > 0 and (protobuf := _PROTOBUF_ERROR_LINE.match(lines[index - 1])):
            messages.append(protobuf.group(1))
        match = _TRITON_LOG_LINE.match(line)
        messages.append(match.group(1) if match else line)
    return (
        "; ".join(dict.fromkeys(messages))
        or "not loaded; tritonserver logged no reason (see the log below)"
    )


def port_in_use(log: str) -> tuple[int, str] | None:
    """``(port, protocol)`` when the server could not bind a port because it was taken."""
    match = _PORT_IN_USE.search(log)
    if match is None:
        return None
    return int(match.group(2)), _PROTOCOL_NAMES.get(match.group(1).upper(), match.group(1))


def still_loading(log: str) -> list[str]:
    """Models whose load started and has neither succeeded nor failed."""
    finished = {name for _, name in _LOAD_ENDED.findall(log)}
    return [name for name in dict.fromkeys(_LOADING.findall(log)) if name not in finished]


def requests_drained(log: str) -> bool:
    """Whether a stopping server has answered every request it had (it unloads its models next)."""
    return _REQUESTS_DRAINED in log


def unloaded(log: str) -> set[str]:
    """The models the log says were unloaded (a version of each, at least)."""
    return set(_UNLOADED.findall(log))


def load_outcome(log: str, name: str) -> bool | None:
    """True once the log says model ``name`` loaded, False if it failed to, None before either."""
    outcomes = [verb for verb, model in _LOAD_ENDED.findall(log) if model == name]
    if not outcomes:
        return None
    return outcomes[-1] == "successfully loaded"


def with_dependency_failures(failures: Mapping[str, str]) -> dict[str, str]:
    """The failures plus, for ensembles, each failed dependency under its own name."""
    expanded = dict(failures)
    for reason in failures.values():
        for name, dependency_reason in _DEPENDENCY_FAILURE.findall(reason):
            expanded.setdefault(name, dependency_reason)
    return expanded


def missing_backends(failures: Mapping[str, str]) -> dict[str, str]:
    """``model -> backend`` for models that failed because the server lacks their backend."""
    missing = {}
    for name, reason in failures.items():
        match = _MISSING_BACKEND.search(reason)
        # an ensemble fails because a step failed; the step is the one missing the backend
        if match and not _DEPENDENCY_FAILURE.search(reason):
            missing[name] = match.group(1)
    return missing


def load_refusal(answer: str, log: str, name: str) -> str:
    """Why loading ``name`` failed: the server's answer, with its log's reasons when the answer
    only says that the model's folder could not be read (``log``: what it wrote since the load)."""
    if "failed to poll" in answer:
        return f"{answer}: {model_errors(log, name)}"
    return answer


def exit_error(returncode: int, log: str) -> ServerError:
    """The error for a server that exited: a port it could not bind, else its exit code."""
    in_use = port_in_use(log)
    if in_use:
        return PortInUseError(*in_use, log_tail(log))
    return ServerExitedError(returncode, log_tail(log))


def load_error(
    failures: Mapping[str, str], available_backends: Sequence[str], log: str
) -> ModelLoadError:
    """The error for models that failed to load (``model -> reason``): ``BackendNotAvailableError``
    when the server lacks a backend one of them needs, naming those it has."""
    failures = with_dependency_failures(failures)
    missing = missing_backends(failures)
    if missing:
        return BackendNotAvailableError(failures, missing, available_backends, log_tail(log))
    return ModelLoadError(failures, log_tail(log))


def start_awaits(log: str, silent_ports: Sequence[int], live_url: str) -> str:
    """What a start that timed out was still waiting for: models that were loading (the endpoints
    open only after them), else ports the server did not listen on, else its liveness answer."""
    loading = still_loading(log)
    if loading:
        return f"model(s) {names(loading)} to finish loading; the endpoints open only after that"
    if silent_ports:
        return f"tritonserver to listen on port(s) {', '.join(map(str, silent_ports))}"
    return f"GET /v2/health/live on {live_url} to answer 200"


def names(models: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in models)
