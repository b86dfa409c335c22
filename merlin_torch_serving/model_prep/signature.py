"""How a model's ``forward`` takes its inputs, and the adapter that calls it with one dict.

Models come in two forms: ``forward(self, inputs: Dict[str, Tensor])`` (Transformers4Rec, most
Merlin models) and ``forward(self, a, b, ...)`` with one tensor per argument (the usual form on
Triton's pytorch backend). Positional arguments are bound to input columns by name, or, as Triton
does when names differ, by the ``<name>__<index>`` convention of the column names. ``DictCall``
then gives every model the one calling convention the rest of the library uses: a
``Dict[str, Tensor]`` in, a tensor or a tuple of tensors (in output-schema order) out.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from merlin.schema import Schema

from merlin_torch_serving.exceptions import SchemaError

ArgumentKind = Literal["tensor", "dict", "other", "unknown"]
_TRITON_INDEXED = re.compile(r"^.+__(\d+)$")


@dataclass(frozen=True)
class Argument:
    """One argument of ``forward``: its name, whether it has no default, what it takes."""

    name: str
    required: bool
    kind: ArgumentKind


@dataclass(frozen=True)
class ForwardSignature:
    """The arguments of a model's ``forward`` (``self`` left out) and the kind of its result."""

    arguments: tuple[Argument, ...]
    #: "tensor", "tuple", "one-tuple", "dict", "list" or "unknown" (eager models)
    returns: str = "unknown"

    def describe(self) -> str:
        return (
            "forward("
            + ", ".join(a.name if a.required else f"{a.name}=..." for a in self.arguments)
            + ")"
        )


def read_signature(model: torch.nn.Module) -> ForwardSignature:
    """The signature of a TorchScript module (from its compiled schema) or an eager one."""
    if isinstance(model, torch.jit.ScriptModule):
        schema = model.forward.schema  # type: ignore[attr-defined]  # a ScriptMethod, typed as a callable
        arguments = tuple(
            Argument(a.name, not a.has_default_value(), _script_kind(a.type))
            for a in schema.arguments[1:]
        )
        returns = _script_return(schema.returns[0].type) if len(schema.returns) == 1 else "tuple"
        return ForwardSignature(arguments, returns)
    forward = model.forward
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # unresolvable string annotations: fall back to "unknown" kinds
        hints = {}
    eager_arguments = []
    for parameter in inspect.signature(forward).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is parameter.empty
        eager_arguments.append(
            Argument(parameter.name, required, _annotation_kind(hints.get(parameter.name)))
        )
    return ForwardSignature(tuple(eager_arguments))


def bind_arguments(
    signature: ForwardSignature, schema: Schema, model_name: str
) -> dict[str, str] | None:
    """Which input column feeds each positional argument (argument -> column), or ``None`` when
    ``forward`` takes the whole ``Dict[str, Tensor]``.

    Raises ``SchemaError`` naming the argument or column that cannot be bound.
    """
    columns = schema.column_names
    required = [a for a in signature.arguments if a.required]
    if len(required) == 1 and _takes_dict(required[0], columns):
        return None
    indexed = _triton_indices(columns)
    bound: dict[str, str] = {}
    for position, argument in enumerate(signature.arguments):
        column = argument.name if argument.name in columns else (indexed or {}).get(position)
        if column is None:
            if argument.required:
                convention = (
                    f" (or, Triton-style, one named '<name>__{position}')"
                    if indexed is not None
                    else ""
                )
                raise SchemaError(
                    model_name,
                    argument.name,
                    f"an input column named like the argument {argument.name!r} of "
                    f"{signature.describe()}{convention}",
                    f"input columns {', '.join(map(repr, columns)) or '(none)'}",
                    "rename the columns (or the arguments) so they match",
                )
            continue
        if argument.kind in ("dict", "other"):
            raise SchemaError(
                model_name,
                column,
                f"a tensor argument to feed: {argument.name!r} of {signature.describe()}",
                f"an argument that takes {'a dict' if argument.kind == 'dict' else 'another type'}",
            )
        bound[argument.name] = column
    unused = [c for c in columns if c not in bound.values()]
    if unused:
        raise SchemaError(
            model_name,
            unused[0],
            f"an argument of {signature.describe()} named like the column",
            "no such argument",
            "leave the column out of the model's input schema, or add the argument to forward",
        )
    return bound


