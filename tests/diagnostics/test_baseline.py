"""The baseline rule: a pin, then a named baseline, then a recorded role, then the identity that served the
model first where the deploys are clearly apart; else no baseline."""

from __future__ import annotations

import dataclasses

from diagnostics.baseline import choose_baseline, identity_key, pinned_probes
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in
from telemetry import synthetic


def _replica(rid: str, started: float, **identity):
    return dataclasses.replace(synthetic.replica(rid, started), model_name="tiny", **identity)


def _fleet(store, t0: float, gap: float = 600.0, r0: dict | None = None, r1: dict | None = None, name: str = "base"):
    # r0 baseline since t0, r1 a canary started `gap` s later with other weights (the store is the module's:
    # each test its own `name`)
    store.insert_records("replicas", [_replica(f"{name}-r0", t0, **(r0 or {})),
                                      _replica(f"{name}-r1", t0 + gap, weights_hash="noisy", **(r1 or {}))])
    return [r for r in replicas_in(store, Scope(start=t0 - 1, models=("tiny",)))
            if r["replica_id"].startswith(f"{name}-")]


def test_without_a_pin_the_identity_that_served_first_is_the_baseline(store):
    replicas = _fleet(store, synthetic.T0 + 100)
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas) == ("first_served", ("base-r0",))
    assert "base-r1 deployed later" in b.reason
    # the order of the rows does not matter: the start times do
    assert choose_baseline(store, "tiny", list(reversed(replicas)), pins={}).replicas == ("base-r0",)


def test_replicas_started_together_have_no_baseline(store):
    # a fleet start: one deploy instant, the canary's row 88 ms before the baseline's (it loaded faster)
    t0 = synthetic.T0 + 400
    replicas = _fleet(store, t0, gap=-0.088, r0={"deploy_time": t0 - 20}, r1={"deploy_time": t0 - 20}, name="tog")
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas, b.decided) == ("none", (), False)
    assert "started together" in b.reason and "`role`" in b.reason
    assert not any(b.is_baseline(r) for r in replicas)
    assert b.label().startswith("none (")


def test_start_rows_close_together_without_deploy_times_decide_nothing(store):
    replicas = _fleet(store, synthetic.T0 + 500, gap=60.0, name="close")
    assert choose_baseline(store, "tiny", replicas, pins={}).rule == "none"


def test_a_canary_deployed_once_the_baseline_served_is_apart_even_seconds_later(store):
    # deployed one after the other: r1 launched 5 s after r0's row said it serves
    t0 = synthetic.T0 + 600
    replicas = _fleet(store, t0, gap=30.0, r0={"deploy_time": t0 - 20}, r1={"deploy_time": t0 + 5}, name="dep")
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas) == ("first_served", ("dep-r0",))
    # launched while r0 was still loading: started together
    replicas = _fleet(store, t0 + 1000, gap=30.0, r0={"deploy_time": t0 + 980}, r1={"deploy_time": t0 + 990},
                      name="dep2")
    assert choose_baseline(store, "tiny", replicas, pins={}).rule == "none"


def test_a_recorded_role_decides_when_the_replicas_started_together(store):
    t0 = synthetic.T0 + 700
    same = {"deploy_time": t0 - 20}
    replicas = _fleet(store, t0, gap=0.0, r0=same, r1={**same, "role": "candidate"}, name="role")
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas) == ("role", ("role-r0",)) and "role-r1 recorded role candidate" in b.reason
    # the role wins over start order too: r1, started later, is the named baseline
    replicas = _fleet(store, t0 + 1000, r1={"role": "baseline"}, name="role2")
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas) == ("role", ("role2-r1",))


def test_a_named_baseline_wins_over_first_served(store):
    replicas = _fleet(store, synthetic.T0 + 200)
    request = DiagnosticRequest(Scope(), baseline=Scope(replicas=("base-r1",)))
    b = choose_baseline(store, "tiny", replicas, request, pins={})
    assert (b.rule, b.replicas) == ("requested", ("base-r1",))


def test_a_pin_wins_over_everything(store):
    replicas = _fleet(store, synthetic.T0 + 300)
    canary = next(r for r in replicas if r["replica_id"] == "base-r1")
    pin = dataclasses.replace(synthetic.probe_baseline(0), replica_id="base-r1",
                              **{f: str(canary[f]) for f in ("weights_hash", "tokenizer_hash", "chat_template_hash",
                                                             "config_hash", "engine_version")})
    store.insert_records("probe_baselines", [pin])
    pins = pinned_probes(store, "tiny")
    assert identity_key(pins["probe_0"]) == identity_key(canary)
    request = DiagnosticRequest(Scope(), baseline=Scope(replicas=("base-r0",)))
    b = choose_baseline(store, "tiny", replicas, request)
    assert (b.rule, b.replicas) == ("pinned", ("base-r1",))
    assert b.pins["probe_0"]["output_token_ids"] == [4, 5, 6]
