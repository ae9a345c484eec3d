"""Stratified two-sample statistics: one replica's requests against its peers' pooled requests,
compared only within strata (like for like), the request being the unit.

- Test: van Elteren's stratified Mann-Whitney. Per stratum s with n1 subject and n2 peer values,
  U_s (subject > peer, ties half) has mean n1 n2 / 2 and the tie-corrected variance
  n1 n2 / 12 * (N + 1 - sum(t^3 - t) / (N (N - 1))); strata are weighted 1 / (N + 1) (locally most
  powerful for a common shift) and Z = sum w (U - E) / sqrt(sum w^2 Var), two-sided normal p.
- Effect: the median over the subject's requests of value / (the peers' median in that request's
  stratum), the denominator floored so near-zero peers (an idle queue) cannot make a big ratio.
- Interval: percentile bootstrap of that effect, resampling requests within each stratum on both
  sides (the peers' stratum medians are re-estimated in every resample); large sides are subsampled
  first (the interval gets wider, never narrower).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

MIN_PER_SIDE = 3  # a stratum compares only when both sides have this many values
BOOTSTRAP = 400
# the bootstrap subsamples (a wider, honest interval): peers per stratum, the subject over all strata
PEERS_PER_STRATUM = 400
SUBJECT_MAX = 1000
# the stratified difference of means (standardized_difference)
MEAN_BOOTSTRAP = 500
BOOT_MAX = 400  # per side and stratum: larger samples are bootstrapped m-out-of-n (a mean's spread rescales)


@dataclass
class StratifiedComparison:
    n_subject: int  # the subject's requests in strata that its peers also served
    n_peers: int
    strata: int
    ratio: float  # median of subject / peers' stratum median
    ratio_ci: tuple[float, float] | None
    z: float
    p_value: float
    test: str = "van Elteren stratified Mann-Whitney (two-sided) vs peers' pooled requests"

    def to_dict(self) -> dict:
        return asdict(self)


def _u_and_var(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    # U by binary search in the sorted peers (ties count half): no ranking of the pooled sample
    n1, n2 = len(x), len(y)
    ys = np.sort(y)
    below, upto = np.searchsorted(ys, x, "left"), np.searchsorted(ys, x, "right")
    u = float(below.sum() + 0.5 * (upto - below).sum())
    n = n1 + n2
    both = np.sort(np.concatenate([x, y]))
    runs = np.diff(np.flatnonzero(np.concatenate([[True], both[1:] != both[:-1], [True]])))  # tie group sizes
    ties = float((runs.astype(float) ** 3 - runs).sum()) / (n * (n - 1)) if n > 1 else 0.0
    return u, n1 * n2 / 12.0 * (n + 1 - ties)


def comparable(subject: dict, peers: dict) -> list:
    """Strata (keys of both {stratum: values}) where each side has MIN_PER_SIDE finite values."""
    return [s for s in subject if s in peers and len(subject[s]) >= MIN_PER_SIDE and len(peers[s]) >= MIN_PER_SIDE]


def van_elteren(subject: dict, peers: dict, keys: list) -> tuple[float, float]:
    num = den = 0.0
    for s in keys:
        x, y = subject[s], peers[s]
        u, var = _u_and_var(x, y)
        w = 1.0 / (len(x) + len(y) + 1)
        num += w * (u - len(x) * len(y) / 2.0)
        den += w * w * var
    if den <= 0:
        return 0.0, 1.0
    z = num / math.sqrt(den)
    return z, float(2 * stats.norm.sf(abs(z)))


def _effect(subject: dict, peers: dict, keys: list, floor: float) -> float:
    rel = [subject[s] / max(float(np.median(peers[s])), floor) for s in keys]
    return float(np.median(np.concatenate(rel)))


def bootstrap_ci(subject: dict, peers: dict, keys: list, floor: float, n_resamples: int = BOOTSTRAP,
                 confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    keep = min(1.0, SUBJECT_MAX / sum(len(subject[s]) for s in keys))
    parts = []
    for s in keys:
        x, y = subject[s], peers[s]
        if keep < 1.0:  # each stratum keeps its share of the subject's requests
            x = rng.choice(x, max(1, round(keep * len(x))), replace=False)
        if len(y) > PEERS_PER_STRATUM:
            y = rng.choice(y, PEERS_PER_STRATUM, replace=False)
        med_y = np.median(y[rng.integers(0, len(y), (n_resamples, len(y)))], axis=1)
        xs = x[rng.integers(0, len(x), (n_resamples, len(x)))]
        parts.append(xs / np.maximum(med_y, floor)[:, None])
    effects = np.median(np.concatenate(parts, axis=1), axis=1)
    a = (1 - confidence) / 2
    return float(np.quantile(effects, a)), float(np.quantile(effects, 1 - a))


def compare(subject: dict, peers: dict, floor: float, min_requests: int, bootstrap: bool = False,
            seed: int = 0) -> StratifiedComparison | None:
    """None when fewer than `min_requests` of the subject's (or its peers') values fall in shared strata."""
    keys = comparable(subject, peers)
    n1 = sum(len(subject[s]) for s in keys)
    n2 = sum(len(peers[s]) for s in keys)
    if n1 < min_requests or n2 < min_requests:
        return None
    z, p = van_elteren(subject, peers, keys)
    ci = bootstrap_ci(subject, peers, keys, floor, seed=seed) if bootstrap else None
    return StratifiedComparison(n1, n2, len(keys), _effect(subject, peers, keys, floor), ci, z, p)


def standardized_difference(pairs, rng, n_boot: int = MEAN_BOOTSTRAP) -> tuple[float, tuple[float, float], float]:
    """Mean(subject) - mean(peers) within strata, weighted by the subject's counts; a percentile
    bootstrap CI that resamples requests within each stratum and side; the peers' level (same weights)."""
    weights = np.array([len(a) for a, _ in pairs], dtype=float)
    weights /= weights.sum()
    point = sum(w * (a.mean() - b.mean()) for w, (a, b) in zip(weights, pairs))
    level = float(sum(w * b.mean() for w, (_, b) in zip(weights, pairs)))
    if n_boot == 0:  # the point estimate only
        return float(point), (float("nan"), float("nan")), level
    boot = np.zeros(n_boot)
    for w, (a, b) in zip(weights, pairs):
        boot += w * (resampled_means(a, n_boot, rng) - resampled_means(b, n_boot, rng))
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(point), (float(low), float(high)), level


def resampled_means(x: np.ndarray, n_boot: int, rng) -> np.ndarray:
    if len(x) > BOOT_MAX:  # m-out-of-n: a BOOT_MAX subsample's resampled means, spread rescaled by sqrt(m / n)
        sub = rng.choice(x, BOOT_MAX, replace=False)
        means = sub[rng.integers(0, BOOT_MAX, (n_boot, BOOT_MAX))].mean(axis=1)
        return x.mean() + (means - sub.mean()) * np.sqrt(BOOT_MAX / len(x))
    return x[rng.integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
