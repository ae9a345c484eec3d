"""Cross-scoring: a replica whose weights differ, seen in sampled traffic by teacher-forced rescoring.

A rescore round (engine/traffic/probe/rescore.py) sends requests replica R served, as prompt + output with
prompt_logprobs, to every replica S of the model, R itself included. Same weights give the same
logprob to every token up to numerical noise (batch composition: ~1e-5..1e-4 nats in fp32);
int4, a coarse quantization group or noisy weights move every token's logprob, even where the model
stays confident (so the sampled-token logprobs alone, diagnostics/quality.py, see nothing).

Unit: the request (paired). For each rescore row of scorer S and the original request of R, in SQL:
    d(R, S, req) = mean over the output positions of |lp_S(token) - lp_R(token)|
(lp_R: R's recorded output_logprobs; lp_S: S's prompt_logprobs sliced to the output positions), and
the signed mean of lp_S - lp_R. Control: the self-rescoring d(R, R, req) of the same request, the
numerical floor under the same conditions. Per ordered pair (R, S != R):
- test: one-sided Wilcoxon signed-rank on d(R, S, req) - d(R, R, req) over the requests both scored;
- Holm over all pairs of the model;
- effect: mean cross d over requests, 95% CI from a bootstrap over requests; a pair differs when
  p_holm < ALPHA, the CI's low end is above FLOOR_FACTOR x the self mean (above the numerical floor
  measured under the same conditions), and the mean itself is at least MIN_EFFECT nats/token
  (material: kernel-level differences between replicas with equal weights, which self-rescoring
  does not see, stay ~1e-5..1e-4). The mean, not the median: other weights move the logprobs of the tokens the model is
  unsure of, and a typical (median) request of a small, confident model has few of them (on the
  reference model int4 g128 moves the median request by ~3e-5 nats/token, the mean by ~5e-3,
  the same order as kernel-level differences between replicas with equal weights: the median
  cannot tell the two apart).
Naming: 2 replicas: the baseline rule (diagnostics.baseline) says which is the canary; where it decides
nothing (started together, no role, no pin) the finding is on the pair ("r0 vs r1"), a warning at most (the same
identity: the later started); 3+: the replica every one of whose pairs (either direction) differs
while its peers' pairs among themselves do not. Differing pairs that fit no single replica: a
warning about the model, naming the pairs. Pairs with fewer than MIN_REQUESTS paired requests:
`insufficient data`, saying how many more rescored requests are needed.
"""

from __future__ import annotations

import numpy as np

from diagnostics.baseline import baselines_by_model
from diagnostics.findings import Finding, insufficient
from diagnostics.replicas import differs_in, identity_differences
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import replicas_in, requests_in
from evals.stats import holm, mean_interval, signed_rank_greater
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL, RESCORE_ORIGINAL_SQL, RESCORE_WORKLOAD

DIAGNOSTIC = "rescore"
KIND = "cross_score_shift"
ALPHA = 0.05
MIN_REQUESTS = 8  # paired requests per pair (Wilcoxon n=8: smallest one-sided p 1/256)
MIN_EFFECT = 1e-3  # nats/token of mean cross d: well above fp32 batch / kernel noise (~1e-5..1e-4)
FLOOR_FACTOR = 10.0  # the CI's low end above 10x the self-rescoring mean of the same requests
CRITICAL = 0.05  # nats/token, the CI's low end: a visibly different model

_ORIGINAL_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, t.request_id AS request_id, "
                     "t.workload AS workload, t.output_logprobs AS output_logprobs, "
                     "t.prompt_token_ids AS prompt_token_ids, t.output_token_ids AS output_token_ids")
