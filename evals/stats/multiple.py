"""Many comparisons at once: Holm's step-down adjustment (family-wise error over strata, metrics, replicas)."""

from __future__ import annotations

import numpy as np

from evals.stats.result import TestResult


def holm(tests: list[TestResult] | list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of a family, in its order: of `TestResult`s (their p_value),
    or of p-values where a rule keeps only those."""
    p_values = [t.p_value if isinstance(t, TestResult) else float(t) for t in tests]
    m = len(p_values)
    order = np.argsort(p_values)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted.tolist()
