"""Ratios of sums over clusters (accepted / proposed draft tokens over requests or time blocks): the
ratio estimator with its delta-method cluster variance, n/(n-1) * sum_i (a_i - r p_i)^2 / P^2, computed
from per-group sufficient sums (n, A, P, sum a^2, sum a p, sum p^2) so that ClickHouse can aggregate them
and groups can be pooled by adding; a workload-stratified (directly standardised) comparison of two such
ratios; a cluster-robust Wald test of homogeneity; and how much wider an interval over time blocks must
be for the correlation adjacent blocks keep."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from evals.stats.result import TestResult


@dataclass
class ClusterSums:
    """Sufficient sums of one group's clusters: a_i successes of p_i trials in cluster i."""

    n: int = 0  # clusters
    a: float = 0.0
    p: float = 0.0
    aa: float = 0.0
    ap: float = 0.0
    pp: float = 0.0

    def __add__(self, other: "ClusterSums") -> "ClusterSums":
        return ClusterSums(self.n + other.n, self.a + other.a, self.p + other.p, self.aa + other.aa,
                           self.ap + other.ap, self.pp + other.pp)

    @classmethod
    def of(cls, a, p) -> "ClusterSums":
        a, p = np.asarray(a, float), np.asarray(p, float)
        return cls(len(a), float(a.sum()), float(p.sum()), float((a * a).sum()), float((a * p).sum()),
                   float((p * p).sum()))

    @property
    def rate(self) -> float:
        return self.a / self.p if self.p > 0 else float("nan")

    @property
    def variance(self) -> float:
        """Delta-method (linearisation) variance of a/p with the cluster as the unit; nan below 2 clusters."""
        if self.n < 2 or self.p <= 0:
            return float("nan")
        r = self.rate
        ss = max(self.aa - 2 * r * self.ap + r * r * self.pp, 0.0)  # sum_i (a_i - r p_i)^2
        return self.n / (self.n - 1) * ss / self.p**2

    @property
    def design_effect(self) -> float:
        """Cluster variance over the binomial variance that treats every trial as independent."""
        r = self.rate
        binomial = r * (1 - r) / self.p if self.p > 0 else float("nan")
        return self.variance / binomial if binomial > 0 else float("nan")


@dataclass
class RatioComparison(TestResult):
    """Candidate against baseline rate, standardised to a common workload mix; positive = candidate higher."""

    rate_baseline: float
    rate_candidate: float
    difference: float  # candidate - baseline (absolute, rate units)
    difference_ci: tuple[float, float]
    relative: float | None  # candidate / baseline - 1 (None when the baseline rate is 0)
    relative_ci: tuple[float, float] | None
    p_difference: float  # Wald z on the difference
    p_relative: float  # Wald z on log(candidate / baseline)
    clusters_baseline: int
    clusters_candidate: int
    strata: list[dict]

    def __post_init__(self):
        self.test = self.test or "stratified ratio estimator, delta-method cluster variance, Wald z (two-sided)"
        # one null (equal rates), two statistics: the larger p-value, so both must agree
        self.p_value = max(self.p_difference, self.p_relative)
        self.effect, self.interval = self.relative, self.relative_ci
        self.n = self.clusters_baseline + self.clusters_candidate


def _wald_p(estimate: float, se: float) -> float:
    if not se > 0:  # no variance between clusters: only an exact zero is no difference
        return 1.0 if estimate == 0 else 0.0
    return float(2 * stats.norm.sf(abs(estimate) / se))


def compare_ratios(base: dict[str, ClusterSums], cand: dict[str, ClusterSums], *, min_clusters: int = 2,
                   confidence: float = 0.99) -> RatioComparison | None:
    """Compare a/p between two groups within strata (e.g. workloads) present on both sides with
    `min_clusters`+ clusters each, weighting each stratum by its pooled trials (direct standardisation),
    so that a group that saw more of a low-rate stratum is not called lower. None when no stratum is shared."""
    shared = [k for k in sorted(set(base) & set(cand)) if min(base[k].n, cand[k].n) >= max(2, min_clusters)
              and base[k].p > 0 and cand[k].p > 0]
    if not shared:
        return None
    total = sum(base[k].p + cand[k].p for k in shared)
    rb = rc = vb = vc = 0.0
    rows = []
    for k in shared:
        w = (base[k].p + cand[k].p) / total
        rb += w * base[k].rate
        rc += w * cand[k].rate
        vb += w * w * base[k].variance
        vc += w * w * cand[k].variance
        rows.append({"stratum": k, "weight": w, "rate_baseline": base[k].rate, "rate_candidate": cand[k].rate,
                     "clusters_baseline": base[k].n, "clusters_candidate": cand[k].n})
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    diff, se_diff = rc - rb, math.sqrt(vb + vc)
    p_diff = _wald_p(diff, se_diff)
    if rb > 0 and rc > 0:
        log_ratio = math.log(rc / rb)
        se_log = math.sqrt(vc / rc**2 + vb / rb**2)
        p_rel = _wald_p(log_ratio, se_log)
        rel_ci = (math.exp(log_ratio - z * se_log) - 1, math.exp(log_ratio + z * se_log) - 1)
    else:  # a zero rate: the log ratio is undefined, the difference test decides alone
        p_rel, rel_ci = p_diff, ((-1.0, -1.0) if rb > 0 else None)
    return RatioComparison(rb, rc, diff, (diff - z * se_diff, diff + z * se_diff),
                           (rc / rb - 1) if rb > 0 else None, rel_ci, p_diff, p_rel,
                           sum(base[k].n for k in shared), sum(cand[k].n for k in shared), rows)


def ratio_homogeneity(groups: list[ClusterSums]) -> TestResult | None:
    """Cluster-robust Wald test that several groups share one rate: sum (r_g - r_bar)^2 / var_g against
    chi-square with g - 1 degrees of freedom (r_bar the inverse-variance weighted mean)."""
    usable = [g for g in groups if g.n >= 2 and g.p > 0 and g.variance > 0]
    if len(usable) < 2:
        return None
    r = np.array([g.rate for g in usable])
    w = 1 / np.array([g.variance for g in usable])
    r_bar = float((w * r).sum() / w.sum())
    stat = float((w * (r - r_bar) ** 2).sum())
    return TestResult(test="cluster-robust Wald test of one rate (chi-square)", statistic=stat,
                      p_value=float(stats.chi2.sf(stat, len(usable) - 1)), n=sum(g.n for g in usable))


AUTOCORR_MAX_RHO = 0.9  # the widening's cap: a correlation near 1 would make any interval infinite


def autocorrelation_inflation(rho: float) -> float:
    """How much wider a block bootstrap's spread must be for what correlation adjacent blocks still have:
    sqrt((1 + rho) / (1 - rho)), an AR(1)'s variance of a mean over independent-looking blocks
    (1 when they are uncorrelated or anti-correlated; rho capped at AUTOCORR_MAX_RHO)."""
    r = min(max(rho, 0.0), AUTOCORR_MAX_RHO)
    return float(np.sqrt((1 + r) / (1 - r)))
