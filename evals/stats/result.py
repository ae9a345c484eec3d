"""The one shape a statistical test's outcome has, whichever test made it.

Every test in `evals.stats` returns a `TestResult`, or a richer result that is one (the fields below,
then its own): Holm, the diagnostics' evidence and the reports read `p_value`, `effect` and `interval`
from it, so a p-value is never `["p"]` in one place and `.p` or `t[3]` in another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


# kw_only: a richer result (a dataclass deriving from this) lists its own fields positionally after these
@dataclass(kw_only=True)
class TestResult:
    __test__ = False  # a result, not a pytest test class

    test: str = ""  # what was computed, in words a finding's evidence can quote
    statistic: float | None = None  # the test's own statistic (z, chi-square, U, ...)
    p_value: float = 1.0
    effect: float | None = None  # the effect size the verdict is read with (a ratio, a difference, ...)
    interval: tuple[float, float] | None = None  # the effect's confidence interval, where one was computed
    n: int | None = None  # the units the test counted (requests, pairs, clusters)

    def to_dict(self) -> dict:
        return asdict(self)
