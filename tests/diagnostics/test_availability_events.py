"""Availability over time: a replica whose shed (refusal, failure) rate rose after a change of its identity is
named with that change, against its own rates before it, even where its peers are no different (one replica,
or all of them changed); a change with the same rates after it, and a rise without any change, are not named
this way."""

from __future__ import annotations

import random
import time

import pytest
from diag_records import replica
from test_availability import answered, config, diagnose, named, refused

from diagnostics import availability
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

REQUESTS = 300  # per replica, one every 0.1 s: a restart at half time leaves 150 on each side


def traffic(store, t0, replicas, *, restarts=None, shed=lambda rid, after: 0.0, seed=1,
            outcome=("queue_full", 429)) -> float:
    """`replicas` started with max_queue 256; those in `restarts` ({replica: max_queue}) started again halfway
    through with that bound. A request is shed (429 queue_full; another `outcome` (error code, status) if
    given) with probability shed(replica, after the halfway mark). Returns the restart's time."""
    restarts = restarts or {}
    halfway = t0 + REQUESTS * 0.05
    store.insert_records("replicas", [replica(r, t0 - 10, config_json=config(max_queue=256)) for r in replicas] +
                         [replica(r, halfway, config_json=config(max_queue=q), config_hash=f"cfg-q{q}")
                          for r, q in restarts.items()])
    rng = random.Random(seed)
    rows = []
    for rid in replicas:
        for j in range(REQUESTS):
            t, workload = t0 + j * 0.1, ("chat", "agent")[j % 2]
            if rng.random() < shed(rid, t >= halfway):
                rows.append(refused(rid, j, t, outcome[0], status=outcome[1], workload=workload))
            else:
                rows.append(answered(rid, j, t, rng.choice([8, 20, 40, 100]), workload))
    store.insert_records("requests", rows)
    return halfway


def since(restart: float, before: int, after: int) -> str:
    return f"since {time.strftime('%H:%M:%S', time.gmtime(restart))} UTC, when max_queue (serve flags) went " \
           f"{before} → {after}"


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


@pytest.mark.parametrize("fleet", [("solo",), ("a", "b", "c")], ids=["one-replica", "all-changed"])
def test_shedding_after_a_restart_with_a_queue_bound_is_named_with_the_change(clean, fleet):
    """Every replica of the model restarted with max_queue 1 and sheds a fifth of its requests after, none
    before: no peer differs from the others, yet each is named, against itself, with the change."""
    import diagnostics

    t0 = time.time() - 600
    restart = traffic(clean, t0, fleet, restarts={r: 1 for r in fleet}, shed=lambda rid, after: 0.2 * after)
    found = named(diagnose(clean, t0))
    assert set(found) == {f"{r}:shed" for r in fleet}
    for rid, f in ((r, found[f"{r}:shed"]) for r in fleet):
        assert f.evidence["against"] == "before" and f.severity in ("warning", "critical")
        assert since(restart, 256, 1) in f.summary and "before it: 0.0% of" in f.summary
        cmp = f.evidence["comparison"]
        assert cmp["before_events"] == 0 and cmp["rate"] > 0.1 and cmp["holm_p"] < availability.ALPHA
        assert f.evidence["identity_events"][0]["changes"] == [
            {"key": "serve_options.max_queue", "before": 256, "after": 1}]
    # through `diagnose`: the change is cited once, by the rule that tested it
    request = DiagnosticRequest(Scope(start=t0 - 60, end=t0 + 3600))
    (f, *_) = [f for f in diagnostics.run(["availability"], clean, request, write=False)
               if f.kind == availability.KIND]
    assert f.summary.count("when max_queue") == 1


def test_a_restart_into_a_queue_bound_on_one_replica_names_it_against_its_peers_and_its_past(clean):
    t0 = time.time() - 600
    restart = traffic(clean, t0, ("a", "b", "c"), restarts={"b": 1},
                      shed=lambda rid, after: 0.2 if (rid, after) == ("b", True) else 0.0)
    found = named(diagnose(clean, t0))
    assert set(found) == {"b:shed"}  # one finding of the replica and outcome, however many rules named it
    f = found["b:shed"]
    assert f.evidence["against"] == "peers" and "max_queue 1 vs 256 in serve flags" in f.summary
    assert since(restart, 256, 1) in f.summary and "before it: 0.0% of" in f.summary
    assert [t["against"] for t in f.evidence["over_time"]] == ["before"]


def test_failures_after_a_restart_are_named_as_failed_with_the_change(clean):
    t0 = time.time() - 600
    restart = traffic(clean, t0, ("solo",), restarts={"solo": 1}, shed=lambda rid, after: 0.15 * after,
                      outcome=("internal_error", 500))
    found = named(diagnose(clean, t0))
    assert set(found) == {"solo:failed"} and since(restart, 256, 1) in found["solo:failed"].summary


@pytest.mark.parametrize("fleet", [("solo",), ("a", "b", "c")], ids=["one-replica", "fleet"])
def test_a_restart_with_another_queue_bound_and_the_same_rates_is_not_named(clean, fleet):
    """Must not fire: the bound changed (256 -> 64) but each replica sheds 5% before and after."""
    t0 = time.time() - 600
    traffic(clean, t0, fleet, restarts={r: 64 for r in fleet}, shed=lambda rid, after: 0.05)
    findings = diagnose(clean, t0)
    assert above_info(findings) == []
    (summary,) = [f for f in findings if "tests" in f.evidence]
    over_time = [t for t in summary.evidence["tests"] if t["against"] == "before"]
    assert {t["replica"] for t in over_time} == set(fleet)  # the rule ran on every changed replica
    assert all(t["holm_p"] >= availability.ALPHA or t["rate"] < availability.MIN_RATIO * t["expected_rate"]
               for t in over_time)


def test_a_rise_without_a_change_is_left_to_the_peer_comparison(clean):
    """`b` sheds a fifth of its requests in the second half with no restart: named against its peers, citing
    no change; alone, it is not named at all (no peers, and no change to compare it before and after)."""
    t0 = time.time() - 600
    traffic(clean, t0, ("a", "b", "c"), shed=lambda rid, after: 0.2 if (rid, after) == ("b", True) else 0.0)
    findings = diagnose(clean, t0)
    found = named(findings)
    assert set(found) == {"b:shed"}
    f = found["b:shed"]
    assert f.evidence["against"] == "peers" and "identity_events" not in f.evidence and "since" not in f.summary
    assert f.evidence["over_time"] == [] and f.evidence["tests_in_family"] == 3 * 4  # replicas x kinds: no change

    clean.command("TRUNCATE TABLE requests")
    clean.command("TRUNCATE TABLE replicas")
    traffic(clean, t0, ("solo",), shed=lambda rid, after: 0.2 * after)
    (only,) = diagnose(clean, t0)
    assert only.kind == "insufficient_data" and only.evidence["tests"] == []
