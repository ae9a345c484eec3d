"""Availability, like for like: a replica that refuses, sheds or fails more of its requests than its peers do
with the same kind of requests, named with the identity key that explains it.

Every request a replica (or a recording proxy) received is a `requests` row, refused ones included, with an
error code of a fixed vocabulary (telemetry/contract/outcomes.py). The outcome kinds compared:
- `length`: refused for its length (context_length). A length limit refuses only long prompts, so these are
  compared in strata of workload x prompt length (sqrt-2 buckets of prompt_tokens): a replica sent more long
  prompts than its peers is not named for refusing those its peers refuse too. Rows of unknown length (a
  request shed or rejected before it was tokenized) never reached the length check: not at risk, left out;
- `rejected`: any other refusal of the request as sent (400 / 401 / 409 / 413), per workload;
- `shed`: 429 for a full queue, 503 while the replica cannot serve, per workload;
- `failed`: failed by the engine, the server or the upstream, or timed out, per workload.
Aborts are the client's choice and are not compared.

Each (replica, kind) against the replica's peers (the other replicas of its model, pooled): a stratified
2 x 2 x S comparison, the Cochran-Mantel-Haenszel test one-sided (the replica's events above what its peers'
rates predict in its own strata), only in strata both sides served. Holm over replicas x kinds, per model.
It fires when the adjusted p < ALPHA and the excess is material: the replica's rate at least MIN_EXCESS above
the rate its peers would have had on its traffic (their per-stratum rates weighted by its requests) and at
least MIN_RATIO times it. The finding gives the replica's rate with its Wilson interval, that expected rate,
the peers' own rate with its Wilson interval, and the config keys of the kind on which the replica differs
from its peers (max_model_len for length, serve_options.max_queue / max_num_seqs for shed; any key for the
others). A check that ran and named nothing leaves one info finding per model.

Over time: a replica whose identity changed inside the window (diagnostics.identity_events: restarted with
another config key, weights, version ...) is compared with itself, each kind's rate after the change (until
its next change or the window's end) against its rate before it (since its previous start, or the window's
start), in the same strata and with the same test, the before side standing where the peers stand. These
tests join the model's Holm family (replicas x kinds + changes x kinds) and fire on the same thresholds, so
a rise is named even where the peers are no different (one replica, or all of them changed). A replica named
either way cites its latest change in the window ("since 05:01:10 UTC, when max_queue (serve flags) went
256 → 1"), with the rate before it when that rose; one (replica, kind) is one finding. A rise without a
change is left to the peer comparison.
"""

from __future__ import annotations

import numpy as np

from diagnostics import config_keys, identity_events
from diagnostics.findings import Finding, insufficient
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from evals.stats import cmh_greater, holm, wilson_interval
from telemetry.contract import derived, outcomes
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

DIAGNOSTIC = "availability"
KIND = "availability_gap"
CLEAN = "availability_consistent"
ALPHA = 0.01
MIN_EXCESS = 0.02  # absolute: two more requests in a hundred
MIN_RATIO = 1.5  # and half again the expected rate (a real canary at 96 tokens: 32.9% against 19.4%)
MIN_REQUESTS = 20  # of a replica (and of its peers) in the strata compared
CRITICAL_EXCESS = 0.25

# kind -> (its error codes, stratified by prompt length, the config keys that explain it: None = any)
KINDS: dict[str, tuple[frozenset, bool, tuple | None]] = {
    "length": (frozenset({"context_length"}), True, ("max_model_len", "max_position_embeddings", "max_num_batched")),
    "rejected": (frozenset(c for c, o in outcomes.ERROR_CODES.items() if o == outcomes.REJECTED) - {"context_length"},
                 False, None),
    "shed": (frozenset(c for c, o in outcomes.ERROR_CODES.items() if o == outcomes.SHED), False,
             ("max_queue", "max_num_seqs", "max_num_batched", "kv_cache", "num_kv_blocks")),
    "failed": (frozenset(c for c, o in outcomes.ERROR_CODES.items() if o in (outcomes.FAILED, outcomes.TIMED_OUT)),
               False, None),
}
LABELS = {"length": "refused for length", "rejected": "rejected", "shed": "shed", "failed": "failed"}