# the scorer rows (small: a few per served request) on the right of the join, the originals pruned
# by IN before their arrays are read
_QUERY = f"""
SELECT model_name, served, scorer, request_id, arrayAvg(arrayMap(x -> abs(x), diff)) AS d, arrayAvg(diff) AS signed
FROM (
SELECT o.model_name AS model_name, o.replica_id AS served, s.replica_id AS scorer, o.request_id AS request_id,
       -- the scorer's logprobs of the output positions minus the server's sampled-token logprobs
       arrayMap((a, b) -> a - b, arraySlice(s.prompt_logprobs, length(o.prompt_token_ids),
                                            length(o.output_token_ids)), o.output_logprobs) AS diff
FROM (
    SELECT t.model_name AS model_name, t.replica_id AS replica_id, t.request_id AS request_id,
           t.output_logprobs AS output_logprobs, t.prompt_token_ids AS prompt_token_ids,
           t.output_token_ids AS output_token_ids
    FROM {{originals}} AS t
    WHERE t.workload NOT IN {ACTIVE_WORKLOADS_SQL} AND length(t.output_token_ids) >= 2
      AND length(t.output_logprobs) = length(t.output_token_ids)
      AND t.request_id IN (SELECT original FROM {{scorers}})
) AS o
INNER JOIN {{scorers}} AS s ON s.original = o.request_id
-- the scorer's prompt is exactly the original's prompt + output (request ids repeat across replicas)
WHERE s.prompt_token_ids = arrayConcat(o.prompt_token_ids, o.output_token_ids)
  AND length(s.prompt_logprobs) = length(s.prompt_token_ids) - 1
)
"""
_SCORERS = (f"(SELECT replica_id, prompt_logprobs, prompt_token_ids, {RESCORE_ORIGINAL_SQL} AS original "
            f"FROM requests WHERE workload = '{RESCORE_WORKLOAD}' AND finish_reason IN ('stop', 'length') "
            f"AND arrival_time >= {{start:Float64}} AND original != '')")


def read_scores(store, scope) -> dict[str, dict[str, dict[str, dict[str, tuple[float, float]]]]]:
    """model -> served R -> scorer S -> request id -> (d, signed)."""
    sql = _QUERY.replace("{originals}", requests_in(_ORIGINAL_COLUMNS, scope=scope)).replace("{scorers}", _SCORERS)
    out: dict = {}
    for r in store.query_arrow(sql, scope.parameters()).to_pylist():
        out.setdefault(r["model_name"], {}).setdefault(r["served"], {}).setdefault(r["scorer"], {})[
            r["request_id"]] = (float(r["d"]), float(r["signed"]))
    return out


# -- statistics --------------------------------------------------------------------------------------

def _normal_ci(x: np.ndarray) -> tuple[float, float]:
    half = 1.96 * float(np.std(x, ddof=1)) / np.sqrt(len(x)) if len(x) > 1 else float("inf")
    return float(np.mean(x)) - half, float(np.mean(x)) + half


def compare_pair(served: dict, scorer: str, owner: str) -> dict | None:
    """The paired comparison of pair (owner served, scorer scored) against owner's self-rescoring."""
    cross, self_ = served.get(scorer, {}), served.get(owner, {})
    ids = sorted(set(cross) & set(self_))
    c = np.array([cross[i][0] for i in ids])
    s = np.array([self_[i][0] for i in ids])
    signed = np.array([cross[i][1] for i in ids])
    return dict(served=owner, scorer=scorer, n=len(ids), cross=c, self=s, signed=signed)


def decide(pairs: list[dict], rng) -> None:
    """Test, Holm, effect and CI for every pair with enough requests (in place: p, p_holm, ci, differs)."""
    tested = [p for p in pairs if p["n"] >= MIN_REQUESTS]
    tests = [signed_rank_greater(p["cross"] - p["self"]) for p in tested]
    for p, test, q in zip(tested, tests, holm(tests)):
        p["p"] = test.p_value
        p["p_holm"] = q
        p["median_cross"], p["median_self"] = float(np.median(p["cross"])), float(np.median(p["self"]))
        p["mean_cross"], p["mean_self"] = float(np.mean(p["cross"])), float(np.mean(p["self"]))
        # the bootstrap only where the test decides (a finding needs it); elsewhere the normal approximation
        p["ci"] = mean_interval(p["cross"], rng) if q < ALPHA else _normal_ci(p["cross"])
        p["floor"] = FLOOR_FACTOR * p["mean_self"]
        p["differs"] = bool(q < ALPHA and p["ci"][0] > p["floor"] and p["mean_cross"] >= MIN_EFFECT)


# -- naming ------------------------------------------------------------------------------------------

