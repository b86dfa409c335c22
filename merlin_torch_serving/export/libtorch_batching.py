"""Cross-request batching of libtorch steps, with Triton's ragged batching.

Triton's pytorch backend hands a batched model the requests of a batch concatenated: every input
that allows ragged batches arrives flat, the elements of all requests one after the other. What it
cannot do alone is cut the answer back: a request's rows are sessions, not the clicks it sent. So
the python step that feeds a libtorch step also sends, per request, a tensor of one byte per row
(``ROWS_TENSOR``, ``[1, rows]``); from it Triton gives the model each request's row count
(``batch_input`` ``BATCH_ELEMENT_COUNT``) and cuts every output back per request with that shape
(``batch_output`` ``BATCH_SCATTER_WITH_INPUT_SHAPE``). Every other tensor that step reads, the
python step sends flat and one element longer (``PADDED_SUFFIX``): the backend's input collector
(r24.10) stops copying a batch at the first request whose tensor is empty, so no request may send
an empty one; Triton gives the model each request's element counts (``COUNT_SUFFIX``). The module
below drops the padding, rebuilds one merged request (ragged offsets shifted, fixed-width rows
reshaped), runs the step's module once, and checks that it answered one row per row.

A libtorch step batches this way when all its inputs come from one python step, or from the request
through a small libtorch step that does the python step's part (``libtorch_feeder``), and every
output has one row per input row (``dims`` ``[-1, fixed...]``); any other answers one request at a
time in the batched wire form (``request_dim``).
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import json

import numpy as np
import torch
from merlin.schema import Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.export import merging
from merlin_torch_serving.export.config import COUNT_SUFFIX
from merlin_torch_serving.export.partition import TritonStep


def row_sources(steps: list[TritonStep]) -> dict[str, str]:
    """libtorch step name -> the python step that feeds it, for every libtorch step that batches
    across requests (see the module's docstring)."""
    sources: dict[str, str] = {}
    for step in steps:
        if step.backend != "pytorch" or unbatchable_reason(step) is not None:
            continue
        producers = {ref.producer for ref in step.inputs.values()}
        for candidate in steps:
            if candidate.backend == "python" and producers <= candidate.call_indices:
                sources[step.name] = candidate.name
    return sources


def unmerged_steps(
    steps: list[TritonStep], sources: dict[str, str], why: dict[str, str] | None = None
) -> list[str]:
    """For each libtorch step of a batched export that answers one request at a time, why
    (``why``: reasons known beforehand, by step name)."""
    return [
        f"libtorch step {step.name!r} answers one request at a time in this batched export: "
        + (
            (why or {}).get(step.name)
            or unbatchable_reason(step)
            or "its inputs do not all come from one python step"
        )
        for step in steps
        if step.backend == "pytorch" and step.name not in sources
    ]


def fed_tensors(
    steps: list[TritonStep], sources: dict[str, str]
) -> dict[str, list[wire.TensorSpec]]:
    """python step name -> its wire outputs (under its names) that the batched libtorch steps it
    feeds (``sources``, from ``row_sources``) read."""
    by_name = {step.name: step for step in steps}
    fed: dict[str, list[wire.TensorSpec]] = {}
    for name, feeder_name in sources.items():
        feeder = by_name[feeder_name]
        read = set(by_name[name].inputs.values())
        specs = fed.setdefault(feeder_name, [])
        for column in feeder.output_schema:
            if feeder.outputs[column.name] in read:
                specs.extend(s for s in wire.column_specs(column) if s not in specs)
    return fed


def unbatchable_reason(step: TritonStep) -> str | None:
    """Why ``step``'s tensors cannot be merged across requests, or None when they can."""
    for spec in wire.schema_specs(step.input_schema):
        if -1 in spec.dims[1:]:
            return f"input {spec.name!r} has rows of variable width (dims {list(spec.dims)})"
    for spec in wire.schema_specs(step.output_schema):
        if spec.name.endswith((wire.VALUES_SUFFIX, wire.OFFSETS_SUFFIX)):
            return f"output {spec.name!r} is a ragged list"
        if not spec.dims or spec.dims[0] != -1 or -1 in spec.dims[1:]:
            return f"output {spec.name!r} is not one row per input row (dims {list(spec.dims)})"
    return None


def _merged_inputs(
    inputs: dict[str, torch.Tensor], widths: dict[str, list[int]]
) -> tuple[dict[str, torch.Tensor], int]:
    """The flat inputs of a batch (the step's, named in ``widths``: each one's row shape; every
    request's part one padding element longer) as one request, and its row count."""
    rows = inputs["__rows__count"].to(torch.long)  # ROWS_TENSOR + COUNT_SUFFIX
    merged: dict[str, torch.Tensor] = {}
    alone = rows.shape[0] == 1  # a batch of one request: only its padding element to drop
    for name, width in widths.items():
        flat = inputs[name]
        if alone:
            merged[name] = flat[:-1].reshape([-1] + width)
            continue
        counts = inputs[name + "__count"].to(torch.long)
        pads = torch.cumsum(counts, 0) - 1
        keep = torch.ones(flat.shape[0], dtype=torch.bool)
        keep[pads] = False
        tensor = flat[keep]
        if name.endswith("__offsets"):  # wire.OFFSETS_SUFFIX (TorchScript reads no globals)
            merged[name] = _merged_offsets(tensor, counts - 2)
        else:
            merged[name] = tensor.reshape([-1] + width)
    return merged, int(rows.sum())


def _merged_offsets(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The offsets of the requests of a batch (each ``rows[i] + 1`` long, from 0, back to back in
    ``flat``) as the offsets of one request: each shifted by the values of the requests before."""
    ends = torch.cumsum(rows + 1, 0)
    starts = ends - rows - 1
    values = flat[ends - 1]  # each request's last offset: how many values it holds
    shifts = torch.cumsum(values, 0) - values
    keep = torch.ones(flat.shape[0], dtype=torch.bool)
    keep[starts] = False
    tail = flat[keep] + torch.repeat_interleave(shifts, rows)
    return torch.cat([flat.new_zeros(1), tail.to(flat.dtype)])


def _shared_key(inputs: dict[str, torch.Tensor], key: str) -> bool:
    """Whether two requests of the batch hold the same value of ``key`` (the session id): merged,
    the workflow would make their clicks one session."""
    counts = inputs[key + "__count"].to(torch.long)
    if counts.shape[0] < 2:
        return False
    flat = inputs[key]
    request = torch.repeat_interleave(torch.arange(counts.shape[0]), counts)
    keep = torch.ones(flat.shape[0], dtype=torch.bool)
    keep[torch.cumsum(counts, 0) - 1] = False  # each request's padding element
    keys, key_ids = torch.unique(flat[keep], return_inverse=True)
    pairs = torch.unique(key_ids * counts.shape[0] + request[keep])
    return pairs.shape[0] != keys.shape[0]


def _one_request(
    inputs: dict[str, torch.Tensor], widths: dict[str, list[int]], index: int
) -> tuple[dict[str, torch.Tensor], int]:
    """Request ``index`` of a batch on its own, and its row count."""
    alone: dict[str, torch.Tensor] = {}
    for name, width in widths.items():
        counts = inputs[name + "__count"].to(torch.long)
        start = int(counts[:index].sum())
        alone[name] = inputs[name][start : start + int(counts[index]) - 1].reshape([-1] + width)
    return alone, int(inputs["__rows__count"][index])


def _checked(output: torch.Tensor, rows: int) -> torch.Tensor:
    if output.shape[0] != rows:
        raise RuntimeError(
            "a batched libtorch step must answer one row per input row: "
            + str(rows)
            + " rows in, "
            + str(output.shape[0])
            + " out; export with ModelOptions(batching=False)"
        )
    return output


def merged_requests(
    module: torch.jit.ScriptModule, input_schema: Schema, outputs: int, key: str = ""
) -> torch.jit.ScriptModule:
    """``module`` (of ``outputs`` outputs) taking a whole batch of requests at once; with ``key``
    (the session id of a step that reads the request), requests that share a session are answered
    one at a time instead."""
    widths = {
        spec.name: [int(d) for d in spec.dims[1:]] for spec in wire.schema_specs(input_schema)
    }
    answers = ["answer"] if outputs == 1 else [f"answer[{i}]" for i in range(outputs)]
    returns = "Tensor" if outputs == 1 else "Tuple[" + ", ".join(["Tensor"] * outputs) + "]"
    lines = [f"def forward(self, inputs: Dict[str, Tensor]) -> {returns}:"]
    if key:
        lines += [
            f"    if _shared_key(inputs, {json.dumps(key)}):",
            *(f"        parts_{i}: List[Tensor] = []" for i in range(outputs)),
            "        for index in range(inputs['__rows__count'].shape[0]):",
            "            alone, rows = _one_request(inputs, self.widths, index)",
            "            answer = self.inner(alone)",
            *(
                f"            parts_{i}.append(_checked({answer}, rows))"
                for i, answer in enumerate(answers)
            ),
            "        return " + ", ".join(f"torch.cat(parts_{i})" for i in range(outputs)),
        ]
    lines += [
        "    merged, rows = _merged_inputs(inputs, self.widths)",
        "    answer = self.inner(merged)",
        "    return " + ", ".join(f"_checked({answer}, rows)" for answer in answers),
        "",
    ]
    source = "\n".join(lines)

    # a class per module: TorchScript keeps the methods a ScriptModule defines on its class
    class MergedRequests(torch.jit.ScriptModule):
        """Runs the step's module once on all the requests of a batch."""

        def __init__(self):
            super().__init__()
            self.inner = module
            self.widths = torch.jit.Attribute(widths, dict[str, list[int]])
            self.define(source)

    return MergedRequests()


def flat_batch(
    requests: list[dict[str, np.ndarray]], key: str | None = None
) -> dict[str, np.ndarray]:
    """What Triton's pytorch backend hands a merged module for ``requests`` (each its wire arrays),
    as the step that feeds it sends them: every tensor flat and padded, the requests back to back,
    and the element counts of each; with ``key``, each request's rows are its sessions."""
    sent = [
        merging.padded_for_libtorch(request, None if key is None else len(np.unique(request[key])))
        for request in requests
    ]
    batch = {name: np.concatenate([request[name] for request in sent]) for name in sent[0]}
    for name in sent[0]:
        batch[name + COUNT_SUFFIX] = np.array([len(r[name]) for r in sent], dtype=np.int32)
    return batch
