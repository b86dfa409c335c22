"""What a package is compiled for: this CPU by default, or an x86-64 level every CPU of that level
runs, each recording the CPU features its code may use; unknown names refused."""

from __future__ import annotations

import itertools
import platform

import pytest

from merlin_torch_serving import ModelOptions
from merlin_torch_serving.aot.instruction_sets import (
    INSTRUCTION_SETS,
    LEVELS,
    cpu_flags,
    instruction_set,
)

x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 levels")


def test_native_needs_what_this_cpu_has_and_leaves_the_compiler_to_pick():
    native = instruction_set("native")
    assert set(native.required_flags) <= (cpu_flags() or set())
    assert native.inductor_configs() == {}
    assert native.metadata()["instruction_set"] == native.description


@x86_only
def test_each_level_compiles_for_its_march_and_vector_width_and_needs_its_features():
    baseline = instruction_set("x86-64-v3")
    assert baseline.inductor_configs() == {"cpp.march": "x86-64-v3", "cpp.simdlen": 256}
    assert {"avx2", "fma", "f16c"} <= set(baseline.required_flags)
    assert "avx512f" not in baseline.required_flags
    assert instruction_set("x86-64").inductor_configs() == {"cpp.march": "x86-64", "cpp.simdlen": 0}
    levels = list(LEVELS)  # each level needs all of the one below it
    for higher, lower in itertools.pairwise(levels):
        assert set(LEVELS[lower][0]) < set(LEVELS[higher][0])


def test_an_unknown_instruction_set_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"instruction_set must be one of 'native', .*'x86-64'"):
        instruction_set("avx9000")
    with pytest.raises(ValueError, match="instruction_set must be one of"):
        ModelOptions(instruction_set="avx9000")
    assert INSTRUCTION_SETS[0] == "native"
