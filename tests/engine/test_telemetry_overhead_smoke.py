"""The telemetry-overhead benchmark's code path at a tiny size: one OFF/ON pair runs through a real
sidecar, and every ON request reaches the store with its token IDs (no timing asserted)."""

from __future__ import annotations

import pytest

from engine.benchmarks.intervals import bootstrap_median_ci
from engine.benchmarks.telemetry_overhead import measure, round_order


def test_rounds_alternate_abba_so_drift_hits_both_sides():
    assert round_order(3) == ["off", "on", "on", "off", "off", "on"]


@pytest.mark.slow
def test_one_pair_runs_and_every_on_request_is_stored_with_its_token_ids(tiny_llama, tmp_path):
    result = measure(tiny_llama, pairs=1, num_prompts=2, prompt_lens=(4, 12), output_lens=(2, 6),
                     max_num_seqs=4, flush_interval=0.2, replica_id="overhead-smoke", data_dir=tmp_path / "store",
                     round_seconds=0.5, progress=lambda line: None)

    assert [r["mode"] for r in result["rounds"]] == ["off", "on"]
    assert all(r["output_tokens"] == result["workload"]["output_tokens"] for r in result["rounds"])
    prompts = result["workload"]["num_prompts"]
    assert prompts >= 2  # more prompts drawn for a round of about round_seconds (a probe round measured it)
    store = result["store"]
    assert store["expected_requests"] == 2 + prompts  # 2 warm-up ON requests + the ON round's
    assert store["stored_requests"] == store["matching_token_ids"] == store["expected_requests"]
    assert store["replica_rows"] == 1
    assert store["step_rows"] >= 2 * 2  # each ON request needs a prefill step and at least one decode step
    assert store["spans"] >= store["expected_requests"]  # a request span (plus children) per ON request
    assert store["observer_failures"] == 0
    assert 0 < store["engine_hook_share"] < 1  # the engine's own clock saw time spent in the hooks
    assert store["recorder_stats"]["requests"]["dropped"] == 0
    wall = result["summary"]["wall"]
    assert wall["median_off"] > 0 and wall["median_on"] > 0 and len(wall["pair_losses"]) == 1
    cpu = result["summary"]["process_cpu"]  # the primary figure: output tokens per CPU second, every thread
    assert cpu["median_off"] > 0 and cpu["median_on"] > 0 and len(cpu["pair_losses"]) == 1


def test_bootstrap_interval_of_the_median():
    import random
    import statistics

    rng = random.Random(1)
    noisy = [rng.gauss(0.03, 0.08) for _ in range(24)]
    low, high = bootstrap_median_ci(noisy)
    assert low < statistics.median(noisy) < high and high - low < 0.1
    assert bootstrap_median_ci(noisy) == (low, high)  # seeded
    assert bootstrap_median_ci([0.02] * 5) == (0.02, 0.02)  # no spread: a point
    assert bootstrap_median_ci([0.01]) == (0.01, 0.01)  # one pair
