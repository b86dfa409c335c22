"""Reading tritonserver's log and answers: pure functions over their text, no process, no I/O.

The server says what went wrong in lines meant for people; these functions find the lines that
matter (why a model failed to load, which port was taken, which models are still loading) so the
launcher's errors can quote them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

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
# how an ensemble's load error quotes the error of a step it depends on
_DEPENDENCY_FAILURE = re.compile(r"Model '([^']+)' loading failed with error: (.+?)(?=;\s*Model '|;?\s*$)")
_TRITON_LOG_LINE = re.compile(r'^[IWE]\d{4} \S+ +\d+ \S+\] "?(.*?)"?$')
_PROTOBUF_ERROR_LINE = re.compile(r"^\[libprotobuf ERROR [^\]]*\] (.*)$")
_LOADING = re.compile(r'"loading: (.+?):\d+"')
_LOAD_ENDED = re.compile(r"(successfully loaded|failed to load) '([^']+)'")


def log_tail(log: str, lines: int = TAIL_LINES) -> str:
    """The last lines of the log worth reading (GPU noise and tritonserver's usage text left out)."""
    kept = [line for line in log.splitlines() if line.strip() and not any(noise in line for noise in _CPU_MACHINE_NOISE)]
    # A rejected argument is followed by a few hundred lines of usage that would push the
    # one line that matters out of the tail.
    usage = next((index for index, line in enumerate(kept) if line.startswith("Usage: tritonserver")), None)
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
    return "; ".join(dict.fromkeys(messages)) or "not loaded; tritonserver logged no reason (see the log below)"


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


def error_text(body: str) -> str:
    """The ``error`` of a JSON answer, else the answer itself."""
    try:
        return str(json.loads(body)["error"]).strip().rstrip(";").strip()
    except (ValueError, KeyError, TypeError):
        return body.strip() or "(empty answer)"
