"""An export killed (SIGKILL, no cleanup) at each step of its swap leaves a whole repository at the
path: the old one before the swap, the new one after it; with the two-rename fallback of
filesystems that cannot exchange, the next export puts the old one back."""

import json
import subprocess
import sys
import textwrap

import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import Ensemble, TopK
from merlin_torch_serving.export import swap
from merlin_torch_serving.export.manifest import verify_export

SCHEMA = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 5))])

# Exports ranker with TopK(k) to the path and is killed where the mode says.
CHILD = textwrap.dedent(
    """
    import errno, os, signal, sys
    from merlin.schema import ColumnSchema, Schema
    from merlin_torch_serving import Ensemble, TopK
    from merlin_torch_serving.export import swap

    target, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    exchange, rename = swap.exchange, os.rename

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "before the exchange":
        swap.exchange = lambda first, second: die()
    elif mode == "after the exchange":
        def exchange_and_die(first, second):
            exchange(first, second)
            die()
        swap.exchange = exchange_and_die
    else:  # between the two renames of the fallback
        def unsupported(first, second):
            raise OSError(errno.EINVAL, "not on this filesystem")
        def rename_or_die(source, destination):
            if str(source).endswith("/" + swap.STAGED_DIR):  # the second rename: new tree in place
                die()
            rename(source, destination)
        swap.exchange, os.rename = unsupported, rename_or_die
    schema = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 5))])
    Ensemble(["scores"] >> TopK(k), schema).export(target, "ranker", overwrite=True)
    """
)


def exported_k(path) -> int:
    """The k of the TopK the repository at ``path`` serves, once every file is checked."""
    verify_export(path, "ranker")
    step = json.loads((path / "ranker-0-topk" / "1" / "step.json").read_text())
    return step["calls"][0]["config"]["k"]


@pytest.mark.parametrize(
    ("mode", "k_after_kill"),
    [("before the exchange", 2), ("after the exchange", 3), ("between the two renames", None)],
)
def test_a_killed_export_leaves_a_whole_repository(tmp_path, mode, k_after_kill):
    target = tmp_path / "repo"
    Ensemble(["scores"] >> TopK(2), SCHEMA).export(target, "ranker")

    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(target), mode, "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert child.returncode == -9, child.stderr
    if k_after_kill is None:
        assert not target.exists()  # what the fallback cannot avoid; the next export repairs it
        swap.recover(target)
        assert exported_k(target) == 2
    else:
        assert exported_k(target) == k_after_kill
    Ensemble(["scores"] >> TopK(4), SCHEMA).export(target, "ranker", overwrite=True)
    assert exported_k(target) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"], (
        "the next export cleans up after the killed one"
    )
