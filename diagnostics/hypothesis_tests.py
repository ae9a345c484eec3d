"""The statistics diagnostics decide with (scipy and ruptures; nothing hand-rolled that they provide).

- Two samples (latencies of a baseline and a candidate): Mann-Whitney U together with
  Kolmogorov-Smirnov (as Chromium's Pinpoint does), Cliff's delta from U, and the ratio and the
  difference of the medians with percentile bootstrap confidence intervals (scipy.stats.bootstrap).
- Too few samples: `None` from the comparison, which the diagnostics turn into an explicit
  "insufficient data" finding rather than a guess.
- Change points in a series (ruptures: PELT on a least-squares cost, penalty from the noise level).
- Proportions: two-proportion z test, chi-square of homogeneity (tokens as the unit: only where
  tokens really are independent).
- Ratios of sums over clusters (accepted / proposed draft tokens over requests or time blocks):
  the ratio estimator with its delta-method cluster variance, n/(n-1) * sum_i (a_i - r p_i)^2 / P^2,
  computed from per-group sufficient sums (n, A, P, sum a^2, sum a p, sum p^2) so that ClickHouse
  can aggregate them and groups can be pooled by adding; a workload-stratified (directly
  standardised) comparison of two such ratios; a cluster-robust Wald test of homogeneity.
- Robust outliers: median and MAD.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

MIN_SAMPLES = 20  # below this a two-sample test is not worth reporting
BOOTSTRAP_MAX = 1000  # per side: larger samples are subsampled for the interval (a wider, honest CI)
EXACT_KS_MAX = 10_000  # n_a * n_b up to which Kolmogorov-Smirnov is exact (beyond: asymptotic, far cheaper)
# Cliff's delta magnitudes (Romano et al. 2006): negligible < 0.147 <= small < 0.33 <= medium < 0.474 <= large
DELTA_SMALL, DELTA_MEDIUM, DELTA_LARGE = 0.147, 0.33, 0.474


@dataclass
class Comparison:
    """Candidate against baseline; positive delta / ratio > 1 mean the candidate's values are larger."""

    n_baseline: int
    n_candidate: int
    median_baseline: float
    median_candidate: float
    ratio: float | None  # median_candidate / median_baseline (None when the baseline median is 0)
    ratio_ci: tuple[float, float] | None
    difference: float  # median_candidate - median_baseline
    difference_ci: tuple[float, float] | None
    cliffs_delta: float  # P(candidate > baseline) - P(candidate < baseline)
    mwu_u: float
    mwu_p: float
    ks_stat: float
    ks_p: float
    test: str = "Mann-Whitney U + Kolmogorov-Smirnov (two-sided)"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def p_value(self) -> float:
        """Both tests must agree: the larger of the two p-values."""
        return max(self.mwu_p, self.ks_p)


