"""The TorchScript module that both Triton backends and in-process runs call: wire tensors in,
ragged lists padded to the model's sequence length, the model's outputs out.

Because the padding lives inside the scripted module, libtorch receives the wire tensors
(``c__values`` / ``c__offsets``) directly, and the python backend runs the very same graph.
The same modules, eager, are what ``torch.export`` compiles into a package; while it traces them
their checks are assertions and their gathers total (``aot.exportable``). That code sits under
``if not torch.jit.is_scripting():`` alone (TorchScript leaves such a block out only when the
call is the whole condition), then ``if torch.compiler.is_exporting():``.
"""

import torch

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.data import wire
from merlin_torch_serving.tensors.batch_invariance import MIN_ROWS, repeated_rows


def pad_ragged(
    values: torch.Tensor,
    offsets: torch.Tensor,
    max_length: int,
    pad_value: float,
    pad_left: bool,
) -> torch.Tensor:
    """Dense ``[rows, max_length]`` from ragged values/offsets, keeping each row's last items.

    Rows longer than ``max_length`` keep their most recent ``max_length`` values (sessions are
    time-ordered, so the tail is what a next-item model needs); shorter rows are padded with
    ``pad_value`` on the right, or on the left when ``pad_left``.
    """
    offsets = offsets.to(torch.int64)
    ends = offsets[1:]
    lengths = torch.clamp(ends - offsets[:-1], max=max_length)
    rows = lengths.shape[0]
    dense = torch.full((rows, max_length), pad_value, dtype=values.dtype, device=values.device)
    exporting = False
    if not torch.jit.is_scripting():
        exporting = torch.compiler.is_exporting()
    if not exporting and (values.shape[0] == 0 or rows == 0):
        return dense
    positions = torch.arange(max_length, device=values.device).unsqueeze(0)
    if pad_left:
        # position p of a row of length n holds item n - max_length + p of its tail
        filled = positions >= (max_length - lengths).unsqueeze(1)
        source = ends.unsqueeze(1) - max_length + positions
    else:
        filled = positions < lengths.unsqueeze(1)
        source = (ends - lengths).unsqueeze(1) + positions
    source = torch.where(filled, source, torch.zeros_like(source))
    if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
        if exporting:  # no read outside the values, whatever the offsets
            return torch.where(filled, exportable.gather_padded(values, source, pad_value), dense)
    return torch.where(filled, values[source], dense)


def check_ragged(name: str, values: torch.Tensor, offsets: torch.Tensor):
    """Refuse offsets that would make padding read the wrong rows: they must start at 0, never
    decrease and end at the number of values. Raised in TorchScript, the message reaches a libtorch
    client as the last line of the error, naming the column as the library's InputError does."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
        if torch.compiler.is_exporting():
            exportable.assert_offsets(name, values, offsets)
            return
    column = name + wire.OFFSETS_SUFFIX
    expected = (
        "offsets from 0 up to len('"
        + name
        + wire.VALUES_SUFFIX
        + "') = "
        + str(values.shape[0])
        + ", never decreasing"
    )
    if offsets.dim() != 1 or offsets.shape[0] == 0:
        raise ValueError(_refusal(column, expected, "no offsets"))
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0 or last != values.shape[0] or bool((offsets[1:] < offsets[:-1]).any()):
        got = "offsets from " + str(first) + " to " + str(last) + " or going back"
        raise ValueError(_refusal(column, expected, got))


def check_ids(name: str, values: torch.Tensor, limit: int):
    """Refuse ids outside ``[0, limit]``, the model's catalog (its embedding table's rows)."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
        if torch.compiler.is_exporting():
            exportable.assert_ids(name, values, limit)
            return
    if values.numel() > 0:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > limit:
            expected = "ids from 0 to " + str(limit) + " (the model's catalog)"
            raise ValueError(_refusal(name, expected, "ids from " + str(low) + " to " + str(high)))


