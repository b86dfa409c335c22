"""Transformers4Rec models exported unchanged: its tabular aggregations check that their inputs'
shapes agree by putting the shapes in a Python ``set``, which symbolic shapes cannot enter
(torch.export either specialises the batch to the example's or fails with "unhashable type:
non-nested SymInt"). Transformers4Rec skips those checks while ``torch.jit`` traces; here they
are skipped while ``torch.export`` exports, and run as before at any other time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch

# (module, class, methods): the checks that hash shapes
_CHECKS = (
    (
        "transformers4rec.torch.tabular.base",
        "TabularAggregation",
        ("_check_first_two_dims", "_check_concat_shapes"),
    ),
    (
        "transformers4rec.torch.tabular.aggregation",
        "ElementwiseFeatureAggregation",
        ("_check_input_shapes_equal", "_check_inputs_last_dim_equal"),
    ),
)
_MARK = "_skipped_while_exporting"


def allow_export() -> None:
    """Make Transformers4Rec's shape checks step aside while torch.export runs (once; nothing
    when Transformers4Rec is not installed)."""
    if importlib.util.find_spec("transformers4rec") is None:
        return
    for module_name, class_name, methods in _CHECKS:
        cls = getattr(importlib.import_module(module_name), class_name, None)
        for method in methods:
            check = getattr(cls, method, None) if cls is not None else None
            if check is not None and not getattr(check, _MARK, False):
                setattr(cls, method, _skipped_while_exporting(check))


def _skipped_while_exporting(check):
    @functools.wraps(check)
    def checked(self, *args, **kwargs):
        if torch.compiler.is_exporting():
            return None
        return check(self, *args, **kwargs)

    setattr(checked, _MARK, True)
    return checked
