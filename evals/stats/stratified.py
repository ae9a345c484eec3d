"""Two samples compared only within strata (like for like): a subject's units (one replica's requests)
against its peers' pooled units, the unit being the resampled one.

- Test: van Elteren's stratified Mann-Whitney (`ranks.van_elteren`).
- Effect: the median over the subject's units of value / (the peers' median in that unit's stratum),
  the denominator floored so near-zero peers (an idle queue) cannot make a big ratio.
- Interval: percentile bootstrap of that effect, resampling units within each stratum on both sides (the
  peers' stratum medians are re-estimated in every resample); large sides are subsampled first (the
  interval gets wider, never narrower).
- For means: the difference of means standardized to the subject's stratum counts, with a bootstrap
  resampling units within each stratum and side (`standardized_difference`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evals.stats.bootstrap import CONFIDENCE, RESAMPLES, percentile_interval, resampled_means
from evals.stats.ranks import VAN_ELTEREN, van_elteren
from evals.stats.result import TestResult

MIN_PER_SIDE = 3  # a stratum compares only when both sides have this many values
# the bootstrap subsamples (a wider, honest interval): peers per stratum, the subject over all strata
PEERS_PER_STRATUM = 400
SUBJECT_MAX = 1000
MEANS_MAX = 400  # per side and stratum: larger samples are bootstrapped m-out-of-n (a mean's spread rescales)


@dataclass
class StratifiedComparison(TestResult):
    n_subject: int  # the subject's units in strata that its peers also served
    n_peers: int
    strata: int
    ratio: float  # median of subject / peers' stratum median
    ratio_ci: tuple[float, float] | None
    z: float

    def __post_init__(self):
        self.test = self.test or VAN_ELTEREN + " vs peers' pooled requests"
        self.statistic, self.effect, self.interval = self.z, self.ratio, self.ratio_ci
        self.n = self.n_subject + self.n_peers


def comparable(subject: dict, peers: dict) -> list:
    """Strata (keys of both {stratum: values}) where each side has MIN_PER_SIDE finite values."""
    return [s for s in subject if s in peers and len(subject[s]) >= MIN_PER_SIDE and len(peers[s]) >= MIN_PER_SIDE]


def _effect(subject: dict, peers: dict, keys: list, floor: float) -> float:
    rel = [subject[s] / max(float(np.median(peers[s])), floor) for s in keys]
    return float(np.median(np.concatenate(rel)))


def median_ratio_interval(subject: dict, peers: dict, keys: list, floor: float, n_resamples: int = RESAMPLES,
                          confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    keep = min(1.0, SUBJECT_MAX / sum(len(subject[s]) for s in keys))
    parts = []
    for s in keys:
        x, y = subject[s], peers[s]
        if keep < 1.0:  # each stratum keeps its share of the subject's units
            x = rng.choice(x, max(1, round(keep * len(x))), replace=False)
        if len(y) > PEERS_PER_STRATUM:
            y = rng.choice(y, PEERS_PER_STRATUM, replace=False)
        med_y = np.median(y[rng.integers(0, len(y), (n_resamples, len(y)))], axis=1)
        xs = x[rng.integers(0, len(x), (n_resamples, len(x)))]
        parts.append(xs / np.maximum(med_y, floor)[:, None])
    return percentile_interval(np.median(np.concatenate(parts, axis=1), axis=1), confidence)


def compare(subject: dict, peers: dict, floor: float, min_units: int, bootstrap: bool = False,
            seed: int = 0) -> StratifiedComparison | None:
    """subject / peers: {stratum: values}. None when fewer than `min_units` of the subject's (or its
    peers') values fall in shared strata."""
    keys = comparable(subject, peers)
    n1 = sum(len(subject[s]) for s in keys)
    n2 = sum(len(peers[s]) for s in keys)
    if n1 < min_units or n2 < min_units:
        return None
    test = van_elteren([(subject[s], peers[s]) for s in keys])
    ci = median_ratio_interval(subject, peers, keys, floor, seed=seed) if bootstrap else None
    return StratifiedComparison(n1, n2, len(keys), _effect(subject, peers, keys, floor), ci, test.statistic,
                                p_value=test.p_value)


def standardized_difference(pairs, rng, n_boot: int = RESAMPLES) -> tuple[float, tuple[float, float], float]:
    """Mean(subject) - mean(peers) within strata, weighted by the subject's counts; a percentile
    bootstrap CI that resamples units within each stratum and side; the peers' level (same weights).
    n_boot 0: the point estimate only."""
    weights = np.array([len(a) for a, _ in pairs], dtype=float)
    weights /= weights.sum()
    point = sum(w * (a.mean() - b.mean()) for w, (a, b) in zip(weights, pairs))
    level = float(sum(w * b.mean() for w, (_, b) in zip(weights, pairs)))
    if n_boot == 0:
        return float(point), (float("nan"), float("nan")), level
    boot = np.zeros(n_boot)
    for w, (a, b) in zip(weights, pairs):
        boot += w * (resampled_means(a, rng, n_boot, MEANS_MAX) - resampled_means(b, rng, n_boot, MEANS_MAX))
    return float(point), percentile_interval(boot), level
