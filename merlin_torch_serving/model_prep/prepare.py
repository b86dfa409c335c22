"""Script, else trace, else run eagerly: how an eager model becomes what ``PredictPytorch`` runs.

TorchScript runs on both Triton backends, so an eager model is compiled when that gives the same
answers: ``torch.jit.script`` first (it keeps control flow), then ``torch.jit.trace``. Either is
kept only if it equals the eager model, exactly, on every probe input (``probes``); a trace that
branched on its example, looped over its batch or baked a shape in differs on some probe and is
refused. What is left runs as the eager module on the python backend. One log line says which
path was taken and why, with any warning torch gave while tracing.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from merlin.schema import Schema

from merlin_torch_serving.exceptions import ModelPreparationError, SchemaError
from merlin_torch_serving.model_prep.probes import Probe, probe_inputs
from merlin_torch_serving.model_prep.signature import (
    DictCall,
    bind_arguments,
    needs_adapter,
    read_signature,
)

logger = logging.getLogger("merlin_torch_serving")
Execution = Literal["auto", "torchscript", "eager"]


@dataclass(frozen=True)
class PreparedModel:
    """A module that takes the model's dense inputs as one ``Dict[str, Tensor]`` and returns a
    tensor or a tuple of tensors in output-schema order."""

    module: torch.nn.Module
    #: "torchscript" (scripted, traced or given as TorchScript) or "eager"
    execution: str
    #: how it was made and why, as logged
    reason: str


def prepare_model(
    model: torch.nn.Module,
    input_schema: Schema,
    output_names: list[str],
    *,
    label: str,
    execution: Execution = "auto",
    require_torchscript: bool = False,
    pad_value: float = 0.0,
    pad_left: bool = False,
    sample: dict[str, torch.Tensor] | None = None,
) -> PreparedModel:
    """The module to run for ``model``; see the module docstring for the order things are tried.

    ``require_torchscript`` (libtorch was asked for) turns "run eagerly" into a
    ``ModelPreparationError`` that says why neither scripting nor tracing could be used.
    """
    name = type(model).__name__
    signature = read_signature(model)
    arguments = bind_arguments(signature, input_schema, label)
    probes = probe_inputs(input_schema, pad_value=pad_value, pad_left=pad_left, sample=sample)
    if isinstance(model, torch.jit.ScriptModule):
        if needs_adapter(signature, arguments):
            model = _traced_adapter(model, arguments, output_names, probes[0], label)
        return PreparedModel(model, "torchscript", "given as TorchScript")
    reference = DictCall(model, arguments, output_names)
    if execution == "eager":
        return _log(PreparedModel(reference, "eager", "as asked: execution='eager'"), label, name)
    expected = _reference_outputs(reference, probes, label)

    failures = []
    try:
        scripted = _quietly(torch.jit.script, model)
        if needs_adapter(signature, arguments):
            scripted = _trace(DictCall(scripted, arguments, output_names), probes[0])[0]
    except Exception as exc:
        failures.append(f"torch.jit.script failed: {_first_line(exc)}")
    else:
        difference = _first_difference(scripted, expected, output_names)
        if difference is None:
            return _log(
                PreparedModel(scripted, "torchscript", f"scripted; {_equal(expected)}"), label, name
            )
        failures.append(f"the scripted module {difference}")

    try:
        traced, tracer_warnings = _trace(reference, probes[0])
    except Exception as exc:
        failures.append(f"torch.jit.trace failed: {_first_line(exc)}")
    else:
        difference = _first_difference(traced, expected, output_names)
        warned = (
            f"; torch warned while tracing: {_summary(tracer_warnings)}" if tracer_warnings else ""
        )
        if difference is None:
            reason = "; ".join([*failures, f"traced; {_equal(expected)}"]) + warned
            return _log(
                PreparedModel(traced, "torchscript", reason),
                label,
                name,
                warn=bool(tracer_warnings),
            )
        failures.append(f"the trace {difference}{warned}")

    if execution == "torchscript" or require_torchscript:
        raise ModelPreparationError(
            name,
            "cannot become TorchScript that answers like the eager module, which libtorch needs: "
            + "; ".join(failures),
            "run it eagerly on the python backend (backend='python' with execution='auto' or"
            " 'eager'), or make it scriptable with torch.jit.script",
        )
    return _log(PreparedModel(reference, "eager", "; ".join(failures)), label, name, warn=True)


def _reference_outputs(
    reference: torch.nn.Module, probes: list[Probe], label: str
) -> list[tuple[Probe, tuple]]:
    """The eager model's outputs on every probe it accepts (a probe outside what the model takes,
    such as negative ids into an embedding, says nothing about a trace and is left out)."""
    expected, errors = [], []
    for probe in probes:
        try:
            with torch.no_grad():
                expected.append((probe, _as_tuple(reference(probe.inputs))))
        except Exception as exc:
            errors.append(f"{probe.name}: {_error_text(exc)}")
    if not expected or expected[0][0] is not probes[0]:
        raise SchemaError(
            label,
            None,
            "a model that runs on inputs built from its input schema",
            f"a model that fails on them ({errors[0]})",
            "check the input schema's dtypes, list lengths and domains",
        )
    return expected


def _trace(module: torch.nn.Module, example: Probe):
    """``torch.jit.trace`` of ``module`` on the example probe, with the TracerWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            traced = torch.jit.trace(module, (example.inputs,), strict=True, check_trace=False)
    return traced, [
        str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)
    ]


