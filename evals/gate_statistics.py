"""The statistics an eval gate decides with.

Accuracy: Wilson score intervals (scipy's binomtest), McNemar's exact and
mid-p tests and a paired bootstrap on per-item correctness of two runs over the
same items.

Drift: what llama.cpp's perplexity tool reports in its KL-divergence mode,
given the baseline's and the candidate's next-token log-probabilities at the
same teacher-forced positions: mean KL divergence with its standard error,
median / p99 / max KL, "same top p" (how often both put the same token first)
with its standard error, and Δp (candidate minus baseline probability of the
token actually in the text). Uncertainties follow llama.cpp: the standard error
of a mean is sqrt(var / (n - 1)), of a proportion sqrt(p (1 - p) / (n - 1));
percentiles interpolate linearly between sorted values.
Plus greedy-output agreement and where two outputs first diverge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats
from scipy.special import logsumexp

# ---------------------------------------------------------------- accuracy

def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there are no trials."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass
class McNemarResult:
    n: int  # paired items
    baseline_only: int  # b: baseline right, candidate wrong
    candidate_only: int  # c: candidate right, baseline wrong
    p_exact: float  # two-sided exact conditional (binomial) p-value
    p_mid: float  # two-sided mid-p (less conservative, Fagerland et al. 2013)

    @property
    def discordant(self) -> int:
        return self.baseline_only + self.candidate_only


def _paired(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and the same length, got {a.shape} and {b.shape}")
    return a, b


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
class BootstrapResult:
    delta: float  # mean(candidate) - mean(baseline)
    ci_low: float
    ci_high: float
    p_value: float  # two-sided: how often a resample's delta lands on the other side of 0, doubled
    n_resamples: int


def paired_bootstrap(baseline: Sequence[float], candidate: Sequence[float], n_resamples: int = 10000,
                     confidence: float = 0.95, seed: int = 0) -> BootstrapResult:
    """Percentile bootstrap of the accuracy difference, resampling items (pairs stay together)."""
    a, b = _paired(baseline, candidate)
    if len(a) == 0:
        raise ValueError("paired bootstrap needs at least one item")
    diff = b - a
    delta = float(diff.mean())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n_resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    if delta == 0 and np.all(means == 0):
        p = 1.0
    else:
        p = min(1.0, 2.0 * min(np.mean(means <= 0), np.mean(means >= 0)))
    return BootstrapResult(delta, float(low), float(high), float(p), n_resamples)


# ---------------------------------------------------------------- drift

def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error as llama.cpp computes them (0 below 11 values)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = float(np.mean(values))
    var = float(np.mean(values**2) - mean**2)
    return mean, (math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    return logits - logsumexp(logits, axis=-1, keepdims=True)


def kl_divergence(base_logprobs: np.ndarray, cand_logprobs: np.ndarray) -> np.ndarray:
    """KL(base || candidate) per position, from full-vocabulary log-probabilities [T, V]."""
    p = np.asarray(base_logprobs, dtype=np.float64)
    q = np.asarray(cand_logprobs, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"log-prob arrays differ in shape: {p.shape} vs {q.shape}")
    # positions where base has p=0 contribute nothing (0 * log 0 = 0)
    return np.sum(np.where(np.isfinite(p), np.exp(p) * (p - q), 0.0), axis=-1)


def kl_divergence_topk(base_top_logprobs: np.ndarray, cand_logprobs_at_top: np.ndarray) -> np.ndarray:
    """KL(base || candidate) from the baseline's top-k only, the rest pooled in one bucket.

    `base_top_logprobs[T, k]` are the baseline's top-k log-probs and
    `cand_logprobs_at_top[T, k]` the candidate's log-probs of those same tokens.
    Pooling can only lose information, so this is a lower bound of the full KL.
    """
    p = np.exp(np.asarray(base_top_logprobs, dtype=np.float64))
    q = np.exp(np.asarray(cand_logprobs_at_top, dtype=np.float64))
    p_rest = np.clip(1.0 - p.sum(-1), 0.0, 1.0)
    q_rest = np.clip(1.0 - q.sum(-1), 1e-12, 1.0)
    kl = np.sum(p * (np.log(p) - np.log(q)), axis=-1)
    return kl + np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0.0)


@dataclass
class DriftStats:
    """llama.cpp-style drift of a candidate from a baseline over teacher-forced positions."""

    positions: int
    kl_mean: float
    kl_mean_se: float
    kl_median: float
    kl_p99: float
    kl_max: float
    same_top_p: float  # fraction of positions where both models' top token agree
    same_top_p_se: float
    delta_p_mean: float  # mean of p_candidate(token) - p_baseline(token)
    delta_p_mean_se: float
    delta_p_rms: float
    kl_is_lower_bound: bool = False  # True when computed from top-k log-probs only

    def to_dict(self) -> dict:
        return asdict(self)


def drift_from_positions(kl: np.ndarray, same_top: np.ndarray, delta_p: np.ndarray,
                         kl_is_lower_bound: bool = False) -> DriftStats:
    """Summarise per-position KL, top-1 agreement and Δp (all 1-D, one entry per position)."""
    kl, same_top, delta_p = (np.asarray(x, dtype=np.float64).ravel() for x in (kl, same_top, delta_p))
    n = len(kl)
    if n == 0:
        raise ValueError("no positions to compare")
    kl_mean, kl_se = mean_and_se(kl)
    dp_mean, dp_se = mean_and_se(delta_p)
    same = float(np.mean(same_top))
    same_se = math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0
    return DriftStats(
        positions=n, kl_mean=kl_mean, kl_mean_se=kl_se, kl_median=float(np.median(kl)),
        kl_p99=float(np.quantile(kl, 0.99)), kl_max=float(np.max(kl)), same_top_p=same, same_top_p_se=same_se,
        delta_p_mean=dp_mean, delta_p_mean_se=dp_se, delta_p_rms=float(np.sqrt(np.mean(delta_p**2))),
        kl_is_lower_bound=kl_is_lower_bound,
    )


def drift_statistics(base_logprobs: Sequence[np.ndarray], cand_logprobs: Sequence[np.ndarray],
                     tokens: Sequence[Sequence[int]]) -> DriftStats:
    """Drift from full-vocabulary log-probs: per sequence arrays [T_i, V] and the T_i tokens in the text.

    Row t of each array is the distribution that predicts tokens[t].
    """
    if not (len(base_logprobs) == len(cand_logprobs) == len(tokens)):
        raise ValueError("need the same number of baseline, candidate and token sequences")
    kls, same, dps = [], [], []
    for p, q, tok in zip(base_logprobs, cand_logprobs, tokens):
        p = np.asarray(p, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        tok = np.asarray(tok, dtype=np.int64)
        if p.shape != q.shape or p.shape[0] != len(tok):
            raise ValueError(f"shapes disagree: baseline {p.shape}, candidate {q.shape}, {len(tok)} tokens")
        if len(tok) == 0:
            continue
        rows = np.arange(len(tok))
        kls.append(kl_divergence(p, q))
        same.append(p.argmax(-1) == q.argmax(-1))
        dps.append(np.exp(q[rows, tok]) - np.exp(p[rows, tok]))
    return drift_from_positions(np.concatenate(kls), np.concatenate(same), np.concatenate(dps))


# ---------------------------------------------------------------- greedy outputs

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
