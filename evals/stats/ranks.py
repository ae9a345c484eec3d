"""Rank tests: two samples (Mann-Whitney U with Kolmogorov-Smirnov, as Chromium's Pinpoint decides),
strata of two samples (van Elteren), and paired differences (Wilcoxon signed-rank), with the effect
sizes read beside them (Cliff's delta, the ratio of medians)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from evals.stats.bootstrap import CONFIDENCE, RESAMPLES
from evals.stats.result import TestResult

MIN_SAMPLES = 20  # below this a two-sample test is not worth reporting
BOOTSTRAP_MAX = 1000  # per side: larger samples are subsampled for the interval (a wider, honest CI)
EXACT_KS_MAX = 10_000  # n_a * n_b up to which Kolmogorov-Smirnov is exact (beyond: asymptotic, far cheaper)
# Cliff's delta magnitudes (Romano et al. 2006): negligible < 0.147 <= small < 0.33 <= medium < 0.474 <= large
DELTA_SMALL, DELTA_MEDIUM, DELTA_LARGE = 0.147, 0.33, 0.474


@dataclass
class Comparison(TestResult):
    """Candidate against baseline; positive delta / ratio > 1 mean the candidate's values are larger.
    p_value: both tests must agree, the larger of the two."""

    n_baseline: int
    n_candidate: int
    median_baseline: float
    median_candidate: float
    ratio: float | None  # median_candidate / median_baseline (None when the baseline median is 0)
    ratio_ci: tuple[float, float] | None
    difference: float  # median_candidate - median_baseline
    difference_ci: tuple[float, float] | None
    cliffs_delta: float  # P(candidate > baseline) - P(candidate < baseline)
    mwu_u: float
    mwu_p: float
    ks_stat: float
    ks_p: float

    def __post_init__(self):
        self.test = self.test or "Mann-Whitney U + Kolmogorov-Smirnov (two-sided)"
        self.statistic, self.p_value = self.mwu_u, max(self.mwu_p, self.ks_p)
        self.effect, self.interval = self.ratio, self.ratio_ci
        self.n = self.n_baseline + self.n_candidate


def finite(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def _median_stats(base, cand, axis=-1):
    mb, mc = np.median(base, axis=axis), np.median(cand, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mb > 0, mc / np.where(mb > 0, mb, 1.0), np.nan)
    return np.stack([ratio, mc - mb], axis=0)


def compare_samples(baseline, candidate, *, bootstrap: bool = True, n_resamples: int = RESAMPLES,
                    confidence: float = CONFIDENCE, seed: int = 0, min_samples: int = MIN_SAMPLES) -> Comparison | None:
    """Compare two samples; None when either has fewer than `min_samples` finite values. The intervals
    of the median ratio and difference: percentile bootstrap (scipy.stats.bootstrap), both sides resampled."""
    a, b = finite(baseline), finite(candidate)
    if len(a) < min_samples or len(b) < min_samples:
        return None
    ma, mb = float(np.median(a)), float(np.median(b))
    if np.all(a == a[0]) and np.all(b == a[0]):  # identical constants: no test can say anything
        u, p_u, ks, p_ks = len(a) * len(b) / 2.0, 1.0, 0.0, 1.0
    else:
        mwu = stats.mannwhitneyu(b, a, alternative="two-sided", method="asymptotic")
        ks_result = stats.ks_2samp(a, b, method="exact" if len(a) * len(b) <= EXACT_KS_MAX else "asymp")
        u, p_u, ks, p_ks = float(mwu.statistic), float(mwu.pvalue), float(ks_result.statistic), float(ks_result.pvalue)
    delta = 2.0 * u / (len(a) * len(b)) - 1.0
    ratio = mb / ma if ma > 0 else None
    ratio_ci = diff_ci = None
    if bootstrap:
        rng = np.random.default_rng(seed)
        sa = a if len(a) <= BOOTSTRAP_MAX else rng.choice(a, BOOTSTRAP_MAX, replace=False)
        sb = b if len(b) <= BOOTSTRAP_MAX else rng.choice(b, BOOTSTRAP_MAX, replace=False)
        with warnings.catch_warnings():  # constant samples give a degenerate (point) interval: that is fine
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            res = stats.bootstrap((sa, sb), _median_stats, vectorized=True, paired=False, n_resamples=n_resamples,
                                  confidence_level=confidence, method="percentile", rng=rng)
        low, high = res.confidence_interval
        if ratio is not None and np.isfinite(low[0]) and np.isfinite(high[0]):
            ratio_ci = (float(low[0]), float(high[0]))
        diff_ci = (float(low[1]), float(high[1]))
    return Comparison(len(a), len(b), ma, mb, ratio, ratio_ci, mb - ma, diff_ci, delta, u, p_u, ks, p_ks)


def magnitude(delta: float) -> str:
    d = abs(delta)
    return ("negligible" if d < DELTA_SMALL else "small" if d < DELTA_MEDIUM else
            "medium" if d < DELTA_LARGE else "large")


def _u_and_var(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """U of x over y (ties half) and its tie-corrected null variance n1 n2 / 12 (N + 1 - sum(t^3 - t) /
    (N (N - 1))); U by binary search in the sorted y: no ranking of the pooled sample."""
    n1, n2 = len(x), len(y)
    ys = np.sort(y)
    below, upto = np.searchsorted(ys, x, "left"), np.searchsorted(ys, x, "right")
    u = float(below.sum() + 0.5 * (upto - below).sum())
    n = n1 + n2
    both = np.sort(np.concatenate([x, y]))
    runs = np.diff(np.flatnonzero(np.concatenate([[True], both[1:] != both[:-1], [True]])))  # tie group sizes
    ties = float((runs.astype(float) ** 3 - runs).sum()) / (n * (n - 1)) if n > 1 else 0.0
    return u, n1 * n2 / 12.0 * (n + 1 - ties)


def van_elteren(pairs: list[tuple[np.ndarray, np.ndarray]]) -> TestResult:
    """Van Elteren's stratified Mann-Whitney over (subject, peers) samples per stratum. Strata are
    weighted 1 / (N + 1) (locally most powerful for a common shift); Z = sum w (U - n1 n2 / 2) /
    sqrt(sum w^2 Var U), two-sided normal p. statistic: z > 0 when the subject's values are larger.
    One stratum: the tie-corrected Mann-Whitney test."""
    num = den = 0.0
    for x, y in pairs:
        u, var = _u_and_var(np.asarray(x, float), np.asarray(y, float))
        w = 1.0 / (len(x) + len(y) + 1)
        num += w * (u - len(x) * len(y) / 2.0)
        den += w * w * var
    n = sum(len(x) + len(y) for x, y in pairs)
    if den <= 0:
        return TestResult(test=VAN_ELTEREN, statistic=0.0, p_value=1.0, n=n)
    z = num / math.sqrt(den)
    return TestResult(test=VAN_ELTEREN, statistic=z, p_value=float(2 * stats.norm.sf(abs(z))), n=n)


VAN_ELTEREN = "van Elteren stratified Mann-Whitney (two-sided)"


def signed_rank_greater(diff: np.ndarray) -> TestResult:
    """One-sided Wilcoxon signed-rank test that paired differences lean positive; all zero: p = 1."""
    test = "Wilcoxon signed-rank (one-sided, greater)"
    if not np.any(diff != 0):
        return TestResult(test=test, statistic=0.0, p_value=1.0, n=len(diff))
    r = stats.wilcoxon(diff, alternative="greater", zero_method="wilcox")
    return TestResult(test=test, statistic=float(r.statistic), p_value=float(r.pvalue), n=len(diff))