def needs_adapter(signature: ForwardSignature, arguments: dict[str, str] | None) -> bool:
    """Whether the model must be wrapped in ``DictCall``.

    The wrapped model takes one dict and returns a tensor or a tuple of several.
    """
    return arguments is not None or signature.returns not in ("tensor", "tuple")


class DictCall(torch.nn.Module):
    """Calls ``model`` with one ``Dict[str, Tensor]``, whatever its ``forward`` takes, and returns
    a tensor or a tuple of tensors.

    ``arguments`` maps forward's argument names to input names (``None``: pass the dict as is);
    a dict result is turned into a tuple in ``output_names`` order, a list into a tuple, and a
    single result into its tensor.
    """

    def __init__(
        self, model: torch.nn.Module, arguments: dict[str, str] | None, output_names: list[str]
    ):
        super().__init__()
        self.model = model
        self.arguments = None if arguments is None else dict(arguments)
        self.output_names = list(output_names)

    def forward(self, inputs: dict[str, torch.Tensor]):
        outputs = call_with_dict(self.model, self.arguments, inputs)
        if isinstance(outputs, Mapping):
            missing = [name for name in self.output_names if name not in outputs]
            if missing:
                raise KeyError(
                    f"the model returned a dict without the output {missing[0]!r} "
                    f"(it has {', '.join(map(repr, outputs))}); name the outputs in output_schema"
                )
            return tuple(outputs[name] for name in self.output_names)
        if isinstance(outputs, (list, tuple)):
            # one result is one tensor (what a fused TopK ranks); libtorch never gets a list
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return outputs


def call_with_dict(
    model: torch.nn.Module, arguments: dict[str, str] | None, inputs: Mapping[str, torch.Tensor]
):
    """``model``'s raw result for one dict of inputs, bound as ``bind_arguments`` said."""
    if arguments is None:
        # a copy: some models (Transformers4Rec's) replace entries of the dict they are given
        return model(dict(inputs))
    return model(**{argument: inputs[column] for argument, column in arguments.items()})


def _takes_dict(argument: Argument, columns: list[str]) -> bool:
    if argument.kind in ("dict", "other"):
        return argument.kind == "dict"
    if argument.kind == "tensor":
        return False
    # unannotated: a dict unless the name (or Triton's index convention) says it is one column
    return argument.name not in columns and not (
        len(columns) == 1 and _triton_indices(columns) == {0: columns[0]}
    )


def _triton_indices(columns: list[str]) -> dict[int, str] | None:
    """``{index: column}`` when every column is named ``<name>__<index>`` with distinct indices."""
    indices = {}
    for column in columns:
        match = _TRITON_INDEXED.match(column)
        if match is None or int(match.group(1)) in indices:
            return None
        indices[int(match.group(1))] = column
    return indices or None


def _script_kind(script_type) -> ArgumentKind:
    if isinstance(script_type, torch.OptionalType):
        script_type = script_type.getElementType()
    if isinstance(script_type, torch.TensorType):
        return "tensor"
    if isinstance(script_type, torch.DictType) and isinstance(
        script_type.getValueType(), torch.TensorType
    ):
        return "dict"
    return "other"


def _script_return(script_type) -> str:
    if isinstance(script_type, torch.TupleType) and len(script_type.elements()) == 1:
        return "one-tuple"
    for kind, cls in (
        ("tensor", torch.TensorType),
        ("tuple", torch.TupleType),
        ("dict", torch.DictType),
        ("list", torch.ListType),
    ):
        if isinstance(script_type, cls):
            return kind
    return "unknown"


def _annotation_kind(annotation) -> ArgumentKind:
    if annotation is None or annotation is inspect.Parameter.empty or annotation is typing.Any:
        return "unknown"
    if annotation is torch.Tensor:
        return "tensor"
    origin = typing.get_origin(annotation) or annotation
    if origin in (typing.Union, types.UnionType):  # Optional[Tensor], Tensor | None
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _annotation_kind(members[0]) if len(members) == 1 else "other"
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return "dict"
    return "other"
