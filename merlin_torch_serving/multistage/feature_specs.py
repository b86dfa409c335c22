"""What a feature lookup answers: each feature's name, dtype, whether it is a list, and the default
a key that was not found gets, described the same way for an exported table and for Feast.

Dtypes are written as numpy names, lists as ``list[<dtype>]`` (``"float32"``, ``"int64"``,
``"list[int64]"``), the way Feast's ``Float32``, ``Int64`` and ``Array(Int64)`` map onto them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from merlin.schema import ColumnSchema

from merlin_torch_serving.data import wire

_LIST = re.compile(r"^list\[(?P<inner>[a-z0-9]+)\]$")
_KINDS = "iuf"  # what a ranker can read: integers and floats


@dataclass(frozen=True)
class FeatureSpec:
    """One feature of a lookup: ``default`` is a scalar, or a tuple for a list feature."""

    name: str
    dtype: np.dtype
    is_list: bool
    default: Any

    @property
    def text(self) -> str:
        """The dtype as ``parse_features`` reads it."""
        return f"list[{self.dtype.name}]" if self.is_list else self.dtype.name

    def column(self, name: str) -> ColumnSchema:
        """The output column this feature becomes, under ``name``."""
        return ColumnSchema(name, dtype=self.dtype, dims=(None, None) if self.is_list else (None,))

    def default_values(self) -> np.ndarray:
        """The default as an array: one value, or the default list's values."""
        values = self.default if self.is_list else [self.default]
        return np.asarray(values, dtype=self.dtype).reshape(-1)


def parse_features(
    features: Mapping[str, str | np.dtype], defaults: Mapping[str, Any] | None, label: str
) -> list[FeatureSpec]:
    """``FeatureSpec``s of ``{name: dtype}``; a feature without a default gets 0 (an empty list)."""
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - set(features))
    if unknown:
        raise ValueError(
            f"{label}: defaults name {unknown[0]!r}, which is not one of its features"
            f" ({', '.join(map(repr, features))})"
        )
    specs = []
    for name, dtype in features.items():
        is_list, numpy_dtype = _dtype(dtype, name, label)
        default = defaults.get(name, () if is_list else 0)
        if is_list:
            if np.ndim(default) != 1:
                raise ValueError(
                    f"{label}: the default of the list feature {name!r} must be a list, got"
                    f" {default!r}"
                )
            default = tuple(np.asarray(default, dtype=numpy_dtype).tolist())
        else:
            if np.ndim(default) != 0:
                raise ValueError(
                    f"{label}: the default of feature {name!r} ({numpy_dtype}) must be one value,"
                    f" got {default!r}"
                )
            default = np.asarray(default, dtype=numpy_dtype).item()
        specs.append(FeatureSpec(name, numpy_dtype, is_list, default))
    return specs


def to_config(specs: list[FeatureSpec]) -> dict[str, Any]:
    """JSON-able ``features`` and ``defaults`` that ``parse_features`` reads back."""
    return {
        "features": {spec.name: spec.text for spec in specs},
        "defaults": {
            spec.name: list(spec.default) if spec.is_list else spec.default for spec in specs
        },
    }


def _dtype(dtype: str | np.dtype, name: str, label: str) -> tuple[bool, np.dtype]:
    text = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    matched = _LIST.match(text.strip())
    inner = matched.group("inner") if matched else text.strip()
    try:
        numpy_dtype = np.dtype(inner)
    except TypeError:
        numpy_dtype = None
    if numpy_dtype is None or numpy_dtype.kind not in _KINDS:
        raise ValueError(
            f"{label}: feature {name!r} has dtype {dtype!r}; features are numbers or lists of"
            " numbers ('float32', 'int64', 'list[int64]', ...). Encode text features as ids first"
        )
    wire.triton_dtype(numpy_dtype)  # a dtype Triton can carry
    return matched is not None, numpy_dtype


def gather(
    spec: FeatureSpec, values: np.ndarray, offsets: np.ndarray | None, rows: np.ndarray
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The feature of each of ``rows`` (positions into ``values``; ``-1`` for a key that was not
    found, which gets the default): a column of scalars, or a ragged list's values and offsets."""
    missing = rows < 0
    if not spec.is_list:
        if not missing.any():
            return values[rows]
        return np.where(missing, spec.default_values()[0], values[np.where(missing, 0, rows)])
    # the default list as one more row after the last, so a single gather answers every row
    default = spec.default_values()
    assert offsets is not None  # a list feature has offsets
    extended_values = np.concatenate([values, default]).astype(spec.dtype, copy=False)
    extended_offsets = np.concatenate([offsets, [offsets[-1] + len(default)]])
    return wire.take_ragged(
        extended_values, extended_offsets, np.where(missing, len(offsets) - 1, rows)
    )
