"""How close a compiled package must answer to the eager operators it was compiled from.

Compiled code is not bit-exact against eager PyTorch (it fuses and vectorises sums in another
order), so a package is checked against the eager modules within a tolerance instead of exactly
as TorchScript is: floats within ``SCORE_TOLERANCE`` (relative, for values above 1; infinities and
NaNs where eager has them), every other output equal, except that an id may differ where the
scores of the ids around it are closer than that tolerance (a near tie swapped, or the last item
of a list tied with the first one left out). Served and in-process answers run the same package,
and are equal to each other bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

SCORE_TOLERANCE = 1e-5


def difference(
    reference: Sequence[torch.Tensor], compiled: Sequence[torch.Tensor], names: Sequence[str]
) -> str | None:
    """How ``compiled`` differs from ``reference`` beyond the tolerance, or None."""
    if len(reference) != len(compiled):
        return f"{len(compiled)} outputs instead of {len(reference)}"
    for name, want, got in zip(names, reference, compiled, strict=True):
        if want.dtype != got.dtype or want.shape != got.shape:
            return (
                f"output {name!r} is {got.dtype} {list(got.shape)} instead of {want.dtype}"
                f" {list(want.shape)}"
            )
        if want.is_floating_point():
            far = ~_close(want, got)
            if bool(far.any()):
                at = tuple(int(i) for i in torch.nonzero(far)[0])
                return (
                    f"output {name!r} differs by more than {SCORE_TOLERANCE:g} at {list(at)}:"
                    f" eager {want[at].item()!r}, compiled {got[at].item()!r}"
                )
            continue
        differ = want != got
        if not bool(differ.any()):
            continue
        scores = next(
            (
                other
                for other in reference
                if other.is_floating_point() and other.shape == want.shape and want.dim() == 2
            ),
            None,
        )
        untied = differ if scores is None else differ & ~_near_tie(scores)
        if bool(untied.any()):
            at = tuple(int(i) for i in torch.nonzero(untied)[0])
            return (
                f"output {name!r} differs at {list(at)} where no near tie explains it: eager"
                f" {want[at].item()!r}, compiled {got[at].item()!r}"
            )
    return None


def _close(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    both_nan = want.isnan() & got.isnan()
    same_infinite = want.isinf() & (want == got)
    bound = SCORE_TOLERANCE * torch.clamp(want.abs(), min=1.0)
    return both_nan | same_infinite | (torch.isfinite(want) & ((want - got).abs() <= bound))


def _near_tie(scores: torch.Tensor) -> torch.Tensor:
    """Per position of ``[rows, k]`` ranked scores: whether its score is within the tolerance of a
    neighbour's, or it is the last one (whose tie with the first item left out cannot be seen)."""
    tied = torch.zeros_like(scores, dtype=torch.bool)
    if scores.shape[1] == 0:
        return tied
    close = (scores[:, 1:] - scores[:, :-1]).abs() <= SCORE_TOLERANCE
    tied[:, 1:] |= close
    tied[:, :-1] |= close
    tied[:, -1] = True
    return tied
