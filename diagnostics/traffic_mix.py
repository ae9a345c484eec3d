"""Traffic mix: a replica whose requests of the same workload end differently from its peers'
(`output_mix_shift`), reported as what it is instead of as a latency verdict.

Per (model, workload), each replica's requests against its peers' pooled requests:
- finish reasons: chi-square of homogeneity of the share that ran to the budget ('length') among
  requests that ended by 'stop' or 'length' (2 x 2: replica vs peers);
- output length relative to the request's budget (telemetry.contract.derived.OUTPUT_FRACTION_SQL:
  output_tokens / max_tokens from sampling_params_json when set): Mann-Whitney U + Kolmogorov-Smirnov
  (evals.stats.compare_samples, the larger p).
Holm over replicas x workloads x the two tests (per model). A shifted replica shifts its peers' pools
too, so replicas are named one at a time (the largest shift first; of two, the one running to its
budget more often), the rest re-tested against pools without it. It fires when the adjusted p < ALPHA and
the shift is material: the 'length' share differs by MIN_SHARE_DIFF or more, or Cliff's delta on the
output fraction is at least medium. Its evidence names the config keys about ending a sequence (eos /
bos ids under `generation`, stop settings, ignore_eos, max_tokens) on which the replica differs from
its peers: an eos id changed makes every request run to max_tokens, longer e2e but not slower.
"""

from __future__ import annotations

import numpy as np

from diagnostics import config_keys
from diagnostics.findings import Finding
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from evals.stats import DELTA_MEDIUM, chi_square_homogeneity, compare_samples, holm
from telemetry.contract import derived
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

KIND = "output_mix_shift"
ALPHA = 0.01
MIN_REQUESTS = 20  # per side and workload
MIN_SHARE_DIFF = 0.2
SAMPLE = 2000
ENDING_KEYS = ("eos", "bos", "stop", "ignore_eos", "max_tokens", "generation.")

_COLUMNS = (f"t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
            f"t.finish_reason AS finish_reason, "
            f"{derived.OUTPUT_FRACTION_SQL.replace('sampling_params_json', 't.sampling_params_json')} AS fraction, "
            f"{derived.MAX_TOKENS_SQL.replace('sampling_params_json', 't.sampling_params_json')} AS max_tokens")
_SQL = """
SELECT model_name, workload, replica_id, count() AS n,
       countIf(finish_reason = 'length') AS length_n, countIf(finish_reason = 'stop') AS stop_n,
       groupArraySample({sample}, 11)(fraction) AS fractions, median(max_tokens) AS max_tokens
FROM {source}
WHERE finish_reason NOT IN ('abort', 'error') AND workload NOT IN {active}  -- client traffic only
GROUP BY model_name, workload, replica_id
ORDER BY model_name, workload, replica_id
"""


def _sql(scope: Scope) -> str:
    return (_SQL.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", requests_in(_COLUMNS, scope=scope))
            .replace("{sample}", str(SAMPLE)))


def _wanted(key: str) -> bool:
    return any(k in key for k in ENDING_KEYS)


def _tests(me: dict, peers: list[dict]) -> dict:
    """{"finish": (test, evidence) | None, "length": (test, evidence) | None} for one replica and workload."""
    out: dict = {"finish": None, "length": None}
    ended = lambda r: r["length_n"] + r["stop_n"]  # noqa: E731
    mine_n, peers_n = ended(me), sum(ended(p) for p in peers)
    mine_len, peers_len = me["length_n"], sum(p["length_n"] for p in peers)
    if mine_n >= MIN_REQUESTS and peers_n >= MIN_REQUESTS:
        chi = chi_square_homogeneity([mine_len, peers_len], [mine_n, peers_n])
        if chi is not None:
            share, peer_share = mine_len / mine_n, peers_len / peers_n
            out["finish"] = (chi, {"length_share": share, "peers_length_share": peer_share,
                                   "difference": share - peer_share, "chi2": chi.statistic, "p": chi.p_value,
                                   "requests": mine_n, "peer_requests": peers_n,
                                   "material": abs(share - peer_share) >= MIN_SHARE_DIFF,
                                   "test": "chi-square of homogeneity (stop vs length), replica vs peers"})
    mine = np.asarray(me["fractions"], dtype=float)
    theirs = np.concatenate([np.asarray(p["fractions"], dtype=float) for p in peers])
    c = compare_samples(theirs, mine, bootstrap=False, min_samples=MIN_REQUESTS)
    if c is not None:
        out["length"] = (c, {"median_fraction": c.median_candidate, "peers_median_fraction": c.median_baseline,
                                     "cliffs_delta": c.cliffs_delta, "mwu_p": c.mwu_p, "ks_p": c.ks_p,
                                     "max_tokens": me["max_tokens"],
                                     "material": abs(c.cliffs_delta) >= DELTA_MEDIUM,
                                     "unit": "output_tokens / max_tokens per request (raw count without max_tokens)",
                                     "test": c.test})
    return out


