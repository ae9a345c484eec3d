"""The step-time model: a replica slower at the same batch shapes fires; one that got bigger batches or
longer contexts does not; block-level noise and many replicas do not fool it. Real chdb store."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from diagnostics import DIAGNOSTICS, steps as steps_rule
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from evals.stats import clusters
from telemetry.synthetic import T0
from tests.diagnostics.diag_records import replica, step

SPACING = 0.1  # seconds between a replica's steps: 100 steps per 10 s block
SECONDS = 300.0  # 30 blocks


def cost(prefill_tokens, decode_tokens, seqs, context_tokens):
    """The true per-step cost on a healthy replica: (forward, host) seconds, linear in the shape."""
    forward = 0.002 + 2e-5 * prefill_tokens + 3e-4 * decode_tokens + 1e-6 * context_tokens
    host = 0.001 + 1e-4 * seqs
    return forward, host


def steps_of(rid: str, t0: float, *, seed: int, seconds: float = SECONDS, seqs=(1, 16), context_per_seq=(100, 400),
             forward_factor: float = 1.0, host_factor: float = 1.0, step_noise: float = 0.1,
             block_noise: float = 0.03, block_factors=None, no_split: bool = False, no_context: bool = False,
             idle: bool = False, drift=None):
    """Steps of one replica: phases, batch sizes and contexts drawn from the given ranges; the healthy
    cost times the replica's factors, a per-10 s-block shock (or `block_factors`, cycled) and per-step noise;
    with `idle`, an idle step (no sequences, the loop's wait) between every two; `drift` (sigma, tau seconds):
    an AR(1) log-factor on every step, autocorrelated over tau (a host's slowly varying contention)."""
    rng = np.random.default_rng(seed)
    n = int(seconds / SPACING)
    walk = np.zeros(n)
    if drift is not None:
        sigma, tau = drift
        a = np.exp(-SPACING / tau)
        walk[0] = rng.normal(0, sigma)
        for k in range(1, n):
            walk[k] = a * walk[k - 1] + rng.normal(0, sigma * np.sqrt(1 - a * a))
    shocks = (np.resize(np.asarray(block_factors, float), int(seconds / 10) + 1) if block_factors is not None
              else np.exp(rng.normal(0, block_noise, int(seconds / 10) + 1)))
    out = []
    for k in range(n):
        s = int(rng.integers(seqs[0], seqs[1] + 1))
        phase = rng.choice(["decode", "prefill", "mixed"], p=[0.8, 0.1, 0.1])
        npre = {"decode": 0, "prefill": s, "mixed": max(1, s // 4)}[phase]
        pre_tokens = int(npre * rng.integers(50, 200))
        dec = s - npre
        ctx = int(dec * rng.integers(*context_per_seq)) + pre_tokens
        forward, host = cost(pre_tokens, dec, s, ctx)
        shock = shocks[int(k * SPACING / 10)] * np.exp(walk[k])
        forward *= forward_factor * shock * np.exp(rng.normal(0, step_noise))
        host *= host_factor * shock * np.exp(rng.normal(0, step_noise))
        if no_split:  # an engine that reports the whole step as forward (vLLM's stat logger)
            forward, host = forward + host, 0.0
        out.append(step(rid, k, t0 + k * SPACING, duration=forward + host, forward=forward, num_seqs=s, phase=phase,
                        num_prefill_seqs=1 if npre else 0, num_decode_seqs=dec, num_tokens=pre_tokens + dec,
                        num_prefill_tokens=pre_tokens, num_decode_tokens=dec,
                        num_context_tokens=0 if no_context else ctx,
                        # steps SPACING apart are not back to back: each left nothing running (no gap to
                        # model; busy_steps_of makes those)
                        num_running=0))
        if idle:
            out.append(step(rid, n + k, t0 + (k + 0.5) * SPACING, duration=0.05, forward=0.0, num_seqs=0,
                            phase="idle", num_decode_seqs=0, num_tokens=0, num_decode_tokens=0))
    return out


# each fleet's window of its own, all ending before T0 (the last whole hour: never after now). Windows past T0
# lay in the future for part of each hour: run at 20:12, a gap-fit test late in the module lost its report
_WINDOW_COUNT = 99
_WINDOW_SECONDS = 2_000
_WINDOWS = iter(range(1, _WINDOW_COUNT + 1))


def fleet(store, model: str, specs: dict[str, dict], identities: dict[str, dict] | None = None,
          seconds: float = SECONDS, steps=None, seed_base: int = 0) -> Scope:
    """Insert one replica start and the steps of each replica (`specs`: replica -> kwargs of `steps`,
    steps_of by default) in a window of its own; returns that window's scope."""
    steps = steps or steps_of
    t0 = T0 - _WINDOW_SECONDS * (_WINDOW_COUNT + 2) + _WINDOW_SECONDS * next(_WINDOWS)
    identities = identities or {}
    store.insert_records("replicas", [replica(rid, t0 - 60, model_name=model, **identities.get(rid, {}))
                                      for rid in specs])
    for k, (rid, kw) in enumerate(specs.items()):
        store.insert_records("steps", steps(rid, t0, seed=kw.pop("seed", seed_base + k), seconds=seconds, **kw))
    return Scope(start=t0 - 1, end=t0 + seconds + 1)


def run(store, scope, **kw):
    return steps_rule.run(store, DiagnosticRequest(scope), **kw)


def slow(findings):
    return {f.subject: f for f in findings if f.kind == "slow_steps"}


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_registered():
    assert DIAGNOSTICS["steps"] is steps_rule


def test_a_pinned_canary_beside_its_baseline_fires_on_host_and_step_time(store):
    scope = fleet(store, "m-two", {"c-base": {}, "c-canary": {"host_factor": 2.0}},
                  {"c-canary": {"cpu_affinity": [0], "cpus": (0,)}})
    found = slow(run(store, scope))
    assert set(found) == {"c-canary"}
    f = found["c-canary"]
    assert f.severity in ("warning", "critical")
    host = f.evidence["targets"]["host"]
    assert host["slow"] and 1.7 < host["ratio"] < 2.3 and host["ci"][0] > steps_rule.MIN_RATIO
    assert host["p_holm"] < steps_rule.ALPHA
    assert f.evidence["targets"]["forward"]["ci"][0] < 1.0 < f.evidence["targets"]["forward"]["ci"][1]
    assert "c-canary" in f.summary and "cpu_count" in f.summary
    assert any(d["field"] == "cpu_count" for d in f.evidence["identity_differences"])
    assert f.evidence["peers"] == ["c-base"] and f.evidence["blocks"] >= 30


def test_a_modest_slowdown_of_one_of_two_is_found_against_the_other_alone(store):
    # leave-one-out: a fit on both replicas would sit halfway and read 1.25x as ~1.1x
    scope = fleet(store, "m-loo", {"l-base": {}, "l-canary": {"forward_factor": 1.25, "host_factor": 1.25}})
    found = slow(run(store, scope))
    assert set(found) == {"l-canary"}
    step_ratio = found["l-canary"].evidence["targets"]["step"]
    assert 1.18 < step_ratio["ratio"] < 1.32 and step_ratio["ci"][0] > steps_rule.MIN_RATIO


def test_three_replicas_name_the_slow_one_with_an_interval_above_one(store):
    scope = fleet(store, "m-three", {"t-r0": {}, "t-r1": {}, "t-r2": {"forward_factor": 1.5}},
                  {"t-r2": {"numa_mismatch": True}})
    found = slow(run(store, scope))
    assert set(found) == {"t-r2"}
    fwd = found["t-r2"].evidence["targets"]["forward"]
    assert fwd["slow"] and fwd["ci"][0] > 1.0 and 1.35 < fwd["ratio"] < 1.65
    assert "numa_mismatch" in found["t-r2"].summary
    assert found["t-r2"].evidence["peers"] == ["t-r0", "t-r1"]
    # a scope that filters on identity reads the steps through the replica starts' identity: the same answer
    narrowed = slow(run(store, scope.narrowed(models=("m-three",), versions=("0.1.0",))))
    assert set(narrowed) == {"t-r2"}
    assert narrowed["t-r2"].evidence["targets"]["forward"]["ratio"] == pytest.approx(fwd["ratio"])
    assert run(store, scope.narrowed(models=("another-model",))) == []


def test_bigger_batches_and_longer_contexts_at_the_same_cost_do_not_fire(store):
    specs = {"b-r0": {}, "b-r1": {}, "b-big": {"seqs": (16, 48), "context_per_seq": (1500, 4000)}}
    scope = fleet(store, "m-traffic", specs)
    mean = store.query_df("SELECT replica_id, avg(duration_seconds) AS d FROM steps WHERE replica_id LIKE 'b-%' "
                          "GROUP BY replica_id").set_index("replica_id")["d"]
    assert mean["b-big"] > 2.5 * mean["b-r0"]  # its raw step time is far slower: traffic, not the replica
    assert above_info(run(store, scope)) == []


def test_a_clean_fleet_gives_nothing_above_info(store):
    # one of them idles between steps: idle steps are no batch shape and must not count
    scope = fleet(store, "m-clean", {"k-r0": {}, "k-r1": {}, "k-r2": {}, "k-idle": {"idle": True}})
    assert above_info(run(store, scope)) == []


def test_an_engine_without_a_host_split_is_compared_on_step_time_only(store):
    scope = fleet(store, "m-nosplit", {"n-r0": {"no_split": True}, "n-r1": {"no_split": True},
                                       "n-slow": {"no_split": True, "forward_factor": 1.6, "host_factor": 1.6}})
    found = slow(run(store, scope))
    assert set(found) == {"n-slow"} and "host" not in found["n-slow"].evidence["targets"]


def test_a_mixed_fleet_where_one_engine_reports_no_split_and_no_context_is_quiet(store):
    # a vLLM replica beside infersight ones: its stat logger gives neither a host / forward split nor context
    # tokens; its steps must not teach the others' model that host time is 0 or that context costs nothing
    vllm = {"no_split": True, "no_context": True}
    scope = fleet(store, "m-mixed", {"x-r0": {}, "x-r1": {}, "x-r2": {}, "x-vllm": vllm})
    assert above_info(run(store, scope)) == []
    scope = fleet(store, "m-mixed-slow", {"y-r0": {}, "y-r1": {}, "y-vllm": vllm,
                                          "y-slow": {**vllm, "forward_factor": 1.5, "host_factor": 1.5}})
    found = slow(run(store, scope))
    assert set(found) == {"y-slow"} and set(found["y-slow"].evidence["targets"]) == {"step"}


def test_autocorrelated_noise_is_judged_by_time_blocks_not_steps(store):
    # the canary's blocks alternate 0.75x / 1.75x: 1.25x on average, but over only 30 blocks, not 3000 steps
    scope = fleet(store, "m-blocks", {"a-base": {}, "a-canary": {"block_factors": [0.75, 1.75], "step_noise": 0.05}})
    assert above_info(run(store, scope)) == []
    # the same data judged step by step (each step its own block) looks decisive: the block is what saves it
    assert "a-canary" in slow(run(store, scope, block_seconds=SPACING / 2))


def test_many_replicas_need_holm(store, monkeypatch):
    # eight healthy replicas, per-block shocks, and no minimum effect: 24 tests of "slower at all", and by
    # chance a few p-values fall below ALPHA (this seed: three, the smallest 0.004); Holm keeps them quiet
    monkeypatch.setattr(steps_rule, "MIN_RATIO", 1.0)
    specs = {f"h-r{i}": {"block_noise": 0.1, "seed": 200 + i} for i in range(8)}
    scope = fleet(store, "m-holm", specs, seconds=120.0)
    assert above_info(run(store, scope, block_seconds=10.0)) == []  # blocks as long as the shocks
    monkeypatch.setattr(steps_rule, "holm", lambda ps: list(ps))  # uncorrected: a false alarm
    assert slow(run(store, scope, block_seconds=10.0))


def test_short_runs_get_shorter_blocks_and_a_starved_canary_of_60_s_is_found(store):
    # 60 s: fixed 10 s blocks would be 6, "insufficient data"; the adaptive length makes them 3 s
    scope = fleet(store, "m-60s", {"q-base": {}, "q-canary": {"host_factor": 2.0}}, seconds=60.0)
    assert steps_rule.block_length(store, scope) == pytest.approx(3.0, rel=0.01)
    found = slow(run(store, scope))
    assert set(found) == {"q-canary"} and found["q-canary"].evidence["block_seconds"] == pytest.approx(3.0, rel=0.01)
    assert all(f.insufficient for f in run(store, scope, block_seconds=10.0))


def test_autocorrelated_step_noise_on_a_short_clean_run_merges_blocks_and_stays_quiet(store, monkeypatch):
    # two clean replicas, 90 s, each with its own slow drift (AR(1), sd 0.3, tau 8 s): 4.5 s blocks are short
    # against it (adjacent residuals correlate), so they are merged, and what correlation is left widens
    # the interval. Over 20 seeds neither guard on, 1 fires; both on, none (this is that seed)
    specs = {"d-r0": {"drift": (0.3, 8.0), "seed": 412}, "d-r1": {"drift": (0.3, 8.0), "seed": 413}}
    scope = fleet(store, "m-drift", specs, seconds=90.0)
    assert above_info(run(store, scope)) == []
    monkeypatch.setattr(steps_rule, "AUTOCORR_Z", np.inf)  # no merging, no widening: a false alarm
    monkeypatch.setattr(clusters, "AUTOCORR_MAX_RHO", 0.0)
    assert slow(run(store, scope))


def test_too_few_blocks_is_insufficient_data_saying_what_is_needed(store):
    scope = fleet(store, "m-short", {"s-r0": {}, "s-r1": {}}, seconds=10.0)
    found = run(store, scope)
    assert {f.subject for f in found} == {"s-r0", "s-r1"}
    for f in found:
        assert f.insufficient and f.severity == "info" and f.evidence["for_kind"] == "slow_steps"
        assert f"need {steps_rule.MIN_STEPS} steps in {steps_rule.MIN_BLOCKS} blocks" in f.summary


def test_a_lone_replica_is_insufficient_data(store):
    scope = fleet(store, "m-lone", {"z-only": {}})
    (f,) = run(store, scope)
    assert f.insufficient and "at least one peer" in f.summary


def test_fit_is_exact_on_noiseless_linear_steps():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (200, steps_rule._K))
    x[:, 3] = x[:, 4]  # exactly collinear columns are still solvable
    beta = rng.uniform(0, 1, (steps_rule._K, steps_rule._T))
    y = x @ beta
    fitted = steps_rule._fit(x.T @ x, x.T @ y)
    assert np.allclose(x @ fitted, y, rtol=1e-6)


@pytest.mark.parametrize("field", ["num_context_tokens"])
def test_the_step_record_carries_the_shape_the_model_reads(field):
    assert field in {f.name for f in dataclasses.fields(step("r", 0, 0.0))}


def test_another_engine_is_not_a_slow_replica_but_a_slower_build_of_the_same_engine_is(store):
    # a clean mixed fleet: vLLM's iterations on the CPU take ~3x infersight's steps at the same shapes;
    # that is two engines, not one slow replica (compared with peers of its own engine: it has none)
    vllm = {"no_split": True, "no_context": True, "forward_factor": 3.0, "host_factor": 3.0}
    scope = fleet(store, "m-engines", {"e-r0": {}, "e-r1": {}, "e-vllm": vllm},
                  {"e-vllm": {"engine_version": "vllm-0.32.0"}})
    assert above_info(run(store, scope)) == []
    # a new build of infersight beside the old one is the same engine: its slower steps are a finding
    scope = fleet(store, "m-builds", {"b-r0": {}, "b-r1": {}, "b-new": {"forward_factor": 1.5, "host_factor": 1.5}},
                  {"b-new": {"engine_version": "0.2.0"}})
    found = slow(run(store, scope))
    assert set(found) == {"b-new"} and "engine_version" in found["b-new"].summary
    assert steps_rule.engine_family("vllm-0.32.0") == "vllm" and steps_rule.engine_family("0.1.0") == "infersight"


# -- the gap: the time between a step that left sequences running and the next one ---------------------

def busy_steps_of(rid: str, t0: float, *, seed: int, seconds: float = 60.0, seqs=(1, 8), gap_factor: float = 1.0,
                  gap_base: float = 4e-4, idle_waits: float = 0.0, stall_at=None, context_per_seq=(100, 400),
                  gap_per_context: float = 0.0):
    """Back-to-back steps of a busy replica: each step's cost as in steps_of, and before it a gap that grows
    with the step's sequences (outputs streamed) and prefill tokens (requests that arrived), times
    `gap_factor` and per-gap noise. `idle_waits`: the probability that a step empties the batch and the loop
    then waits 20-80 ms for work (no gap: a wait); `stall_at`: seconds in, a 30 s stop with sequences running
    (a restart, not the per-step overhead); `gap_per_context`: seconds a gap grows per context token."""
    rng = np.random.default_rng(seed)
    out, t, k, running = [], t0, 0, 1
    while t < t0 + seconds:
        s = int(rng.integers(seqs[0], seqs[1] + 1))
        phase = rng.choice(["decode", "prefill", "mixed"], p=[0.8, 0.1, 0.1])
        npre = {"decode": 0, "prefill": s, "mixed": max(1, s // 4)}[phase]
        pre_tokens = int(npre * rng.integers(20, 100))
        dec = s - npre
        ctx = int(dec * rng.integers(*context_per_seq)) + pre_tokens
        forward, host = cost(pre_tokens, dec, s, ctx)
        forward *= np.exp(rng.normal(0, 0.1))
        host *= np.exp(rng.normal(0, 0.1))
        if running:
            gap = gap_base + 1e-4 * s + 2e-6 * pre_tokens + gap_per_context * ctx
            t += gap * gap_factor * np.exp(rng.normal(0, 0.3))
        if stall_at is not None and t >= t0 + stall_at:
            t, stall_at = t + 30.0, None
        running = 0 if rng.random() < idle_waits else s
        out.append(step(rid, k, t, duration=forward + host, forward=forward, num_seqs=s, phase=phase,
                        num_prefill_seqs=1 if npre else 0, num_decode_seqs=dec, num_tokens=pre_tokens + dec,
                        num_prefill_tokens=pre_tokens, num_decode_tokens=dec, num_context_tokens=ctx,
                        num_running=running))
        t += forward + host
        if not running:
            t += rng.uniform(0.02, 0.08)
        k += 1
    return out


def busy_fleet(store, model: str, specs: dict[str, dict]) -> Scope:
    return fleet(store, model, specs, seconds=60.0, steps=busy_steps_of, seed_base=500)


def test_a_replica_that_waits_longer_between_steps_is_named_on_the_gap_not_the_step(store):
    # a starved replica: its steps as fast as its peer's, the time between them 2.2x
    scope = busy_fleet(store, "m-gap", {"g-base": {}, "g-starved": {"gap_factor": 2.2}})
    found = slow(run(store, scope))
    assert set(found) == {"g-starved"}
    targets = found["g-starved"].evidence["targets"]
    assert found["g-starved"].evidence["slow_targets"] == ["gap"]
    gap = targets["gap"]
    assert 1.9 < gap["ratio"] < 2.5 and gap["ci"][0] > gap["bar"] > steps_rule.MIN_RATIO
    assert 0.1 < gap["gap_share"] < 0.4  # the bar is the wall-time share's: 1 + 0.1 / share
    assert gap["bar"] == pytest.approx(1 + (steps_rule.MIN_RATIO - 1) / gap["gap_share"])
    assert not targets["step"]["slow"] and 0.95 < targets["step"]["ratio"] < 1.05
    assert "between-step" in found["g-starved"].summary
    assert above_info(run(store, busy_fleet(store, "m-gap-clean", {"gc-r0": {}, "gc-r1": {}, "gc-r2": {}}))) == []


def test_more_traffic_means_longer_gaps_by_the_same_law_and_does_not_fire(store):
    # the canary got bigger batches (more outputs to stream, more arrivals): longer raw gaps, the same cost
    scope = busy_fleet(store, "m-gap-traffic", {"gt-r0": {}, "gt-r1": {}, "gt-big": {"seqs": (8, 32)}})
    raw = store.query_df("SELECT replica_id, count() AS n, toFloat64(max(start_time) - min(start_time)) AS span, "
                         "sum(duration_seconds) AS busy FROM steps WHERE replica_id LIKE 'gt-%' GROUP BY replica_id"
                         ).set_index("replica_id")
    gap_per_step = (raw["span"] - raw["busy"]) / raw["n"]
    assert gap_per_step["gt-big"] > 1.8 * gap_per_step["gt-r0"]  # raw, it waits far longer between steps
    assert above_info(run(store, scope)) == []


def test_the_gap_bar_is_set_by_the_gaps_share_of_the_wall_time(store, monkeypatch):
    # gaps of ~1% of the busy time, doubled: real, and 1% more wall time, under the step bar's 10%
    scope = busy_fleet(store, "m-gap-tiny", {"gs-base": {"gap_base": 0.0}, "gs-canary": {"gap_base": 0.0,
                                                                                      "gap_factor": 2.0}})
    assert above_info(run(store, scope)) == []
    report: list = []
    run(store, scope, report=report)
    (gap,) = [r for r in report if r["replica"] == "gs-canary" and r["target"] == "gap"]
    assert gap["ci"][0] > 1.5 and gap["bar"] > gap["ci"][1]
    monkeypatch.setattr(steps_rule, "gap_bar", lambda gap, step: steps_rule.MIN_RATIO)  # the shared bar: fires
    assert set(slow(run(store, scope))) == {"gs-canary"}


def test_waits_for_work_are_not_gaps(store):
    # the canary's batch empties often and its loop then waits 20-80 ms for work (light traffic): a wait
    scope = busy_fleet(store, "m-gap-idle", {"gw-r0": {}, "gw-r1": {}, "gw-idle": {"idle_waits": 0.3}})
    assert above_info(run(store, scope)) == []


def test_a_stop_with_sequences_running_is_not_a_gap(store):
    # 30 s without a step while sequences ran (a restart, a hang: the replicas diagnostic's) would be most of
    # the canary's gap time; it is left out, and its per-step gaps read as its peer's
    scope = busy_fleet(store, "m-gap-stall", {"gx-r0": {}, "gx-stalled": {"stall_at": 30.0}})
    report: list = []
    assert above_info(run(store, scope, report=report)) == []
    (gap,) = [r for r in report if r["replica"] == "gx-stalled" and r["target"] == "gap"]
    assert 0.8 < gap["ratio"] < 1.25


def test_a_replica_without_gaps_keeps_the_context_slope_in_its_peers_gap_fit(store):
    # whether context is fitted is decided once, on the step sums, for both fits: a replica whose traffic
    # never leaves sequences running (single-step scoring requests: no gap of its own) still reports context,
    # so the gap fit keeps the context slope that explains the long-context replica's longer gaps. Decided on
    # the gap sums, its empty gaps would drop the slope and the long-context replica would read as slow.
    law = {"gap_per_context": 2e-7}
    specs = {"gk-r0": dict(law), "gk-r1": dict(law), "gk-long": {**law, "context_per_seq": (1500, 4000)}}
    scope = busy_fleet(store, "m-gap-context", specs)
    t0 = scope.start + 1
    store.insert_records("replicas", [replica("gk-scoring", t0 - 60, model_name="m-gap-context")])
    scoring = steps_of("gk-scoring", t0, seed=7, seconds=60.0)  # num_running 0 after every step: no gaps
    assert sum(s.num_context_tokens for s in scoring) > 0
    store.insert_records("steps", scoring)
    report: list = []
    assert above_info(run(store, scope, report=report)) == []
    (gap,) = [r for r in report if r["replica"] == "gk-long" and r["target"] == "gap"]
    assert gap["ci"][0] < 1.1  # explained by its contexts, not lagging


def test_a_canary_under_a_smaller_cpu_quota_is_slow_and_the_quota_is_cited_with_both_values(store):
    def config(quota):
        cpu_max = "max 100000" if quota == "max" else f"{int(quota * 100000)} 100000"
        return json.dumps({"model": "/nonexistent", "quantization": "none",
                           "placement": {"cgroup": {"version": "v2", "cpu_quota_cpus": quota, "cpu_max": cpu_max}}})

    scope = fleet(store, "m-quota", {"q-base": {}, "q-canary": {"forward_factor": 2.0, "host_factor": 2.0}},
                  {"q-base": {"config_json": config("max")}, "q-canary": {"config_json": config(0.3)}})
    f = slow(run(store, scope))["q-canary"]
    assert "cause: CPU quota 0.3 CPUs (cgroup cpu.max 30000 100000) vs max on peers" in f.summary
    assert f.evidence["mechanisms"][0]["mechanism"] == "cpu_quota"
    assert f.evidence["mechanisms"][0]["replica"]["cpu_quota_cpus"] == 0.3
