"""vllm_overhead's headline interval: the server instance is a unit of its own, above the round pair."""

import random

from engine.benchmarks.intervals import pooled_ratio, pooled_ratio_ci


def instance(bias: float, pairs: int, rng: random.Random):
    """Round pairs of one server pair whose ON server is `bias` times slower, with small round noise."""
    out = []
    for _ in range(pairs):
        drift = rng.uniform(0.95, 1.05)  # a load burst hits both rounds of a pair
        out.append(([bias * drift * rng.gauss(1, 0.01) for _ in range(4)],
                    [drift * rng.gauss(1, 0.01) for _ in range(4)]))
    return out


def test_instance_speeds_widen_the_interval_to_cover_them():
    # two instances 1.00x and 1.20x apart, as two runs of the same code were: an interval over pairs alone
    # would be tight around the mean and exclude both; resampling instances must reach out to both
    rng = random.Random(0)
    instances = [instance(1.0, 30, rng), instance(1.2, 30, rng)]
    point, (low, high) = pooled_ratio_ci(instances, resamples=500)
    assert low <= 1.01 and high >= 1.19
    assert low <= point <= high


def test_one_instance_is_the_bootstrap_over_pairs():
    rng = random.Random(1)
    pairs = instance(1.02, 40, rng)
    point, (low, high) = pooled_ratio_ci([pairs], resamples=500)
    assert point == pooled_ratio(pairs)
    assert 1.0 < low < point < high < 1.04  # tight: the drift cancels within pairs
