"""The bootstrap, in the forms the rules need: plain (a mean over units), paired (items that stay
together), block / cluster (time blocks drawn whole: consecutive requests or steps are not independent),
and the interval read from the resampled statistics. The stratified forms are in `stratified.py`.

Every resampling rule uses RESAMPLES unless its caller says otherwise (the eval gate's policy does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evals.stats.result import TestResult

# A 95% percentile interval's ends are the 2.5% and 97.5% order statistics of the resamples: with 1000,
# 25 resamples lie beyond each end, enough that the ends move by a few percent of the interval's width
# between seeds (Efron & Tibshirani's advice for percentile intervals); more buys little and costs
# linearly in every diagnostic that bootstraps.
RESAMPLES = 1000
CONFIDENCE = 0.95


def percentile_interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The equal-tailed percentile interval of resampled statistics (axis 0)."""
    a = (1 - confidence) / 2
    low, high = np.quantile(draws, [a, 1 - a])
    return float(low), float(high)


def widened_interval(estimate: float, draws: np.ndarray, widen: float,
                     confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of `draws`, its distances from `estimate` multiplied by `widen` (what
    correlation between adjacent blocks is left: `clusters.autocorrelation_inflation`)."""
    low, high = percentile_interval(draws, confidence)
    return estimate + widen * (low - estimate), estimate + widen * (high - estimate)


def block_counts(blocks: int, rng, resamples: int = RESAMPLES) -> np.ndarray:
    """How often each of `blocks` clusters is drawn in each resample, (resamples, blocks): a statistic of
    sums is then `counts @ per_block_sums`, and every side of a comparison can share one draw."""
    draws = rng.integers(0, blocks, (resamples, blocks))
    return np.bincount((draws + blocks * np.arange(resamples)[:, None]).ravel(),
                       minlength=resamples * blocks).reshape(resamples, blocks).astype(float)


def resampled_means(x: np.ndarray, rng, resamples: int = RESAMPLES, most: int | None = None) -> np.ndarray:
    """The means of `resamples` resamples of `x`. With `most`, a larger `x` is bootstrapped m-out-of-n: a
    `most` subsample's resampled means, their spread rescaled by sqrt(m / n) (a mean's spread does)."""
    if most is not None and len(x) > most:
        sub = rng.choice(x, most, replace=False)
        means = sub[rng.integers(0, most, (resamples, most))].mean(axis=1)
        return x.mean() + (means - sub.mean()) * np.sqrt(most / len(x))
    return x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)


def mean_interval(x: np.ndarray, rng, resamples: int = RESAMPLES,
                  confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean over units (requests)."""
    return percentile_interval(resampled_means(x, rng, resamples), confidence)


@dataclass
class BootstrapResult(TestResult):
    delta: float  # mean(candidate) - mean(baseline)
    ci_low: float
    ci_high: float
    n_resamples: int

    def __post_init__(self):
        self.test = self.test or "paired percentile bootstrap of the mean difference (two-sided)"
        self.statistic, self.effect, self.interval = self.delta, self.delta, (self.ci_low, self.ci_high)


def _paired(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and the same length, got {a.shape} and {b.shape}")
    return a, b


def paired_bootstrap(baseline: Sequence[float], candidate: Sequence[float], n_resamples: int = RESAMPLES,
                     confidence: float = CONFIDENCE, seed: int = 0) -> BootstrapResult:
    """Percentile bootstrap of the mean difference, resampling items (pairs stay together); p: how often a
    resample's difference lands on the other side of 0, doubled."""
    a, b = _paired(baseline, candidate)
    if len(a) == 0:
        raise ValueError("paired bootstrap needs at least one item")
    diff = b - a
    delta = float(diff.mean())
    means = resampled_means(diff, np.random.default_rng(seed), n_resamples)
    low, high = percentile_interval(means, confidence)
    if delta == 0 and np.all(means == 0):
        p = 1.0
    else:
        p = min(1.0, 2.0 * min(np.mean(means <= 0), np.mean(means >= 0)))
    return BootstrapResult(delta, low, high, n_resamples, p_value=float(p), n=len(a))