# requests by model, replica, workload, prompt-length bucket (-1: unknown), outcome and error code
_COUNTS_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, t.workload AS workload, "
                   "t.prompt_tokens AS prompt_tokens, t.error_code AS error_code, "
                   "t.finish_reason AS finish_reason")
_COUNTS = (f"SELECT model_name, replica_id, workload, pbucket, outcome, error_code, count() AS n FROM ("
           f"SELECT model_name, replica_id, workload, "
           f"if(prompt_tokens = 0, -1, toInt32(floor(2 * log2(prompt_tokens)))) AS pbucket, "
           f"{{outcome}} AS outcome, error_code FROM {{source}}) "
           f"WHERE workload NOT IN {ACTIVE_WORKLOADS_SQL} "
           f"GROUP BY model_name, replica_id, workload, pbucket, outcome, error_code")

_STATED_LIMITS = """
SELECT replica_id, groupUniqArray(8)(JSONExtractInt(error_detail_json, 'max_model_len')) AS limits,
       min(prompt_tokens) AS shortest
FROM requests AS t
WHERE {window} AND error_code = 'context_length' AND has({ids:Array(String)}, replica_id) AND prompt_tokens > 0
GROUP BY replica_id
"""

_PER_REPLICA = """
SELECT model_name, replica_id, count() AS requests, {counts},
       {ttft} AS ttft, {e2e} AS e2e
FROM {source}
GROUP BY model_name, replica_id ORDER BY model_name, replica_id
"""
_PER_REPLICA_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, t.error_code AS error_code, "
                        "t.finish_reason AS finish_reason, t.ttft_seconds AS ttft_seconds, "
                        "t.e2e_seconds AS e2e_seconds, t.output_tokens AS output_tokens")


def _sql(scope: Scope) -> str:
    return (_COUNTS.replace("{outcome}", outcomes.outcome_sql())
            .replace("{source}", requests_in(_COUNTS_COLUMNS, scope=scope)))


def counts(store, scope: Scope) -> list[dict]:
    """Requests by (model, replica, workload, prompt-length bucket (-1: unknown), outcome, error code)."""
    return store.query_arrow(_sql(scope), scope.parameters()).to_pylist()


def stated_limits(store, scope: Scope, replicas: list[str]) -> dict[str, dict]:
    """replica -> {"limits": the context lengths its length refusals stated, "shortest": the shortest prompt it
    refused}: the effective limit, where a config leaves it to the model (max_model_len null)."""
    sql = _STATED_LIMITS.replace("{window}", derived.window_sql("t.arrival_time"))
    rows = store.query_arrow(sql, {**scope.parameters(), "ids": replicas}).to_pylist()
    return {r["replica_id"]: {"limits": sorted(x for x in r["limits"] if x), "shortest": r["shortest"]} for r in rows}


