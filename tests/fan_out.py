"""A graph whose node is read by three branches, that node counting its own transforms in a file
(a line per call, in-process and in a served step alike): ``counted`` is read by a libtorch step
(``doubled``), by the python operator beside it (``tripled``) and by a python step after the
libtorch one (``summed``, of ``doubled`` and ``counted``). Merlin's executor would run ``counted``
once per branch; this library's plan runs it once per request.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
from pathlib import Path

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import ServingOperator

REQUEST_SCHEMA = Schema([ColumnSchema("x", dtype=np.float32)])


class CountTransforms(ServingOperator):
    """Passes ``x`` on as ``counted``, adding a line to ``counter_file`` each time it runs."""

    def __init__(self, counter_file: str):
        super().__init__()
        self.counter_file = str(counter_file)

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return input_schema.select_by_name(["x"])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([input_schema["x"].with_name("counted")])

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        with open(self.counter_file, "a") as counter:
            counter.write("transform\n")
        return TensorTable({"counted": np.asarray(transformable["x"].values)}, _unsafe=True)

    def config(self) -> dict:
        return {"counter_file": self.counter_file}


def times(values: torch.Tensor, factor: float) -> torch.Tensor:
    return values * factor


class TimesModule(torch.nn.Module):
    column: str
    factor: float

    def __init__(self, column: str, factor: float):
        super().__init__()
        self.column = column
        self.factor = factor

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return times(inputs[self.column], self.factor)


class Times(ServingOperator):
    """``output`` = ``column`` x ``factor``, a libtorch step of its own when ``on_libtorch``."""

    def __init__(self, factor: float, output: str, column: str = "counted", on_libtorch=False):
        super().__init__()
        self.factor = float(factor)
        self.output = output
        self.column = column
        self.on_libtorch = bool(on_libtorch)

    @property
    def backend(self) -> str:
        return "pytorch" if self.on_libtorch else "python"

    @property
    def label(self) -> str:
        return f"Times({self.factor:g})"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return input_schema.select_by_name([self.column])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([input_schema[self.column].with_name(self.output)])

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        values = torch.from_numpy(np.asarray(transformable[self.column].values))
        return TensorTable({self.output: times(values, self.factor).numpy()}, _unsafe=True)

    def config(self) -> dict:
        return {
            "factor": self.factor,
            "output": self.output,
            "column": self.column,
            "on_libtorch": self.on_libtorch,
        }

    def torchscript(self, input_schema: Schema):
        return TimesModule(self.column, self.factor) if self.on_libtorch else None


class Plus(ServingOperator):
    """``summed`` = ``doubled`` + ``counted``."""

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return input_schema.select_by_name(["doubled", "counted"])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([input_schema["counted"].with_name("summed")])

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        summed = np.asarray(transformable["doubled"].values) + np.asarray(
            transformable["counted"].values
        )
        return TensorTable({"summed": summed}, _unsafe=True)


def fan_out_graph(counter_file: Path):
    counted = ["x"] >> CountTransforms(str(counter_file))
    doubled = counted >> Times(2.0, "doubled", on_libtorch=True)
    tripled = counted >> Times(3.0, "tripled")
    summed = (doubled + counted) >> Plus()
    return tripled + summed


def transforms_counted(counter_file: Path) -> int:
    """How many times ``CountTransforms`` ran so far."""
    return len(counter_file.read_text().splitlines()) if counter_file.exists() else 0
