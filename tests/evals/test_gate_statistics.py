"""Statistics against published values and independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import log_softmax as sp_log_softmax

from evals.stats import (
    drift_from_positions,
    drift_statistics,
    first_divergence,
    greedy_agreement,
    kl_divergence,
    kl_divergence_topk,
    mcnemar,
    mean_and_se,
    paired_bootstrap,
    wilson_interval,
)


def test_wilson_matches_textbook_values():
    # Newcombe (1998), Statistics in Medicine 17:857, Table I: 81/263 -> 0.2553 to 0.3662
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4) and hi == pytest.approx(0.3662, abs=1e-4)
    # 15/148 -> 0.0624 to 0.1605 (same table)
    lo, hi = wilson_interval(15, 148)
    assert lo == pytest.approx(0.0624, abs=1e-4) and hi == pytest.approx(0.1605, abs=1e-4)


def test_wilson_closed_form_and_edges():
    k, n, z = 7, 20, stats.norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert wilson_interval(k, n) == pytest.approx((centre - half, centre + half), abs=1e-12)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.0 < hi < 0.35  # never the degenerate [0, 0] of the Wald interval
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and lo > 0.65
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_mcnemar_matches_fagerland_example():
    # Fagerland, Lydersen & Laake (2013), BMC Med Res Methodol 13:91: 1 vs 7 discordant pairs ->
    # exact conditional p = 0.070, mid-p = 0.039
    base = [1] * 1 + [0] * 7 + [1] * 30 + [0] * 10  # 1 baseline-only, 7 candidate-only, 40 concordant
    cand = [0] * 1 + [1] * 7 + [1] * 30 + [0] * 10
    r = mcnemar(base, cand)
    assert (r.baseline_only, r.candidate_only, r.n) == (1, 7, 48)
    assert r.p_exact == pytest.approx(0.0703, abs=5e-4)
    assert r.p_mid == pytest.approx(0.0391, abs=5e-4)
    # symmetric in direction, 1 when there are no discordant pairs
    assert mcnemar(cand, base).p_exact == pytest.approx(r.p_exact)
    assert mcnemar([1, 0, 1], [1, 0, 1]).p_mid == 1.0


def test_mcnemar_large_sample_agrees_with_chi_square():
    rng = np.random.default_rng(0)
    a = rng.random(4000) < 0.7
    b = np.where(rng.random(4000) < 0.1, ~a, a)  # 10% of items flip
    r = mcnemar(a, b)
    chi2 = (r.baseline_only - r.candidate_only) ** 2 / r.discordant
    assert r.p_mid == pytest.approx(stats.chi2.sf(chi2, 1), rel=0.05)


def test_paired_bootstrap():
    base = np.array([1] * 80 + [0] * 20)
    same = paired_bootstrap(base, base)
    assert (same.delta, same.ci_low, same.ci_high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    worse = base.copy()
    worse[:30] = 0  # 30 of 80 right answers lost
    r = paired_bootstrap(base, worse, n_resamples=4000, seed=1)
    assert r.delta == pytest.approx(-0.30)
    # the normal approximation of the paired difference's sampling distribution
    d = worse - base
    se = d.std(ddof=1) / np.sqrt(len(d))
    assert r.ci_low == pytest.approx(-0.30 - 1.96 * se, abs=0.02)
    assert r.ci_high == pytest.approx(-0.30 + 1.96 * se, abs=0.02)
    assert r.p_value < 0.001
    assert paired_bootstrap(base, worse, n_resamples=4000, seed=1) == r  # seeded
    with pytest.raises(ValueError):
        paired_bootstrap([1, 0], [1])


def test_kl_matches_scipy_entropy():
    rng = np.random.default_rng(1)
    logits_p, logits_q = rng.normal(size=(5, 50)), rng.normal(size=(5, 50))
    lp, lq = sp_log_softmax(logits_p, -1), sp_log_softmax(logits_q, -1)
    want = [stats.entropy(np.exp(a), np.exp(b)) for a, b in zip(lp, lq)]
    assert kl_divergence(lp, lq) == pytest.approx(want, rel=1e-10)
    assert kl_divergence(lp, lp) == pytest.approx(np.zeros(5), abs=1e-12)


def test_topk_kl_is_a_lower_bound_and_exact_with_the_whole_vocabulary():
    rng = np.random.default_rng(2)
    lp = sp_log_softmax(rng.normal(size=(4, 30)) * 2, -1)
    lq = sp_log_softmax(rng.normal(size=(4, 30)) * 2, -1)
    full = kl_divergence(lp, lq)
    top = np.argsort(-lp, axis=-1)[:, :5]
    rows = np.arange(4)[:, None]
    approx = kl_divergence_topk(lp[rows, top], lq[rows, top])
    assert np.all(approx <= full + 1e-12) and np.all(approx > 0)
    order = np.argsort(-lp, axis=-1)
    assert kl_divergence_topk(lp[rows, order], lq[rows, order]) == pytest.approx(full, rel=1e-9)


def test_mean_and_se_as_llama_cpp():
    x = np.arange(20, dtype=float)
    mean, se = mean_and_se(x)
    assert mean == 9.5
    assert se == pytest.approx(math.sqrt((np.mean(x**2) - 9.5**2) / 19))  # == std(ddof=0) / sqrt(n - 1)
    assert mean_and_se(np.ones(5)) == (1.0, 0.0)


def test_drift_statistics_by_hand():
    # two positions, vocabulary of 3
    p = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]]))
    q = np.log(np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]))
    tokens = [0, 1]
    s = drift_statistics([p], [q], [tokens])
    kl0 = 0.7 * math.log(0.7 / 0.6) + 0.2 * math.log(0.2 / 0.3)
    kl1 = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / 0.3)
    assert s.positions == 2
    assert s.kl_mean == pytest.approx((kl0 + kl1) / 2)
    assert s.kl_max == pytest.approx(max(kl0, kl1))
    assert s.same_top_p == 0.5  # position 0 agrees (token 0), position 1 does not (0 vs 1)
    assert s.delta_p_mean == pytest.approx(((0.6 - 0.7) + (0.5 - 0.3)) / 2)
    assert s.delta_p_rms == pytest.approx(math.sqrt((0.1**2 + 0.2**2) / 2))


def test_drift_percentiles_and_standard_errors():
    kl = np.linspace(0, 1, 101)
    same = np.array([1] * 90 + [0] * 11)
    s = drift_from_positions(kl, same, np.zeros(101))
    assert s.kl_median == pytest.approx(0.5)
    assert s.kl_p99 == pytest.approx(0.99)
    assert s.same_top_p == pytest.approx(90 / 101)
    assert s.same_top_p_se == pytest.approx(math.sqrt((90 / 101) * (11 / 101) / 100))
    with pytest.raises(ValueError):
        drift_from_positions(np.array([]), np.array([]), np.array([]))


def test_greedy_agreement_and_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    g = greedy_agreement([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 6], [7]])
    assert (g.items, g.identical, g.divergence_positions) == (3, 1, [1, 0])
    assert g.agreement == pytest.approx(1 / 3)
    assert g.median_first_divergence == 0.5 and g.min_first_divergence == 0
    with pytest.raises(ValueError):
        greedy_agreement([[1]], [])
