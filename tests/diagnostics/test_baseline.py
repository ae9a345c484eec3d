"""The baseline rule: a pin, then a named baseline, then the identity that served the model first."""

from __future__ import annotations

import dataclasses

from diagnostics.baseline import choose_baseline, identity_key, pinned_probes
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in
from telemetry import synthetic


def _replica(rid: str, started: float, **identity):
    return dataclasses.replace(synthetic.replica(rid, started), model_name="tiny", **identity)


def _fleet(store, t0: float):
    # r0 baseline since t0, r1 a canary started later with other weights
    store.insert_records("replicas", [_replica("base-r0", t0), _replica("base-r1", t0 + 60, weights_hash="noisy")])
    return [r for r in replicas_in(store, Scope(start=t0 - 1, models=("tiny",))) if r["replica_id"].startswith("base-")]


def test_without_a_pin_the_identity_that_served_first_is_the_baseline(store):
    replicas = _fleet(store, synthetic.T0 + 100)
    b = choose_baseline(store, "tiny", replicas, pins={})
    assert (b.rule, b.replicas) == ("first_served", ("base-r0",))
    assert "base-r1 started later" in b.reason
    # the order of the rows does not matter: the start times do
    assert choose_baseline(store, "tiny", list(reversed(replicas)), pins={}).replicas == ("base-r0",)


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
