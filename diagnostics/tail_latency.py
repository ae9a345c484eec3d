"""Tail latency, like for like: is a replica's upper tail (p90 of queue time and of TTFT) longer than
its peers' in the same strata?

A replica whose scheduler admits one sequence at a time (max_num_seqs 1, a tiny token budget) queues
only when requests overlap: at moderate load most of its requests do not wait, so its median is near
its peers', but those that do wait far longer. The median comparison (evals.stats.stratified) misses
that; this compares the tail, the request being the unit.

- Strata: the median rule's (diagnostics.request_strata: model, workload, prompt length, offered
  load at arrival), so a replica that got more load (a calibration burst) or longer prompts is
  compared only with its peers' requests under the same load and lengths; the caller merges the
  output-length buckets (queue time and TTFT come before a request's own output: its length cannot
  have caused them, and a p90 needs requests).
- Effect: per stratum with >= MIN_PER_SIDE requests on both sides, log(p90 subject / p90 peers), each
  quantile floored (an idle queue of 50 us is not 0) and estimated at position q (n + 1) (Weibull),
  which is unbiased in probability whatever n: with the usual q (n - 1) + 1 a side with few requests
  has a lower p90 than a side with many drawn from the same distribution. Strata are combined by a
  weighted mean, weights n1 n2 / (n1 + n2) (the inverse variance of a difference of two sample
  statistics, up to a constant); the effect is exp(mean), the p90 ratio.
- Interval and test: a block bootstrap over time. Queueing is autocorrelated (the requests of one
  burst wait together), so resampling requests would give too narrow an interval: time is cut into
  blocks of the span / TARGET_BLOCKS, at least BLOCK_MIN_SECONDS (the offered-load window: a burst
  lives inside it), doubled while adjacent blocks' exceedances (the share of a block's requests above
  the pooled stratum p90, per side) stay correlated (lag-1 z > AUTOCORR_Z) and MIN_BLOCKS remain;
  what correlation is left widens the spread by sqrt((1 + rho) / (1 - rho)) (diagnostics.steps
  does the same for steps). Blocks are drawn with replacement jointly for the replica and its peers
  (they share the time's load), and the effect is recomputed from the blocks' multiplicities.
  Interval: bootstrap percentiles; p: two-sided, t with (blocks - 1) degrees of freedom on the
  bootstrap standard error of the log ratio (few blocks: the standard error is itself uncertain).
  The replicas diagnostic Holm-adjusts it together with its median tests.
- Described too: the share of the subject's requests above the peers' stratum p90 (about 10% if alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from evals.stats import RESAMPLES, TestResult, autocorrelation_inflation, block_counts, widened_interval

QUANTILE = 0.9
METRICS = ("queue", "ttft")  # where waiting shows: what a scheduler's limits do to the tail
MIN_PER_SIDE = 10  # a p90 needs this many requests per side in a stratum (q (n + 1) <= n)
MIN_BLOCKS = 8  # time blocks holding the subject's compared requests
TARGET_BLOCKS = 20
BLOCK_MIN_SECONDS = 5.0
BLOCK_MAX_SECONDS = 300.0
AUTOCORR_Z = 2.0  # adjacent blocks' exceedances correlated beyond this z: blocks too short, doubled
MIN_CELL = 5  # a (block, side) cell with fewer requests gives no residual to the autocorrelation
PEERS_PER_STRATUM = 400  # larger peer sides are subsampled for the bootstrap (a wider interval, never narrower)
TEST = (f"stratified p{QUANTILE * 100:.0f} ratio (weighted mean log ratio over strata) vs peers' pooled requests; "
        f"block bootstrap over time, two-sided t on its standard error")


@dataclass
class TailComparison(TestResult):
    n_subject: int  # the subject's requests in strata where both sides have MIN_PER_SIDE
    n_peers: int
    strata: int
    ratio: float  # p90 ratio, combined over strata
    ratio_ci: tuple[float, float] | None  # None: not bootstrapped (below the screen, or too_few_blocks)
    z: float
    blocks: int
    block_seconds: float
    block_lag1: float  # adjacent blocks' exceedance correlation left (it widens the interval)
    above_peer_quantile: float  # share of the subject's requests above the peers' stratum p90
    too_few_blocks: bool = False  # past the screen, but its requests lie in fewer than MIN_BLOCKS blocks
    quantile: float = QUANTILE

    def __post_init__(self):
        self.test = self.test or TEST
        self.statistic, self.effect, self.interval = self.z, self.ratio, self.ratio_ci
        self.n = self.n_subject + self.n_peers


def quantile_at(sorted_values: np.ndarray, counts: np.ndarray, q: float = QUANTILE) -> np.ndarray:
    """Weibull quantile (position q (W + 1), linear between order statistics, clipped to [1, W]) of
    `sorted_values` repeated `counts` times; counts (R, n) -> (R,), NaN where a row has no weight."""
    cum = np.cumsum(counts, axis=1)
    total = cum[:, -1]
    h = q * (total + 1)
    lo = np.clip(np.floor(h), 1, np.maximum(total, 1))
    hi = np.minimum(lo + 1, np.maximum(total, 1))
    # the k-th order statistic is the first value whose cumulative count reaches k
    x_lo = sorted_values[np.minimum((cum < lo[:, None]).sum(axis=1), len(sorted_values) - 1)]
    x_hi = sorted_values[np.minimum((cum < hi[:, None]).sum(axis=1), len(sorted_values) - 1)]
    frac = np.clip(h - lo, 0.0, 1.0)
    return np.where(total > 0, x_lo + frac * (x_hi - x_lo), np.nan)


def _point(values: np.ndarray) -> float:
    return float(quantile_at(np.sort(values), np.ones((1, len(values))))[0])


def block_seconds(times: np.ndarray) -> float:
    span = float(times.max() - times.min()) if len(times) else 0.0
    return float(np.clip(span / TARGET_BLOCKS, BLOCK_MIN_SECONDS, BLOCK_MAX_SECONDS))


def compare(subject: dict, subject_at: dict, peers: dict, peers_at: dict, floor: float, min_requests: int,
            screen: float | None = None, seed: int = 0) -> TailComparison | None:
    """subject / peers: {stratum: values}, *_at: {stratum: their arrival times (epoch s)}, aligned.
    None when fewer than `min_requests` requests per side fall in strata both sides fill. `screen`:
    bootstrap only when the point ratio reaches it; below it p is 1 and no interval (such a test
    cannot fire, and Holm stays valid with a larger p)."""
    keys = [s for s in subject if s in peers and len(subject[s]) >= MIN_PER_SIDE and len(peers[s]) >= MIN_PER_SIDE]
    n1 = sum(len(subject[s]) for s in keys)
    n2 = sum(len(peers[s]) for s in keys)
    if n1 < min_requests or n2 < min_requests:
        return None
    weights = np.array([len(subject[s]) * len(peers[s]) / (len(subject[s]) + len(peers[s])) for s in keys])
    theirs = {s: _point(peers[s]) for s in keys}
    logs = np.array([np.log(max(_point(subject[s]), floor) / max(theirs[s], floor)) for s in keys])
    effect = float(weights @ logs / weights.sum())
    above = sum(int((subject[s] > theirs[s]).sum()) for s in keys) / n1
    times = np.concatenate([subject_at[s] for s in keys] + [peers_at[s] for s in keys])
    width, t0 = block_seconds(times), float(times.min())
    screened = screen is not None and np.exp(effect) < screen
    rho = 0.0
    if not screened:  # (the adaptation reads every request: only for a test that could fire)
        width, rho, _ = adapted_blocks(subject, subject_at, peers, peers_at, keys, t0, width)
    own_blocks = np.unique(np.concatenate([np.floor((subject_at[s] - t0) / width) for s in keys]))
    base = dict(n_subject=n1, n_peers=n2, strata=len(keys), ratio=float(np.exp(effect)),
                blocks=len(own_blocks), block_seconds=width, block_lag1=rho, above_peer_quantile=float(above))
    if screened or len(own_blocks) < MIN_BLOCKS:
        return TailComparison(ratio_ci=None, z=0.0, p_value=1.0, too_few_blocks=not screened, **base)
    boot = _bootstrap(subject, subject_at, peers, peers_at, keys, weights, floor, t0, width, seed)
    boot = boot[np.isfinite(boot)]
    widen = autocorrelation_inflation(rho)  # what correlation adjacent blocks still have
    se = widen * float(np.std(boot, ddof=1)) if len(boot) > 1 else 0.0
    z = effect / se if se > 0 else (np.copysign(np.inf, effect) if effect else 0.0)
    p = float(2 * stats.t.sf(abs(z), df=len(own_blocks) - 1))
    lo, hi = np.exp(widened_interval(effect, boot, widen)) if len(boot) else (np.nan, np.nan)
    return TailComparison(ratio_ci=(float(lo), float(hi)), z=float(z), p_value=p, **base)


def adapted_blocks(subject, subject_at, peers, peers_at, keys, t0, width) -> tuple[float, float, float]:
    """(block seconds, lag-1 rho, its z): blocks doubled while adjacent blocks' exceedances are
    correlated (z > AUTOCORR_Z) and the subject keeps MIN_BLOCKS of them. The residual of a (block,
    side) cell: its share of requests above the pooled stratum p90, centred on the side's mean (its
    level is the effect under test, not noise); as diagnostics.steps does for step times."""
    at, side, above = [], [], []
    for s in keys:
        threshold = _point(np.concatenate([subject[s], peers[s]]))
        for k, (v, t) in enumerate(((subject[s], subject_at[s]), (peers[s], peers_at[s]))):
            at.append(t)
            side.append(np.full(len(t), k))
            above.append((v > threshold).astype(float))
    at, side, above = np.concatenate(at), np.concatenate(side), np.concatenate(above)
    rho, z = _lag1(at, side, above, t0, width)
    while z > AUTOCORR_Z and len(np.unique(np.floor((at[side == 0] - t0) / (2 * width)))) >= MIN_BLOCKS:
        width *= 2
        rho, z = _lag1(at, side, above, t0, width)
    return width, rho, z


def _lag1(at, side, above, t0, width) -> tuple[float, float]:
    keys, index = np.unique(np.floor((at - t0) / width).astype(np.int64), return_inverse=True)
    cell = index * 2 + side
    n = np.bincount(cell, minlength=2 * len(keys)).reshape(-1, 2)
    hits = np.bincount(cell, weights=above, minlength=2 * len(keys)).reshape(-1, 2)
    ok = n >= MIN_CELL
    e = np.where(ok, hits / np.maximum(n, 1), 0.0)
    e = np.where(ok, e - e.sum(axis=0) / np.maximum(ok.sum(axis=0), 1), 0.0)
    adjacent = (np.diff(keys) == 1)[:, None] & ok[1:] & ok[:-1]
    pairs, den = int(adjacent.sum()), float((e[ok] ** 2).sum())
    if pairs < 2 or den <= 0:
        return 0.0, 0.0
    rho = float((e[1:] * e[:-1])[adjacent].sum()) / den
    return rho, rho * float(np.sqrt(pairs))


def _bootstrap(subject, subject_at, peers, peers_at, keys, weights, floor, t0, width, seed) -> np.ndarray:
    """Log p90 ratios (RESAMPLES,): time blocks drawn with replacement, the same draw for both sides."""
    rng = np.random.default_rng(seed)
    sides = []  # (stratum index, sorted values, their block index)
    for k, s in enumerate(keys):
        for values, at in ((subject[s], subject_at[s]), (peers[s], peers_at[s])):
            if len(values) > PEERS_PER_STRATUM:
                pick = rng.choice(len(values), PEERS_PER_STRATUM, replace=False)
                values, at = values[pick], at[pick]
            order = np.argsort(values)
            sides.append((values[order], np.floor((at[order] - t0) / width).astype(np.int64)))
    blocks, index = np.unique(np.concatenate([b for _, b in sides]), return_inverse=True)
    counts = block_counts(len(blocks), rng)
    bounds = np.cumsum([0] + [len(b) for _, b in sides])
    num = np.zeros(RESAMPLES)
    den = np.zeros(RESAMPLES)
    for k in range(len(keys)):
        q = [np.maximum(quantile_at(sides[j][0], counts[:, index[bounds[j]:bounds[j + 1]]]), floor)
             for j in (2 * k, 2 * k + 1)]
        ok = np.isfinite(q[0]) & np.isfinite(q[1])
        num += np.where(ok, weights[k] * np.log(np.where(ok, q[0] / np.where(ok, q[1], 1.0), 1.0)), 0.0)
        den += np.where(ok, weights[k], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
