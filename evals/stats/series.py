"""Series and sets of values: change points in a series (ruptures: PELT on a least-squares cost,
penalty from the noise level) and robust outliers (median and MAD)."""

from __future__ import annotations

import math

import numpy as np

from evals.stats.ranks import finite


def noise_sigma(series: np.ndarray) -> float:
    """Noise level of a series from its first differences (robust to the level shifts themselves)."""
    d = np.diff(series)
    if len(d) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def change_points(series, min_size: int = 3, penalty_scale: float = 3.0) -> list[int]:
    """Indices where a new level starts (PELT, l2 cost, penalty = scale * sigma^2 * log n)."""
    import ruptures as rpt

    x = finite(series)
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


def robust_z(values: dict[str, float], floor_fraction: float = 0.05) -> tuple[dict[str, float], float, float]:
    """Robust z-scores (value - median) / (1.4826 MAD) per key, with the MAD floored at
    `floor_fraction` of the median so that near-identical peers do not make any wobble an outlier."""
    v = np.array(list(values.values()), dtype=float)
    med = float(np.median(v))
    mad = float(np.median(np.abs(v - med))) * 1.4826
    scale = max(mad, floor_fraction * abs(med), 1e-12)
    return {k: (x - med) / scale for k, x in values.items()}, med, mad