def _refusal(column: str, expected: str, got: str) -> str:
    """The message of a refused input, in the shape ``InputError.from_message`` reads back
    (built by concatenation: TorchScript has no f-strings)."""
    return "input column '" + column + "': expected " + expected + ", got " + got


def pad_dense(
    values: torch.Tensor, max_length: int, pad_value: float, pad_left: bool
) -> torch.Tensor:
    """A fixed-length ``[rows, n]`` list brought to ``[rows, max_length]`` by the same rules."""
    length = values.shape[1]
    if length >= max_length:
        return values[:, length - max_length :]
    padding = torch.full(
        (values.shape[0], max_length - length), pad_value, dtype=values.dtype, device=values.device
    )
    return torch.cat([padding, values] if pad_left else [values, padding], dim=1)


class WireModel(torch.nn.Module):
    """Wraps a model that takes ``Dict[str, Tensor]`` of dense inputs so it takes wire tensors.

    ``ragged_inputs`` arrive as ``name__values`` / ``name__offsets`` (or, when an upstream step
    padded them already, as one dense ``name`` tensor) and are brought to the matching entry of
    ``max_lengths``; ``dense_inputs`` are passed through unchanged. ``id_limits`` maps inputs
    holding ids to the largest id the model knows: an id outside is refused, as are ragged
    offsets that do not describe the values, before the model runs. The
    model's outputs are returned as the model returns them (one tensor or a tuple), which is
    what libtorch matches to the config's outputs by position.
    """

    ragged_inputs: list[str]
    max_lengths: list[int]
    dense_inputs: list[str]
    pad_value: float
    pad_left: bool
    id_limits: dict[str, int]

    def __init__(
        self,
        model: torch.nn.Module,
        ragged_inputs: list[str],
        max_lengths: list[int],
        dense_inputs: list[str],
        pad_value: float = 0.0,
        pad_left: bool = False,
        id_limits: dict[str, int] | None = None,
    ):
        super().__init__()
        self.model = model
        self.ragged_inputs = ragged_inputs
        self.max_lengths = max_lengths
        self.dense_inputs = dense_inputs
        self.pad_value = pad_value
        self.pad_left = pad_left
        self.id_limits = dict(id_limits or {})

    def forward(self, inputs: dict[str, torch.Tensor]):
        features, rows = self.features(inputs)
        if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
            if torch.compiler.is_exporting():
                return self.exported_forward(features, rows)
        return self.model(features)

    def exported_forward(self, features: dict[str, torch.Tensor], rows):
        """The model on at least ``MIN_ROWS`` rows (``exportable.at_least_rows``), each of its
        outputs cut back to the request's rows."""
        pads = dict.fromkeys(self.ragged_inputs, self.pad_value)
        outputs = self.model(exportable.at_least_rows(features, rows, MIN_ROWS, pads))
        if isinstance(outputs, (tuple, list)):
            return tuple(exportable.first_rows(output, rows) for output in outputs)
        return exportable.first_rows(outputs, rows)

    def features(self, inputs: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        """The model's inputs, checked and padded, and their row count."""
        if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
            if torch.compiler.is_exporting():
                return self.exported_features(inputs)
        features: dict[str, torch.Tensor] = {}
        first, expected_rows = "", -1
        for name in self.ragged_inputs + self.dense_inputs:
            # rows of different counts would broadcast silently inside the model
            if name in inputs or name + wire.OFFSETS_SUFFIX in inputs:
                rows = (
                    inputs[name].shape[0]
                    if name in inputs
                    else inputs[name + wire.OFFSETS_SUFFIX].shape[0] - 1
                )
                if first == "":
                    first, expected_rows = name, rows
                elif rows != expected_rows:
                    raise ValueError(
                        "input column '"
                        + name
                        + "': expected "
                        + str(expected_rows)
                        + " rows, like '"
                        + first
                        + "', got "
                        + str(rows)
                        + " rows"
                    )
        for i, name in enumerate(self.ragged_inputs):
            if name in inputs:
                values = inputs[name]
                features[name] = pad_dense(
                    values, self.max_lengths[i], self.pad_value, self.pad_left
                )
            else:
                values = inputs[name + wire.VALUES_SUFFIX]
                offsets = inputs[name + wire.OFFSETS_SUFFIX]
                check_ragged(name, values, offsets)
                features[name] = pad_ragged(
                    values, offsets, self.max_lengths[i], self.pad_value, self.pad_left
                )
            if name in self.id_limits:
                check_ids(name, values, self.id_limits[name])
        for name in self.dense_inputs:
            features[name] = inputs[name]
            if name in self.id_limits:
                check_ids(name, inputs[name], self.id_limits[name])
        return features, expected_rows

    def check(self, inputs: dict[str, torch.Tensor]) -> None:
        """Raise what ``features`` raises for ``inputs``, quoting the values: run before a package,
        whose own checks cannot quote them."""
        self.features(inputs)

    def exported_features(self, inputs: dict[str, torch.Tensor]):
        """``features`` as torch.export traces it: every input brought to the first one's rows
        (``exportable.rows_like``), so that the package assumes nothing of a request's shapes,
        and a mismatch refused by an assertion that names the column."""
        rows_of = {}
        for name in self.ragged_inputs + self.dense_inputs:
            if name in inputs:
                rows_of[name] = inputs[name].shape[0]
            elif name + wire.OFFSETS_SUFFIX in inputs:
                rows_of[name] = torch.sym_max(inputs[name + wire.OFFSETS_SUFFIX].shape[0] - 1, 0)
        first = next(iter(rows_of), "")
        expected_rows = rows_of.get(first, 0)
        for name, rows in rows_of.items():
            if name != first:
                exportable.assert_rows(name, rows, first, expected_rows)
        features: dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.ragged_inputs):
            if name in inputs:
                values = inputs[name]
                dense = pad_dense(values, self.max_lengths[i], self.pad_value, self.pad_left)
            else:
                values = inputs[name + wire.VALUES_SUFFIX]
                offsets = inputs[name + wire.OFFSETS_SUFFIX]
                exportable.assert_offsets(name, values, offsets)
                # the first one's rows (a row of none past its own), never fewer than one offset
                offsets = exportable.rows_like(offsets, expected_rows + 1, values.shape[0])
                dense = pad_ragged(
                    values, offsets, self.max_lengths[i], self.pad_value, self.pad_left
                )
            if name in self.id_limits:
                exportable.assert_ids(name, values, self.id_limits[name])
            features[name] = (
                dense
                if name == first
                else exportable.rows_like(dense, expected_rows, self.pad_value)
            )
        for name in self.dense_inputs:
            if name in self.id_limits:
                exportable.assert_ids(name, inputs[name], self.id_limits[name])
            features[name] = (
                inputs[name] if name == first else exportable.rows_like(inputs[name], expected_rows)
            )
        return features, expected_rows


class OneOutputWireModel(torch.nn.Module):
    """A ``WireModel`` (``wire``) of a model that returns one tensor, which never runs the model on
    fewer than ``min_rows`` rows, so that a session's scores do not depend on what it is batched
    with (see ``batch_invariance``)."""

    min_rows: int

    def __init__(self, wire: WireModel, min_rows: int = MIN_ROWS):
        super().__init__()
        self.wire = wire
        self.min_rows = min_rows

    def check(self, inputs: dict[str, torch.Tensor]) -> None:
        self.wire.check(inputs)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        features, rows = self.wire.features(inputs)
        if not torch.jit.is_scripting():  # noqa: SIM102 (see the module's docstring)
            if torch.compiler.is_exporting():  # a package cannot branch on the row count
                return self.wire.exported_forward(features, rows)
        if 0 < rows < self.min_rows:
            repeat = repeated_rows(rows, self.min_rows)
            taller = {name: tensor[repeat] for name, tensor in features.items()}
            return self.wire.model(taller)[:rows]
        return self.wire.model(features)
