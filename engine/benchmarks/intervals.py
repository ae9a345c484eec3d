"""Confidence intervals of the overhead benchmarks' ratios: percentile bootstraps, seeded, so a rerun on the
same numbers prints the same interval. engine/ may not import evals/stats, so these stand on scipy and numpy."""

from __future__ import annotations


def bootstrap_median_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median (how far the noise lets the pairwise loss wander)."""
    import warnings

    import numpy as np
    from scipy import stats

    if len(values) < 2:  # one pair: no spread to resample
        return values[0], values[0]
    with warnings.catch_warnings():  # identical losses give a degenerate (point) interval: that is fine
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((np.asarray(values),), np.median, n_resamples=resamples, method="percentile",
                              rng=np.random.default_rng(seed))
    low, high = res.confidence_interval
    return float(low), float(high)


def pooled_ratio(pairs) -> float:
    """ON/OFF ratio of the median request latency over every request of the given (ON, OFF) round pairs."""
    import numpy as np

    return float(np.median(np.concatenate([p[0] for p in pairs])) / np.median(np.concatenate([p[1] for p in pairs])))


def pooled_ratio_ci(instances: list[list[tuple[list[float], list[float]]]], resamples: int = 2000,
                    seed: int = 0) -> tuple[float, tuple[float, float]]:
    """The pooled ratio over every instance's round pairs, with a 95% two-stage bootstrap interval:
    resample server instances, then round pairs within each drawn instance. A burst of other load hits
    both rounds of a pair, so the pair is a unit; a server pair has a speed of its own, so the instance
    is one above it. scipy's bootstrap resamples one level only, hence the loop; with one instance this
    is the plain bootstrap over pairs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = [[(np.asarray(on), np.asarray(off)) for on, off in pairs] for pairs in instances]
    stats = []
    for _ in range(resamples):
        drawn = []
        for k in rng.integers(len(arrays), size=len(arrays)):
            pairs = arrays[k]
            drawn += [pairs[i] for i in rng.integers(len(pairs), size=len(pairs))]
        stats.append(pooled_ratio(drawn))
    low, high = np.percentile(stats, [2.5, 97.5])
    return pooled_ratio([p for pairs in arrays for p in pairs]), (float(low), float(high))