def _round(groups: dict, model: str, excluded: set) -> tuple[list, int]:
    """The material shifts (replica, workload, tests, strength) with Holm-adjusted p < ALPHA, replicas
    already named left out of every pool; and the family size."""
    tests = []  # (replica, workload, test name, TestResult, evidence)
    for (m, workload), group in groups.items():
        group = [r for r in group if r["replica_id"] not in excluded]
        if m != model or len(group) < 2:
            continue
        for me in group:
            peers = [p for p in group if p["replica_id"] != me["replica_id"]]
            for name, result in _tests(me, peers).items():
                if result is not None:
                    tests.append((me["replica_id"], workload, name, *result))
    adjusted = holm([test for _, _, _, test, _ in tests]) if tests else []
    shifted: dict[str, dict] = {}
    for (rid, workload, name, _, ev), q in zip(tests, adjusted):
        if q < ALPHA and ev["material"]:
            shifted.setdefault(rid, {}).setdefault(workload, {})[name] = {**ev, "holm_p": q}
    return list(shifted.items()), len(tests)


def _strength(by_workload: dict) -> tuple[float, float]:
    # the most shifted replica is named first; between two, the one running to its budget more often
    effect = max(abs(t.get("difference", t.get("cliffs_delta", 0.0))) for w in by_workload.values()
                 for t in w.values())
    share = max(w.get("finish", {}).get("length_share", 0.0) for w in by_workload.values())
    return effect, share


def run(store, request: DiagnosticRequest, identity: dict | None = None) -> list[Finding]:
    """A shifted replica also shifts its peers' pools, so replicas are named one at a time: the most
    shifted one, then the others re-tested against pools without it, until nothing fires. `identity`
    ({replica id: its replicas row}): the caller's, where it has read them already."""
    scope = request.scope
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)} if identity is None else identity
    rows = store.query_arrow(_sql(scope), scope.parameters()).to_pylist()
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model_name"], r["workload"]), []).append(r)
    findings = []
    for model in sorted({m for m, _ in groups}):
        replicas = sorted({r["replica_id"] for (m, _), g in groups.items() if m == model for r in g})
        excluded: set = set()
        while True:
            shifted, family = _round(groups, model, excluded)
            if not shifted:
                break
            rid, by_workload = max(shifted, key=lambda kv: _strength(kv[1]))
            findings.append(_finding(model, rid, by_workload, [r for r in replicas if r not in excluded],
                                     identity, scope, family))
            excluded.add(rid)
    return findings


def _finding(model, rid, by_workload, replicas, identity, scope, family) -> Finding:
    peers = [identity.get(p, {"replica_id": p}) for p in replicas if p != rid]
    diffs = config_keys.differences(identity.get(rid, {}), peers, _wanted)
    workload, tests = next(iter(sorted(by_workload.items())))
    parts = []
    if "finish" in tests:
        t = tests["finish"]
        parts.append(f"{t['length_share']:.0%} of its requests ran to max_tokens vs {t['peers_length_share']:.0%} "
                     f"on its peers (chi-square p={t['p']:.1e})")
    if "length" in tests:
        t = tests["length"]
        parts.append(f"median output {t['median_fraction']:.2f} of the budget vs {t['peers_median_fraction']:.2f} "
                     f"(Cliff's delta {t['cliffs_delta']:+.2f}, MWU p={t['mwu_p']:.1e})")
    why = ("; config differs: " + config_keys.describe(diffs)) if diffs else \
        "; no eos / stop config difference recorded (look at the clients' stop settings)"
    summary = (f"{rid} ({model}, workload {workload}) ends its outputs differently from its peers: "
               + "; ".join(parts) + why + " - latency on e2e is not compared for it")
    evidence = {"model_name": model, "replica": rid, "peers": [p["replica_id"] for p in peers],
                "workloads": by_workload, "config_differences": diffs, "tests_in_family": family,
                "unit": "request", "correction": f"Holm over {family} tests (replicas x workloads x tests)",
                "method": "finish-reason mix (chi-square) and output length relative to max_tokens (MWU + KS) "
                          "against the peers' pooled requests of the same workload"}
    return Finding(KIND, "warning", rid, summary, "replicas", scope, evidence)
