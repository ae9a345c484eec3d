"""Drift of a candidate model from a baseline at the same teacher-forced positions, as llama.cpp's
perplexity tool reports it in its KL-divergence mode: mean KL divergence with its standard error, median /
p99 / max KL, "same top p" (how often both put the same token first) with its standard error, and Δp
(candidate minus baseline probability of the token actually in the text). Uncertainties follow llama.cpp:
the standard error of a mean is sqrt(var / (n - 1)), of a proportion sqrt(p (1 - p) / (n - 1));
percentiles interpolate linearly between sorted values."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy.special import logsumexp


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
