"""Packages called on probes in a child process: answers and refusals come back per probe, and a
package whose compiled code kills the process that runs it (an integer division by a row count of
0) is refused naming the probe, while this process goes on."""

from __future__ import annotations

import numpy as np
import pytest

from merlin_torch_serving.aot.probing import package_answers
from merlin_torch_serving.exceptions import PackageError
from tests.aot_models import TINY_REFUSAL, dividing_package, tiny_example


def _arrays(example) -> dict:
    return {name: tensor.numpy() for name, tensor in example.items()}


def test_answers_and_refusals_come_back_per_probe_in_order(tiny_package):
    good = _arrays(tiny_example(rows=2))
    bad = _arrays(tiny_example(rows=2))
    bad["b"][0, 0] = -1

    answered, refused = package_answers(tiny_package, "Tiny", [good, bad], threads=1)

    np.testing.assert_array_equal(answered[1], good["b"] + 1)
    assert isinstance(refused, str)
    assert TINY_REFUSAL in refused


def test_a_package_that_kills_its_process_is_refused_naming_the_probe():
    package = dividing_package()
    some_rows = {"a": np.ones(5, dtype=np.float32)}
    no_rows = {"a": np.ones(0, dtype=np.float32)}
    with pytest.raises(
        PackageError,
        match=r"DividesByRows: its package killed the process running it \(exit code -8\) on a"
        r" probe of the shapes \{'a': \[0\]\}; it is not used",
    ):
        package_answers(package, "DividesByRows", [some_rows, no_rows], threads=1)
