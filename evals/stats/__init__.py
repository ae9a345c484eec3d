"""The statistics every rule decides with, written once: the bootstrap (plain, paired, stratified,
block / cluster; one resample count, `bootstrap.RESAMPLES`), rank tests (Mann-Whitney with
Kolmogorov-Smirnov, van Elteren, Wilcoxon signed-rank), Holm, counts (Wilson, McNemar, two proportions,
chi-square, Cochran-Mantel-Haenszel), ratios over clusters, change points, and what the eval gate reads
of two models (logit drift as llama.cpp reports it, greedy agreement). Every test returns a
`TestResult` (statistic, p_value, effect, interval, n), the one shape Holm and the evidence read.
scipy and ruptures do the work wherever they provide it.

It lives in `evals` because the eval gate and the diagnostics both decide with it, and the layer order
(telemetry, engine, evals, diagnostics) lets only a package at or below evals serve both.
"""

from evals.stats.agreement import GreedyAgreement, first_divergence, greedy_agreement
from evals.stats.bootstrap import (
    CONFIDENCE,
    RESAMPLES,
    BootstrapResult,
    block_counts,
    mean_interval,
    paired_bootstrap,
    percentile_interval,
    resampled_means,
    widened_interval,
)
from evals.stats.clusters import (
    ClusterSums,
    RatioComparison,
    autocorrelation_inflation,
    compare_ratios,
    ratio_homogeneity,
)
from evals.stats.drift import (
    DriftStats,
    drift_from_positions,
    drift_statistics,
    kl_divergence,
    kl_divergence_topk,
    log_softmax,
    mean_and_se,
)
from evals.stats.multiple import holm
from evals.stats.proportions import (
    McNemarResult,
    ProportionTest,
    chi_square_homogeneity,
    cmh_greater,
    mcnemar,
    two_proportions,
    wilson_interval,
)
from evals.stats.ranks import (
    DELTA_LARGE,
    DELTA_MEDIUM,
    DELTA_SMALL,
    MIN_SAMPLES,
    Comparison,
    compare_samples,
    magnitude,
    signed_rank_greater,
    van_elteren,
)
from evals.stats.result import TestResult
from evals.stats.series import change_points, noise_sigma, robust_z
from evals.stats.stratified import StratifiedComparison, standardized_difference

__all__ = [
    "GreedyAgreement", "first_divergence", "greedy_agreement", "DriftStats", "drift_from_positions",
    "drift_statistics", "kl_divergence", "kl_divergence_topk", "log_softmax", "mean_and_se",
    "CONFIDENCE", "RESAMPLES", "BootstrapResult", "block_counts", "mean_interval", "paired_bootstrap",
    "percentile_interval", "resampled_means", "widened_interval", "ClusterSums", "RatioComparison",
    "autocorrelation_inflation", "compare_ratios", "ratio_homogeneity", "holm", "McNemarResult", "ProportionTest",
    "chi_square_homogeneity", "cmh_greater", "mcnemar", "two_proportions", "wilson_interval", "DELTA_LARGE",
    "DELTA_MEDIUM", "DELTA_SMALL", "MIN_SAMPLES", "Comparison", "compare_samples", "magnitude",
    "signed_rank_greater", "van_elteren", "TestResult", "change_points", "noise_sigma", "robust_z",
    "StratifiedComparison", "standardized_difference",
]
