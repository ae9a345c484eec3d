"""Counts of events: Wilson intervals, McNemar on paired outcomes, two proportions, chi-square of
homogeneity, and the Cochran-Mantel-Haenszel test over strata (exact while the events are few)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

from evals.stats.bootstrap import CONFIDENCE, _paired
from evals.stats.result import TestResult

CMH_EXACT_MAX_EVENTS = 2000  # events of a CMH comparison up to which its p is exact (convolved hypergeometrics)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there are no trials."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass
class McNemarResult(TestResult):
    """p_value: the mid-p, the one the gate decides with."""

    pairs: int  # paired items
    baseline_only: int  # b: baseline right, candidate wrong
    candidate_only: int  # c: candidate right, baseline wrong
    p_exact: float  # two-sided exact conditional (binomial) p-value
    p_mid: float  # two-sided mid-p (less conservative, Fagerland et al. 2013)

    def __post_init__(self):
        self.test = self.test or "McNemar mid-p (two-sided)"
        self.statistic, self.p_value, self.n = float(self.candidate_only), self.p_mid, self.pairs

    @property
    def discordant(self) -> int:
        return self.baseline_only + self.candidate_only


def mcnemar(baseline_correct: Sequence[bool], candidate_correct: Sequence[bool]) -> McNemarResult:
    """McNemar's test on paired correctness: do the discordant pairs split evenly?"""
    a, b = _paired(baseline_correct, candidate_correct)
    a, b = a > 0.5, b > 0.5
    n01 = int(np.sum(a & ~b))
    n10 = int(np.sum(~a & b))
    n = n01 + n10
    if n == 0:
        return McNemarResult(len(a), 0, 0, 1.0, 1.0)
    k = min(n01, n10)
    p_exact = float(stats.binomtest(k, n, 0.5).pvalue)
    # mid-p: the exact one-sided tail with only half of P(X = k), doubled
    p_mid = min(1.0, 2.0 * (stats.binom.cdf(k, n, 0.5) - 0.5 * stats.binom.pmf(k, n, 0.5)))
    return McNemarResult(len(a), n01, n10, p_exact, float(p_mid))


@dataclass
class ProportionTest(TestResult):
    successes_a: int
    n_a: int
    successes_b: int
    n_b: int
    rate_a: float
    rate_b: float
    difference: float  # rate_b - rate_a
    z: float

    def __post_init__(self):
        self.test = self.test or "two-proportion z test (pooled, two-sided)"
        self.statistic, self.effect, self.n = self.z, self.difference, self.n_a + self.n_b


def two_proportions(successes_a: int, n_a: int, successes_b: int, n_b: int) -> ProportionTest | None:
    if n_a <= 0 or n_b <= 0:
        return None
    ra, rb = successes_a / n_a, successes_b / n_b
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        z, p = 0.0, 1.0
    else:
        z = (rb - ra) / se
        p = float(2 * stats.norm.sf(abs(z)))
    return ProportionTest(int(successes_a), int(n_a), int(successes_b), int(n_b), ra, rb, rb - ra, z, p_value=p)


def chi_square_homogeneity(successes: list[int], totals: list[int]) -> TestResult | None:
    """Chi-square test that several groups share one success rate (scipy.stats.chi2_contingency)."""
    table = np.array([[s, t - s] for s, t in zip(successes, totals) if t > 0], dtype=float)
    if len(table) < 2 or (table.sum(axis=0) == 0).any():
        return None
    res = stats.chi2_contingency(table, correction=False)
    return TestResult(test="chi-square of homogeneity", statistic=float(res.statistic), p_value=float(res.pvalue),
                      n=int(table.sum()))


def cmh_greater(a, n1, n2, events) -> TestResult:
    """One-sided Cochran-Mantel-Haenszel test that a subject's events (a per stratum, of n1) exceed what
    each stratum's margins predict (n2 the reference's units, `events` both sides' events per stratum):
    exact (the convolution of the strata's hypergeometric distributions, as R's
    mantelhaen.test(exact=TRUE)) while the events are few, where the normal approximation is far too
    small for rare events (2 of 30 against 0 of 600: 1.6e-7 against the exact 0.0022); beyond
    CMH_EXACT_MAX_EVENTS the continuity-corrected normal one. statistic: the subject's events."""
    a, n1, n2, events = (np.asarray(v, dtype=float) for v in (a, n1, n2, events))
    if events.sum() <= CMH_EXACT_MAX_EVENTS:
        dist, offset = np.array([1.0]), 0
        for k, m, e in zip(n1.astype(int), n2.astype(int), events.astype(int)):
            low = max(0, e - m)
            dist = np.convolve(dist, stats.hypergeom(k + m, k, e).pmf(np.arange(low, min(k, e) + 1)))
            offset += low
        p = float(min(1.0, dist[max(0, int(a.sum()) - offset):].sum()))
        return TestResult(test="exact conditional (Cochran-Mantel-Haenszel, one-sided: the replica above its peers)",
                          statistic=float(a.sum()), p_value=p, n=int(n1.sum() + n2.sum()))
    total = n1 + n2
    expected = (n1 * events / total).sum()
    variance = (n1 * n2 * events * (total - events) / (total ** 2 * np.maximum(total - 1, 1))).sum()
    p = float(stats.norm.sf((a.sum() - expected - 0.5) / math.sqrt(variance))) if variance > 0 else 1.0
    return TestResult(test="Cochran-Mantel-Haenszel, one-sided (the replica above its peers), continuity-corrected",
                      statistic=float(a.sum()), p_value=p, n=int(n1.sum() + n2.sum()))
