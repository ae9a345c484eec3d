"""A latency change point belongs to the replica whose identity change preceded it (citing the change), or to
the one replica that carries it; a step every replica took stays the fleet's."""

from __future__ import annotations

import json
import random
import time

from diag_records import jittered, replica, request

from diagnostics import regression
from diagnostics.scope import Scope

SECONDS = 1200  # one request per replica per second; the step at the middle


def _config(max_num_seqs: int) -> str:
    return json.dumps({"model": "/nonexistent", "quantization": "none", "max_num_seqs": max_num_seqs})


def _fleet(store, t0: float, slow: dict[str, float], restarted: tuple = ()) -> None:
    """r0 and r1 from t0 - 10 at max_num_seqs 16; each replica in `restarted` starts again at the middle with
    max_num_seqs 2; from the middle on, each replica's TTFT is `slow[replica]` times what it was."""
    rng = random.Random(5)
    middle = t0 + SECONDS / 2
    rows = [replica(r, t0 - 10, config_json=_config(16), config_hash="cfg-16") for r in ("r0", "r1")]
    rows += [replica(r, middle - 5, config_json=_config(2), config_hash="cfg-2") for r in restarted]
    store.insert_records("replicas", rows)
    store.insert_records("requests", [
        request(r, j, t0 + j + 0.5 * k, ttft=jittered(rng, 0.02 * (slow.get(r, 1.0) if t0 + j >= middle else 1.0)))
        for k, r in enumerate(("r0", "r1")) for j in range(SECONDS)])


def _ttft_step(store, t0: float):
    found = [f for f in regression.creep(store, Scope(start=t0 - 60)) if f.kind == "latency_change_point"
             and f.severity != "info" and f.subject.startswith("ttft")]
    assert len(found) == 1, [f.summary for f in found]
    return found[0]


def test_a_step_after_a_replicas_restart_with_another_identity_is_that_replicas_and_cites_the_change(clean):
    t0 = time.time() - 3 * SECONDS
    _fleet(clean, t0, slow={"r1": 4.0}, restarted=("r1",))
    f = _ttft_step(clean, t0)
    assert f.subject == "ttft: r1"
    assert f.evidence["attribution"]["rule"] == "identity_event"
    assert "max_num_seqs went 16 → 2" in f.summary and f.summary.startswith("r1: ")
    assert f.evidence["identity_events"][0]["replica"] == "r1"


def test_a_step_on_one_replica_alone_is_that_replicas_without_a_change_to_cite(clean):
    t0 = time.time() - 3 * SECONDS
    _fleet(clean, t0, slow={"r1": 4.0})
    f = _ttft_step(clean, t0)
    assert f.subject == "ttft: r1" and f.evidence["attribution"]["rule"] == "only_replica"
    assert "no identity change of r1 precedes it" in f.summary


def test_a_step_every_replica_took_stays_the_fleets_even_where_one_of_them_restarted(clean):
    t0 = time.time() - 3 * SECONDS
    _fleet(clean, t0, slow={"r0": 2.5, "r1": 2.5}, restarted=("r1",))
    f = _ttft_step(clean, t0)
    assert f.evidence["attribution"]["rule"] == "fleet"
    assert f.subject not in ("ttft: r0", "ttft: r1") and "went 16 → 2" not in f.summary
    assert set(f.evidence["attribution"]["replicas"]) == {"r0", "r1"}
