"""The statistics: they find real effects, stay quiet on none, and refuse to guess on too little."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from evals.stats import (
    DELTA_SMALL,
    ClusterSums,
    change_points,
    chi_square_homogeneity,
    compare_ratios,
    compare_samples,
    holm,
    ratio_homogeneity,
    robust_z,
    two_proportions,
    van_elteren,
)


def lognormal(n, median, seed, spread=0.3):
    return np.random.default_rng(seed).lognormal(np.log(median), spread, n)


def test_a_30_percent_slowdown_is_significant_with_its_ratio_in_the_interval():
    c = compare_samples(lognormal(400, 0.1, 1), lognormal(400, 0.13, 2))
    assert c.mwu_p < 1e-6 and c.ks_p < 1e-6 and c.cliffs_delta > DELTA_SMALL
    assert c.ratio_ci[0] < 1.3 < c.ratio_ci[1] and c.ratio_ci[0] > 1.1
    assert c.difference_ci[0] > 0


def test_the_same_distribution_is_not_flagged():
    c = compare_samples(lognormal(400, 0.1, 3), lognormal(400, 0.1, 4))
    assert c.p_value > 0.01 and abs(c.cliffs_delta) < DELTA_SMALL
    assert c.ratio_ci[0] < 1 < c.ratio_ci[1]


def test_too_few_samples_is_none_not_a_guess():
    assert compare_samples(lognormal(10, 0.1, 5), lognormal(400, 0.2, 6)) is None
    assert compare_samples([np.nan] * 50, lognormal(50, 0.2, 6)) is None


def test_zero_median_baseline_has_no_ratio_but_a_difference():
    c = compare_samples(np.zeros(50), np.full(50, 0.01), bootstrap=True)
    assert c.ratio is None and c.ratio_ci is None and c.difference == pytest.approx(0.01)
    assert c.cliffs_delta == 1.0


def test_cliffs_delta_sign_follows_the_candidate():
    a, b = lognormal(200, 0.1, 7), lognormal(200, 0.2, 8)
    assert compare_samples(a, b, bootstrap=False).cliffs_delta > 0.5
    assert compare_samples(b, a, bootstrap=False).cliffs_delta < -0.5


def test_holm_keeps_order_and_bounds():
    adjusted = holm([0.01, 0.04, 0.03, 0.5])
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_change_point_found_where_the_level_shifts_and_none_in_noise():
    rng = np.random.default_rng(0)
    series = np.r_[rng.normal(0, 0.05, 60), rng.normal(0.4, 0.05, 40)]
    cps = change_points(series)
    assert len(cps) == 1 and abs(cps[0] - 60) <= 2
    assert change_points(rng.normal(0, 0.05, 100)) == []


def test_two_proportions_and_chi_square():
    t = two_proportions(800, 1000, 600, 1000)
    assert t.difference == pytest.approx(-0.2) and t.p_value < 1e-10
    assert two_proportions(50, 100, 50, 100).p_value == pytest.approx(1.0)
    p = chi_square_homogeneity([80, 79, 50], [100, 100, 100]).p_value
    assert p < 1e-4
    assert chi_square_homogeneity([5], [10]) is None


def test_robust_z_names_the_outlier_even_among_near_identical_peers():
    z, med, _ = robust_z({"a": 1.0, "b": 1.01, "c": 0.99, "d": 2.0})
    assert z["d"] > 10 and abs(z["a"]) < 1


# -- ratios over clusters --------------------------------------------------------------------------

def clusters(rng, n, trials, alpha, beta):
    """n clusters of `trials` each; each cluster's rate ~ Beta(alpha, beta) (overdispersed when alpha+beta is small)."""
    q = rng.beta(alpha, beta, n)
    return rng.binomial(trials, q), np.full(n, trials)