def differing_replica(replicas: list[str], differs: set[frozenset]) -> str | None:
    """3+: the one replica all of whose pairs differ while no pair among the others does."""
    for x in replicas:
        others = [r for r in replicas if r != x]
        if all(frozenset((x, o)) in differs for o in others) and not any(
                frozenset((a, b)) in differs for a in others for b in others if a < b):
            return x
    return None


def canary_of_two(replicas: list[str], baseline, identity: dict) -> tuple[str, str]:
    """(canary, baseline side) of two replicas: the baseline rule, else the later started."""
    base = [r for r in replicas if baseline is not None and r in baseline.replicas]
    if len(base) == 1:
        return next(r for r in replicas if r != base[0]), base[0]
    first, later = sorted(replicas, key=lambda r: (str(identity.get(r, {}).get("started", "")), r))
    return later, first


# -- the diagnostic ----------------------------------------------------------------------------------

def scored_fleet(store, request: DiagnosticRequest) -> tuple[dict, dict, dict]:
    """(read_scores' data, identity by replica, baseline by model): what every cross-score rule starts from."""
    data = read_scores(store, request.scope)
    if not data:
        return {}, {}, {}
    identity = {r["replica_id"]: r for r in replicas_in(store, request.scope)}
    rows = [identity[r] for m in data.values() for r in m if r in identity]
    return data, identity, baselines_by_model(store, rows, request, models=data)


def name_subject(replicas: list[str], differs: set[frozenset], baseline, identity: dict, evidence: dict) -> str | None:
    """Which replica the differing pairs name (None: no single one), its baseline written into `evidence`:
    two replicas, the baseline rule; three or more, the one that differs from peers that agree."""
    if len(replicas) == 2:
        subject, base = canary_of_two(replicas, baseline, identity)
        evidence["baseline"] = baseline.describe() if baseline is not None else {"rule": "earlier_started",
                                                                                 "replicas": [base]}
        return subject
    subject = differing_replica(replicas, differs)
    evidence["baseline"] = {"rule": "agreeing_peers", "replicas": [r for r in replicas if r != subject]}
    return subject


def run_scored_models(store, request: DiagnosticRequest, model_findings) -> list[Finding]:
    """The cross-score rules' driver: `model_findings(model, served, replicas, identity, baseline, scope, rng)`
    once per model with scored requests, one seeded rng shared in model order (reproducible CIs)."""
    data, identity, baselines = scored_fleet(store, request)
    if not data:
        return []
    rng = np.random.default_rng(0)
    findings: list[Finding] = []
    for model, served in sorted(data.items()):
        replicas = sorted(set(served) | {s for by in served.values() for s in by})
        findings += model_findings(model, served, replicas, identity, baselines.get(model), request.scope, rng)
    return findings


def run(store, request: DiagnosticRequest) -> list[Finding]:
    return run_scored_models(store, request, _scored_model)


def _scored_model(model, served, replicas, identity, baseline, scope, rng) -> list[Finding]:
    pairs = [compare_pair(served[r], s, r) for r in sorted(served) for s in replicas
             if s != r and s in served[r]]
    decide(pairs, rng)
    return (_insufficient(model, [p for p in pairs if p["n"] < MIN_REQUESTS], scope)
            + _model_findings(model, replicas, [p for p in pairs if "p_holm" in p], identity, baseline, scope,
                              untested={frozenset((p["served"], p["scorer"])) for p in pairs if "p_holm" not in p}))


def _insufficient(model: str, pairs: list[dict], scope) -> list[Finding]:
    return [insufficient(KIND, f"{p['served']} scored by {p['scorer']}", DIAGNOSTIC, scope,
                         f"{p['n']} requests of {p['served']} rescored by both {p['scorer']} and {p['served']} "
                         f"itself; need >= {MIN_REQUESTS} ({MIN_REQUESTS - p['n']} more: continuous "
                         f"cross-scoring's share ([cross_score] share), or `infersight probe --rescore N`)",
                         requests=p["n"], needed=MIN_REQUESTS, model_name=model, served=p["served"],
                         scorer=p["scorer"]) for p in pairs]


