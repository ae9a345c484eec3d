"""Greedy outputs of two sides over the same items: how often they are identical (with a Wilson
interval) and where two outputs first diverge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from evals.stats.proportions import wilson_interval


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two sequences differ (the shorter one's length if one
    is a prefix of the other); None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class GreedyAgreement:
    items: int
    identical: int
    agreement: float  # fraction of items with identical output token ids
    agreement_ci: tuple[float, float]  # Wilson 95%
    divergence_positions: list[int] = field(default_factory=list)  # of the items that differ
    median_first_divergence: float | None = None
    min_first_divergence: int | None = None


def greedy_agreement(baseline_outputs: Sequence[Sequence[int]],
                     candidate_outputs: Sequence[Sequence[int]]) -> GreedyAgreement:
    if len(baseline_outputs) != len(candidate_outputs):
        raise ValueError(f"{len(baseline_outputs)} baseline outputs vs {len(candidate_outputs)} candidate outputs")
    pos = [d for d in (first_divergence(a, b) for a, b in zip(baseline_outputs, candidate_outputs)) if d is not None]
    n = len(baseline_outputs)
    same = n - len(pos)
    return GreedyAgreement(
        items=n, identical=same, agreement=same / n if n else float("nan"), agreement_ci=wilson_interval(same, n),
        divergence_positions=pos, median_first_divergence=float(np.median(pos)) if pos else None,
        min_first_divergence=min(pos) if pos else None,
    )