def test_cluster_variance_matches_the_spread_of_the_rate_under_overdispersion():
    rng = np.random.default_rng(0)
    rates, predicted = [], []
    for _ in range(400):
        s = ClusterSums.of(*clusters(rng, 50, 40, 2, 2))
        rates.append(s.rate)
        predicted.append(s.variance)
    observed_var = np.var(rates)
    assert 0.8 < np.mean(predicted) / observed_var < 1.25
    binomial = 0.5 * 0.5 / (50 * 40)
    assert observed_var / binomial > 5  # what a token-level test would have assumed, ~8x too small
    assert ClusterSums.of(*clusters(rng, 200, 40, 2, 2)).design_effect > 5
    assert 0.7 < ClusterSums.of(*clusters(rng, 200, 40, 2000, 2000)).design_effect < 1.4


def test_cluster_sums_pool_by_adding():
    rng = np.random.default_rng(1)
    (a1, p1), (a2, p2) = clusters(rng, 30, 10, 2, 3), clusters(rng, 20, 15, 2, 3)
    pooled = ClusterSums.of(a1, p1) + ClusterSums.of(a2, p2)
    direct = ClusterSums.of(np.r_[a1, a2], np.r_[p1, p2])
    assert pooled.n == 50 and pooled.rate == pytest.approx(direct.rate)
    assert pooled.variance == pytest.approx(direct.variance)


def test_compare_ratios_standardises_the_mix_and_covers_the_truth():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(200):  # same per-stratum rates; b has 4x the share of the low stratum
        base = {"hi": ClusterSums.of(*clusters(rng, 80, 10, 60, 40)),
                "lo": ClusterSums.of(*clusters(rng, 20, 10, 20, 80))}
        cand = {"hi": ClusterSums.of(*clusters(rng, 20, 10, 60, 40)),
                "lo": ClusterSums.of(*clusters(rng, 80, 10, 20, 80))}
        c = compare_ratios(base, cand, confidence=0.95)
        hits += c.difference_ci[0] <= 0 <= c.difference_ci[1] and c.relative_ci[0] <= 0 <= c.relative_ci[1]
    assert hits >= 180  # ~95% coverage of "no difference"
    merged = compare_ratios({"all": base["hi"] + base["lo"]}, {"all": cand["hi"] + cand["lo"]})
    assert merged.relative < -0.3 and merged.p_value < 1e-6  # unstratified, the mix reads as a drop
    assert compare_ratios({"x": base["hi"]}, {"y": cand["hi"]}) is None  # nothing shared


def test_compare_ratios_finds_a_relative_drop_with_its_interval():
    rng = np.random.default_rng(3)
    base = {"w": ClusterSums.of(*clusters(rng, 400, 10, 10, 90))}  # 10%
    cand = {"w": ClusterSums.of(*clusters(rng, 400, 10, 7, 93))}  # 7%
    c = compare_ratios(base, cand, confidence=0.99)
    assert c.p_value < 0.01 and c.relative_ci[1] < 0 and c.relative_ci[0] < -0.3 < c.relative_ci[1]


def test_ratio_homogeneity_is_cluster_robust():
    rng = np.random.default_rng(4)
    same = [ClusterSums.of(*clusters(rng, 40, 50, 2, 2)) for _ in range(5)]
    p = ratio_homogeneity(same).p_value
    assert p > 0.01
    tokens = chi_square_homogeneity([int(s.a) for s in same], [int(s.p) for s in same])
    assert tokens.p_value < p  # treating tokens as independent overstates the evidence
    differ = same[:4] + [ClusterSums.of(*clusters(rng, 40, 50, 1, 4))]
    assert ratio_homogeneity(differ).p_value < 1e-4
    assert ratio_homogeneity(same[:1]) is None


def test_van_elteren_with_one_stratum_is_the_tie_corrected_mann_whitney():
    rng = np.random.default_rng(0)
    x, y = np.round(rng.normal(0.5, 1, 40)), np.round(rng.normal(0, 1, 60))  # many ties
    p = van_elteren([(x, y)]).p_value
    assert abs(p - stats.mannwhitneyu(x, y, method="asymptotic", use_continuity=False).pvalue) < 1e-12


def test_van_elteren_one_stratum_is_mann_whitney():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.3, 1, 40), rng.normal(0, 1, 60)
    test = van_elteren([(a, b)])
    z, p = test.statistic, test.p_value
    ref = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=False)
    assert p == pytest.approx(ref.pvalue, rel=1e-6) and z > 0
