"""What the feature lookups share (``LookupFeatures``, ``FeastFeatures``): one key per input row,
in a column of their choosing, and one output column per declared feature."""

from __future__ import annotations

from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.multistage.feature_specs import FeatureSpec
from merlin_torch_serving.ops.base import ServingOperator


class FeatureLookup(ServingOperator):
    """A lookup of ``specs`` by the keys in ``column``, answered as ``prefix + name`` columns.

    Subclasses set ``column``, ``prefix`` and ``specs`` and say which keys they take."""

    column: str
    prefix: str
    specs: list[FeatureSpec]
    #: the key kinds taken (merlin's element types) and the dtype of a column made for them
    key_kinds: tuple[str, ...] = ("int", "string")
    key_dtype: object = "int64"

    def key_description(self) -> str:
        """What the key column must hold, for messages."""
        return "one int or text key per row"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        column = input_schema.get(self.column)
        if column is None:
            return Schema([ColumnSchema(self.column, dtype=self.key_dtype, dims=(None,))])
        return Schema([column])

    def root_columns(self) -> list[str]:
        return [self.column]

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        column = input_schema[self.column]
        if column.is_list or column.dtype.element_type.value not in self.key_kinds:
            raise SchemaError(
                self.label,
                self.column,
                self.key_description(),
                describe_column(column),
                "unroll lists of candidates into rows first (UnrollCandidates)"
                if column.is_list
                else "",
            )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([spec.column(self.prefix + spec.name) for spec in self.specs])