def replica_table(store, scope: Scope) -> str:
    """Each replica's availability (the share of its requests answered, rejected, shed, failed) beside its
    latency (TTFT over requests that produced a token, e2e over those its engine had): `diagnose` prints it."""
    source = requests_in(_PER_REPLICA_COLUMNS, scope=scope)
    sql = (_PER_REPLICA.replace("{counts}", outcomes.outcome_counts_sql()).replace("{source}", source)
           .replace("{ttft}", derived.TTFT_QUANTILES_SQL)
           .replace("{e2e}", derived.quantiles_sql("e2e_seconds", outcomes.ENGINE_HAD_SQL)))
    rows = store.query_arrow(sql, scope.parameters()).to_pylist()
    if not rows:
        return ""
    share = lambda part, whole: f"{part / whole:.1%}" if whole else "-"  # noqa: E731
    ms = lambda qs, i: f"{qs[i] * 1000:.0f}" if qs and qs[i] == qs[i] else "-"  # noqa: E731 - NaN: none
    p50, p99 = derived.QUANTILE_NAMES.index("p50"), derived.QUANTILE_NAMES.index("p99")
    table = [("MODEL", "REPLICA", "REQUESTS", "ANSWERED", "REJECTED", "SHED", "FAILED", "TTFT P50 MS", "TTFT P99 MS",
              "E2E P99 MS")]
    table += [(r["model_name"], r["replica_id"], str(r["requests"]), share(r["answered"], r["requests"]),
               share(r["rejected"], r["requests"]), share(r["shed"], r["requests"]),
               share(r["failed"] + r["timed_out"], r["requests"]), ms(r["ttft"], p50), ms(r["ttft"], p99),
               ms(r["e2e"], p99)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table)


def by_replica(rows: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """(model, replica) -> requests by outcome, and their total: the availability table of the reports."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        entry = out.setdefault((r["model_name"], r["replica_id"]), {o: 0 for o in (*outcomes.OUTCOMES, "total")})
        entry[r["outcome"]] += r["n"]
        entry["total"] += r["n"]
    return out


def _tables(rows: list[dict], kind: str) -> dict[str, dict[tuple, list[int]]]:
    """replica -> stratum -> [events of the kind, requests at risk]."""
    codes, by_length, _ = KINDS[kind]
    out: dict[str, dict[tuple, list[int]]] = {}
    for r in rows:
        if r["outcome"] == outcomes.ABORTED or (by_length and r["pbucket"] < 0):
            continue  # aborts are the client's; a request of unknown length never reached the length check
        stratum = (r["workload"], r["pbucket"]) if by_length else (r["workload"],)
        cell = out.setdefault(r["replica_id"], {}).setdefault(stratum, [0, 0])
        cell[0] += r["n"] if r["error_code"] in codes else 0
        cell[1] += r["n"]
    return out


def compare(mine: dict[tuple, list[int]], peers: dict[tuple, list[int]]) -> dict | None:
    """The replica's strata against its peers' pooled ones (those both served): rates, the rate its peers'
    per-stratum rates predict on its traffic, and the one-sided Cochran-Mantel-Haenszel p. None when either
    side has fewer than MIN_REQUESTS requests in those strata. (Over time, `peers` is the replica itself
    before its change.)"""
    shared = [s for s in mine if s in peers and mine[s][1] > 0 and peers[s][1] > 0]
    a = np.array([mine[s][0] for s in shared], dtype=float)
    n1 = np.array([mine[s][1] for s in shared], dtype=float)
    c = np.array([peers[s][0] for s in shared], dtype=float)
    n2 = np.array([peers[s][1] for s in shared], dtype=float)
    if n1.sum() < MIN_REQUESTS or n2.sum() < MIN_REQUESTS:
        return None
    test = cmh_greater(a, n1, n2, a + c)
    mine_events, mine_n, peer_events, peer_n = int(a.sum()), int(n1.sum()), int(c.sum()), int(n2.sum())
    return {"events": mine_events, "requests": mine_n, "rate": mine_events / mine_n,
            "rate_ci": wilson_interval(mine_events, mine_n),
            "expected_rate": float((n1 * c / n2).sum() / n1.sum()), "peer_events": peer_events,
            "peer_requests": peer_n, "peer_rate": peer_events / peer_n,
            "peer_rate_ci": wilson_interval(peer_events, peer_n),
            "strata": len(shared), "p": test.p_value, "test": test.test}


def _material(t: dict) -> bool:
    excess = t["rate"] - t["expected_rate"]
    return excess >= MIN_EXCESS and t["rate"] >= MIN_RATIO * t["expected_rate"]


def _tests(rows: list[dict], replicas: list[str]) -> list[dict]:
    out = []
    for kind in KINDS:
        tables = _tables(rows, kind)
        for rid in replicas:
            peers: dict[tuple, list[int]] = {}
            for other in replicas:
                if other != rid:
                    for stratum, (e, n) in tables.get(other, {}).items():
                        cell = peers.setdefault(stratum, [0, 0])
                        cell[0] += e
                        cell[1] += n
            t = compare(tables.get(rid, {}), peers)
            if t is not None:
                out.append({"replica": rid, "kind": kind, "against": "peers", **t})
    return out


def _spans(evs: list, scope: Scope) -> list[tuple]:
    """(change, since, at, until) for each change inside the window: the replica ran under its old identity
    over [since, at) and under its new one over [at, until)."""
    start, end = scope.bounds()
    later = {e.time: n.time for e, n in zip(evs, evs[1:])}
    return [(e, max(start, e.previous_start), e.time, min(end, later.get(e.time, end)))
            for e in identity_events.in_window(evs, scope)]


def _over_time(store, scope: Scope, model: str, replicas: list[str], changes: dict) -> list[dict]:
    """Each changed replica's rate of each kind after its change against before it, like for like: `compare`
    with the before side as the peers (its `peer_*` fields renamed `before_*`)."""
    out = []
    for rid in replicas:
        for event, since, at, until in _spans(changes.get(rid, []), scope):
            if since >= at:
                continue  # it changed at the window's start: nothing of the old identity to compare with
            sides = [[r for r in counts(store, scope.narrowed(start=a, end=b, replicas=(rid,)))
                      if r["model_name"] == model] for a, b in ((since, at), (at, until))]
            for kind in KINDS:
                before, after = (_tables(rows, kind).get(rid, {}) for rows in sides)
                t = compare(after, before)
                if t is not None:
                    t = {k.replace("peer_", "before_"): v for k, v in t.items()}
                    out.append({"replica": rid, "kind": kind, "against": "before", "event": event.describe(), **t})
    return out


def _wanted(kind: str):
    keys = KINDS[kind][2]
    return (lambda key: True) if keys is None else (lambda key: any(k in key for k in keys))


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    rows = counts(store, scope)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    changes = identity_events.events(store, scope)
    findings: list[Finding] = []
    table = by_replica(rows)
    for model in sorted({m for m, _ in table}):
        replicas = sorted(rid for m, rid in table if m == model)
        mine = [r for r in rows if r["model_name"] == model]
        availability = {rid: table[(model, rid)] for rid in replicas}
        tests = (_tests(mine, replicas) if len(replicas) > 1 else []) + \
            _over_time(store, scope, model, replicas, changes)
        for t, q in zip(tests, holm([t["p"] for t in tests])):
            t["holm_p"] = q
        named = [t for t in tests if t["holm_p"] < ALPHA and _material(t)]
        limits = stated_limits(store, scope, replicas) if any(t["kind"] == "length" for t in named) else {}
        for rid, kind in sorted({(t["replica"], t["kind"]) for t in named}):
            findings.append(_finding(model, rid, kind, [t for t in named if (t["replica"], t["kind"]) == (rid, kind)],
                                     replicas, identity, scope, len(tests), availability, limits,
                                     identity_events.in_window(changes.get(rid, []), scope)))
        if len(replicas) < 2:
            findings.append(insufficient(KIND, model, DIAGNOSTIC, scope,
                                         f"{model} has one replica in the window ({replicas[0]}): no peers to "
                                         "compare its error, rejection and shed rates with",
                                         model_name=model, availability=availability, tests=tests))
        elif not named:
            findings.append(Finding(CLEAN, "info", model, _clean_summary(model, replicas, tests, availability),
                                    DIAGNOSTIC, scope, {"model_name": model, "replicas": replicas,
                                                        "tests_in_family": len(tests), "availability": availability,
                                                        "tests": tests}))
    return findings


def _clean_summary(model: str, replicas: list[str], tests: list[dict], availability: dict) -> str:
    rates = ", ".join(f"{rid} {1 - a['answered'] / a['total']:.1%}" for rid, a in availability.items() if a["total"])
    changed = sorted({t["replica"] for t in tests if t["against"] == "before"})
    since = f", nor more since its identity changed than before ({', '.join(changed)})" if changed else ""
    return (f"{model}: no replica refuses, sheds or fails more than its peers in the same workload and prompt-length "
            f"strata{since} ({len(tests)} tests, Holm alpha {ALPHA}); requests not answered: {rates}")


def _finding(model, rid, kind, named, replicas, identity, scope, family, availability, limits, changed) -> Finding:
    """One (replica, kind): named against its peers, after a change of its identity against before it, or both;
    the summary leads with the peer comparison where that named it."""
    peer = next((t for t in named if t["against"] == "peers"), None)
    rose = [t for t in named if t["against"] == "before"]
    strata = "workload and prompt-length strata" if KINDS[kind][1] else "workloads"
    if rose:  # the latest change it rose after
        event = next(e for e in reversed(changed) if e.time == rose[-1]["event"]["time"])
    else:
        event = changed[-1] if changed else None
    t = peer or rose[-1]
    low, high = t["rate_ci"]
    peers = [p for p in replicas if p != rid]
    diffs = config_keys.differences(identity.get(rid, {}), [identity.get(p, {"replica_id": p}) for p in peers],
                                    _wanted(kind))
    if peer:
        summary = (f"{rid} ({model}) {LABELS[kind]} {t['rate']:.1%} of its requests [{low:.1%}, {high:.1%}] vs "
                   f"{t['expected_rate']:.1%} expected from its peers' rates in the same {strata} (peers: "
                   f"{t['peer_rate']:.1%} of {t['peer_requests']}; p={t['p']:.1e}, Holm {t['holm_p']:.1e})")
        summary += _why(rid, kind, replicas, diffs, limits)
        if event:
            summary += f"; {event.since()}" + (f" ({_before(rose[-1])})" if rose else "")
    else:
        summary = (f"{rid} ({model}) {LABELS[kind]} {t['rate']:.1%} of its requests [{low:.1%}, {high:.1%}] "
                   f"{event.since()}, vs {t['expected_rate']:.1%} expected from its own rates before it in the same "
                   f"{strata} ({_before(t)})" +
                   ("; its peers do not differ enough to name it" if peers else "; it has no peers"))
    excess = t["rate"] - t["expected_rate"]
    evidence = {"model_name": model, "replica": rid, "outcome": kind, "codes": sorted(KINDS[kind][0]),
                "peers": peers, "comparison": t, "against": t["against"], "over_time": rose,
                "config_differences": diffs, "availability": availability, "tests_in_family": family,
                "unit": "request", "stated_limits": limits,
                "correction": f"Holm over {family} tests (replicas x outcome kinds, and identity changes x outcome "
                              "kinds)",
                "strata": "workload x prompt-length bucket (sqrt 2)" if KINDS[kind][1] else "workload"}
    if event:  # cited here, with the test against it: diagnostics.run's generic citation leaves it
        evidence["identity_events"] = [event.describe()]
    # the subject is the replica (as every replica finding's); each outcome kind a finding of its own id
    return Finding(KIND, "critical" if excess >= CRITICAL_EXCESS else "warning", rid, summary, DIAGNOSTIC, scope,
                   evidence, id_kind=f"{KIND}:{kind}")


def _before(t: dict) -> str:
    return (f"before it: {t['before_rate']:.1%} of {t['before_requests']}; p={t['p']:.1e}, "
            f"Holm {t['holm_p']:.1e}")


def _why(rid, kind, replicas, diffs, limits) -> str:
    """The identity keys of the kind on which the replica differs from its peers, and the limits its length
    refusals stated."""
    why = ("; config differs: " + config_keys.describe(diffs)) if diffs else \
        "; no identity key of it differs from its peers' (look at its host and its clients)"
    if kind == "length" and limits.get(rid):
        peer_limits = sorted({x for p in replicas if p != rid for x in limits.get(p, {}).get("limits", [])})
        why += (f"; its refusals state a context of {'/'.join(map(str, limits[rid]['limits']))} tokens (shortest "
                f"prompt refused: {limits[rid]['shortest']})" +
                (f", its peers' {'/'.join(map(str, peer_limits))}" if peer_limits else ""))
    return why