def _clean(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def _median_stats(base, cand, axis=-1):
    mb, mc = np.median(base, axis=axis), np.median(cand, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mb > 0, mc / np.where(mb > 0, mb, 1.0), np.nan)
    return np.stack([ratio, mc - mb], axis=0)


def compare_samples(baseline, candidate, *, bootstrap: bool = True, n_resamples: int = 999,
                    confidence: float = 0.95, seed: int = 0, min_samples: int = MIN_SAMPLES) -> Comparison | None:
    """Compare two samples; None when either has fewer than `min_samples` finite values."""
    a, b = _clean(baseline), _clean(candidate)
    if len(a) < min_samples or len(b) < min_samples:
        return None
    ma, mb = float(np.median(a)), float(np.median(b))
    if np.all(a == a[0]) and np.all(b == a[0]):  # identical constants: no test can say anything
        u, p_u, ks, p_ks = len(a) * len(b) / 2.0, 1.0, 0.0, 1.0
    else:
        mwu = stats.mannwhitneyu(b, a, alternative="two-sided", method="asymptotic")
        ks_result = stats.ks_2samp(a, b, method="exact" if len(a) * len(b) <= EXACT_KS_MAX else "asymp")
        u, p_u, ks, p_ks = float(mwu.statistic), float(mwu.pvalue), float(ks_result.statistic), float(ks_result.pvalue)
    delta = 2.0 * u / (len(a) * len(b)) - 1.0
    ratio = mb / ma if ma > 0 else None
    ratio_ci = diff_ci = None
    if bootstrap:
        rng = np.random.default_rng(seed)
        sa = a if len(a) <= BOOTSTRAP_MAX else rng.choice(a, BOOTSTRAP_MAX, replace=False)
        sb = b if len(b) <= BOOTSTRAP_MAX else rng.choice(b, BOOTSTRAP_MAX, replace=False)
        with warnings.catch_warnings():  # constant samples give a degenerate (point) interval: that is fine
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            res = stats.bootstrap((sa, sb), _median_stats, vectorized=True, paired=False, n_resamples=n_resamples,
                                  confidence_level=confidence, method="percentile", rng=rng)
        low, high = res.confidence_interval
        if ratio is not None and np.isfinite(low[0]) and np.isfinite(high[0]):
            ratio_ci = (float(low[0]), float(high[0]))
        diff_ci = (float(low[1]), float(high[1]))
    return Comparison(len(a), len(b), ma, mb, ratio, ratio_ci, mb - ma, diff_ci, delta, u, p_u, ks, p_ks)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error over many strata and metrics)."""
    m = len(p_values)
    order = np.argsort(p_values)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted.tolist()


def magnitude(delta: float) -> str:
    d = abs(delta)
    return ("negligible" if d < DELTA_SMALL else "small" if d < DELTA_MEDIUM else
            "medium" if d < DELTA_LARGE else "large")


# -- change points --------------------------------------------------------------------------------

def noise_sigma(series: np.ndarray) -> float:
    """Noise level of a series from its first differences (robust to the level shifts themselves)."""
    d = np.diff(series)
    if len(d) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def change_points(series, min_size: int = 3, penalty_scale: float = 3.0) -> list[int]:
    """Indices where a new level starts (PELT, l2 cost, penalty = scale * sigma^2 * log n)."""
    import ruptures as rpt

    x = _clean(series)
    n = len(x)
    if n < 2 * min_size:
        return []
    sigma = noise_sigma(x)
    if sigma <= 0:
        sigma = float(np.std(x)) or 1e-9
    penalty = penalty_scale * sigma**2 * math.log(n)
    # KernelCPD with a linear kernel is PELT on the l2 cost, in C (ruptures' Pelt is pure Python)
    breaks = rpt.KernelCPD(kernel="linear", min_size=min_size).fit(x.reshape(-1, 1)).predict(pen=penalty)
    return [int(b) for b in breaks if b < n]


# -- proportions ----------------------------------------------------------------------------------

@dataclass
class ProportionTest:
    successes_a: int
    n_a: int
    successes_b: int
    n_b: int
    rate_a: float
    rate_b: float
    difference: float  # rate_b - rate_a
    z: float
    p_value: float
    test: str = "two-proportion z test (pooled, two-sided)"

    def to_dict(self) -> dict:
        return asdict(self)


def two_proportions(successes_a: int, n_a: int, successes_b: int, n_b: int) -> ProportionTest | None:
    if n_a <= 0 or n_b <= 0:
        return None
    ra, rb = successes_a / n_a, successes_b / n_b
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        z, p = 0.0, 1.0
    else:
        z = (rb - ra) / se
        p = float(2 * stats.norm.sf(abs(z)))
    return ProportionTest(int(successes_a), int(n_a), int(successes_b), int(n_b), ra, rb, rb - ra, z, p)


def chi_square_homogeneity(successes: list[int], totals: list[int]) -> tuple[float, float] | None:
    """Chi-square test that several groups share one success rate: (statistic, p)."""
    table = np.array([[s, t - s] for s, t in zip(successes, totals) if t > 0], dtype=float)
    if len(table) < 2 or (table.sum(axis=0) == 0).any():
        return None
    res = stats.chi2_contingency(table, correction=False)
    return float(res.statistic), float(res.pvalue)


# -- robust outliers ------------------------------------------------------------------------------

def robust_z(values: dict[str, float], floor_fraction: float = 0.05) -> tuple[dict[str, float], float, float]:
    """Robust z-scores (value - median) / (1.4826 MAD) per key, with the MAD floored at
    `floor_fraction` of the median so that near-identical peers do not make any wobble an outlier."""
    v = np.array(list(values.values()), dtype=float)
    med = float(np.median(v))
    mad = float(np.median(np.abs(v - med))) * 1.4826
    scale = max(mad, floor_fraction * abs(med), 1e-12)
    return {k: (x - med) / scale for k, x in values.items()}, med, mad


# -- ratios over clusters (requests or time blocks as the unit) --------------------------------------

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
class RatioComparison:
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
    test: str = "stratified ratio estimator, delta-method cluster variance, Wald z (two-sided)"

    @property
    def p_value(self) -> float:
        """One null (equal rates), two statistics: the larger p-value, so both must agree."""
        return max(self.p_difference, self.p_relative)

    def to_dict(self) -> dict:
        return {**asdict(self), "p_value": self.p_value}


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


def ratio_homogeneity(groups: list[ClusterSums]) -> tuple[float, float] | None:
    """Cluster-robust Wald test that several groups share one rate: sum (r_g - r_bar)^2 / var_g against
    chi-square with g - 1 degrees of freedom (r_bar the inverse-variance weighted mean): (statistic, p)."""
    usable = [g for g in groups if g.n >= 2 and g.p > 0 and g.variance > 0]
    if len(usable) < 2:
        return None
    r = np.array([g.rate for g in usable])
    w = 1 / np.array([g.variance for g in usable])
    r_bar = float((w * r).sum() / w.sum())
    stat = float((w * (r - r_bar) ** 2).sum())
    return stat, float(stats.chi2.sf(stat, len(usable) - 1))


AUTOCORR_MAX_RHO = 0.9  # the widening's cap: a correlation near 1 would make any interval infinite


def autocorrelation_inflation(rho: float) -> float:
    """How much wider a block bootstrap's spread must be for what correlation adjacent blocks still have:
    sqrt((1 + rho) / (1 - rho)), an AR(1)'s variance of a mean over independent-looking blocks
    (1 when they are uncorrelated or anti-correlated; rho capped at AUTOCORR_MAX_RHO)."""
    r = min(max(rho, 0.0), AUTOCORR_MAX_RHO)
    return float(np.sqrt((1 + r) / (1 - r)))