def _pair_evidence(p: dict) -> dict:
    return {"served": p["served"], "scorer": p["scorer"], "requests": p["n"],
            "median_cross_nats": p["median_cross"], "ci95": p["ci"], "median_self_nats": p["median_self"],
            "mean_cross_nats": p["mean_cross"], "mean_self_nats": p["mean_self"],
            "mean_signed_nats": float(np.mean(p["signed"])), "floor_nats": p["floor"], "p": p["p"],
            "p_holm": p["p_holm"], "differs": p["differs"]}


def _model_findings(model, replicas, pairs, identity, baseline, scope, untested=frozenset()) -> list[Finding]:
    if not pairs:
        return []
    evidence = {
        "model_name": model, "replicas": replicas,
        "unit": "request (paired): mean over its output positions of |scorer's teacher-forced logprob - "
                "the serving replica's sampled-token logprob|, nats/token",
        "control": "self-rescoring: the same requests scored by the replica that served them",
        "test": "one-sided Wilcoxon signed-rank on cross d - self d per request, Holm over the model's pairs",
        "effect": f"mean cross d over requests, 95% CI: bootstrap over requests; its low end must exceed "
                  f"{FLOOR_FACTOR:g} x the self mean, the mean {MIN_EFFECT:g} nats/token",
        "controlled_for": ["model", "the request (same prompt and output on both sides)",
                           "numerical noise (self-rescoring under the same conditions)"],
        "pairs": [_pair_evidence(p) for p in pairs],
    }
    hits = [p for p in pairs if p["differs"]]
    if not hits:
        return [Finding("cross_scores_agree", "info", model,
                        f"{model}: cross-scoring agrees on {len(pairs)} replica pairs (mean cross "
                        f"{max(p['mean_cross'] for p in pairs):.2g} nats/token at most)", DIAGNOSTIC, scope,
                        evidence, id_kind=KIND)]
    subject = name_subject(replicas, {frozenset((p["served"], p["scorer"])) for p in hits}, baseline, identity,
                           evidence)
    if subject is None:
        names = ", ".join(f"{p['served']}->{p['scorer']}" for p in hits)
        tested = {frozenset((p["served"], p["scorer"])) for p in pairs}
        if untested - tested:  # a pair not yet tested either way may still name one replica: wait for it
            return [insufficient(KIND, model, DIAGNOSTIC, scope,
                                 f"cross-scoring differs on {names}, and {len(untested - tested)} replica pair(s) "
                                 f"have fewer than {MIN_REQUESTS} scored requests either way: which replica differs "
                                 "is not known yet", model_name=model, pairs=evidence["pairs"])]
        return [Finding(KIND, "warning", model, f"{model}: cross-scoring differs on pairs {names}, which no single "
                        f"replica explains (several replicas differ?)", DIAGNOSTIC, scope, evidence)]
    mine = [p for p in hits if subject in (p["served"], p["scorer"])]
    lead = max(mine, key=lambda p: p["ci"][0])
    peers = [r for r in replicas if r != subject]
    diffs = identity_differences(identity.get(subject, {}), [identity[p] for p in peers if p in identity])
    evidence["replica"], evidence["identity_differences"] = subject, diffs
    summary = (f"{subject} ({model}) scores tokens differently from {', '.join(peers)}: pair "
               f"{lead['served']}->{lead['scorer']} mean |dlogprob| {lead['mean_cross']:.3g} nats/token "
               f"[95% CI {lead['ci'][0]:.3g}, {lead['ci'][1]:.3g}] vs self-rescoring {lead['mean_self']:.2g} "
               f"over {lead['n']} requests, Wilcoxon signed-rank p_holm={lead['p_holm']:.2g}; "
               f"{len(mine)} of {len(pairs)} pairs differ")
    if diffs:
        summary += "; differs in " + differs_in(diffs, 4)
    severity = "critical" if lead["ci"][0] >= CRITICAL else "warning"
    if len(replicas) == 2 and baseline is not None and not baseline.decided:
        # started together, no role, no pin: which side is off is not known; one finding on the pair
        pair = " vs ".join(sorted(replicas))
        evidence["symmetric"] = True
        summary = f"{pair}: {summary}; no baseline: {baseline.reason}"
        return [Finding(KIND, "warning", pair, summary, DIAGNOSTIC, scope, evidence)]
    return [Finding(KIND, severity, subject, summary, DIAGNOSTIC, scope, evidence)]