def _traced_adapter(
    script: torch.jit.ScriptModule, arguments, output_names: list[str], example: Probe, label: str
):
    """TorchScript taking one dict around a TorchScript that takes positional tensors or returns a
    dict. Tracing keeps the inner module's calls whole (control flow included): only the adapter's
    fixed lookups are recorded."""
    try:
        return _trace(DictCall(script, arguments, output_names), example)[0]
    except Exception as exc:
        raise SchemaError(
            label,
            None,
            "a model that runs on inputs built from its input schema",
            _error_text(exc),
            "check the input schema's dtypes, list lengths and domains",
        ) from exc


def _first_difference(
    candidate: torch.nn.Module, expected: list[tuple[Probe, tuple]], output_names: list[str]
) -> str | None:
    """How ``candidate`` differs from the eager outputs on the first probe where it does."""
    for probe, want in expected:
        try:
            with torch.no_grad():
                got = _as_tuple(candidate(probe.inputs))
        except Exception as exc:
            return f"fails on probe '{probe.name}' ({_error_text(exc)})"
        if len(got) != len(want):
            return f"returns {len(got)} outputs instead of {len(want)} on probe '{probe.name}'"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            output = output_names[i] if i < len(output_names) else str(i)
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape:
                what = (
                    f"{g.dtype} {list(g.shape)}"
                    if isinstance(g, torch.Tensor)
                    else type(g).__name__
                )
                return (
                    f"returns {what} for output {output!r} instead of {w.dtype} {list(w.shape)} on"
                    f" probe '{probe.name}'"
                )
            if not _same_values(w, g):
                return (
                    f"differs from the eager module on probe '{probe.name}' (output {output!r}:"
                    f" {_difference(w, g)})"
                )
    return None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def _difference(a: torch.Tensor, b: torch.Tensor) -> str:
    same = (a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b
    position = tuple(int(i) for i in torch.nonzero(~same)[0])
    return (
        f"{int((~same).sum())} value(s) differ; at {list(position)} the eager module gives "
        f"{a[position].item()!r}, the compiled one {b[position].item()!r}"
    )


def _as_tuple(outputs) -> tuple:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _quietly(function, *args):
    """Call a torch.jit function without its deprecation notices.

    This library chose that function knowingly.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return function(*args)


def _equal(expected: list) -> str:
    return f"equal to the eager module on {len(expected)} probe inputs"


def _summary(messages: list[str]) -> str:
    distinct = list(dict.fromkeys(_first_line(m) for m in messages))
    more = f" (and {len(distinct) - 1} other warning(s))" if len(distinct) > 1 else ""
    return f"{distinct[0]}{more}"


def _first_line(error) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # the TorchScript interpreter puts its traceback first and the error itself last
    interpreter_error = bool(lines) and lines[0].startswith(
        "The following operation failed in the TorchScript"
    )
    text = (
        (lines[-1] if interpreter_error else lines[0]) if lines else type(error).__name__
    ).rstrip(":")
    return text if len(text) <= 200 else text[:197] + "..."


def _error_text(error: Exception) -> str:
    """``Type: message`` (the first line of it), once even when the message repeats the type."""
    line = _first_line(error)
    prefix = f"{type(error).__name__}: "
    return line if line.startswith(prefix) else prefix + line


def _log(prepared: PreparedModel, label: str, name: str, warn: bool = False) -> PreparedModel:
    how = (
        "runs as TorchScript"
        if prepared.execution == "torchscript"
        else "runs eagerly on the python backend"
    )
    logger.log(
        logging.WARNING if warn else logging.INFO,
        "%s: model %s %s (%s)",
        label,
        name,
        how,
        prepared.reason,
    )
    return prepared
