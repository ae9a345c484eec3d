"""Quality drift from sampled traffic: is one replica less (or more) sure of the tokens it samples?

Under sampled, load-balanced traffic no two requests are the same, so exact-token checks
(diagnostics/drift.py, diagnostics/probe.py) have nothing to pair. What every request
does carry is `requests.output_logprobs`: the raw logprob of each token it sampled. A damaged
model (coarse int4, noisy weights ...) puts less mass on the tokens it then picks.

Algorithm:
1. In ClickHouse, per request (the unit): the mean of its first K = 16 sampled-token logprobs
   (its negative is the per-token surprisal, the entropy estimate under sampling) and the share of
   those tokens with p < 5% (the low-probability tail). Only the first K tokens: the length of an
   output must not move the per-request statistic. A request without sampled-token logprobs (the
   recording proxy asks for them on a share of requests only: `--logprobs-fraction`) is not measured:
   it is left out, never counted as a value; the share is chosen by a hash of the request id, so the
   measured requests are a uniform sample of the traffic. Requests are put in strata of
   model x workload x prompt family (diagnostics.prompt_family: shared prompt head, prompt length)
   x sampling (temperature, top-p, top-k bucket) x output-length bucket (how many of the K tokens exist); per (model, replica, stratum): counts, means and a
   uniform sample of at most CAP requests.
2. Per model, the subject against its peers: 2 replicas: the canary against the baseline
   (diagnostics.baseline: a pin, the requested side, a role, or the first-deployed identity; where none
   decides, the finding is on the pair, "r0 vs r1", a warning at most); 3+: each
   replica against the pooled others, peeling: the most shifted significant replica leaves the
   pool and all are compared again (one damaged replica in the pool must not make its healthy
   peers look shifted). Only strata where both sides have >= MIN_PER_STRATUM requests.
3. The test: van Elteren's stratified Wilcoxon-Mann-Whitney (within-stratum rank sums, weights
   1 / (N_s + 1), ties corrected); the effect: the difference of means standardized to the
   subject's stratum counts, with a percentile bootstrap CI resampling requests within strata
   (computed where the test is significant and the CI decides; elsewhere its normal approximation).
4. Holm over every (replica, metric) test of the run; a finding where the adjusted p < ALPHA,
   the CI excludes 0 and the effect is at least 10% of the peers' own level (and an absolute
   floor): how sure a model is depends on the model and the task. Critical from 50%. Where exact-token findings exist for
   the replica (drift / probe in the findings table) the summary says they are the stronger evidence.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from diagnostics import prompt_family
from diagnostics.baseline import baselines_by_model
from diagnostics.findings import Finding, insufficient
from diagnostics.replicas import differs_in, identity_differences
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from evals.stats import holm, van_elteren
from evals.stats.stratified import standardized_difference
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

DIAGNOSTIC = "quality"
KIND = "sampled_logprob_shift"
K = 16  # tokens per request: the first K (output length must not move the statistic)
MIN_TOKENS = 2  # one token says too little about a request (short answers are the length stratum '2-3')
LOW_LOGPROB = float(np.log(0.05))  # a token the model itself gave < 5%
CAP = 1000  # requests sampled per (replica, stratum) for the test and the bootstrap
MIN_PER_STRATUM = 5
MIN_REQUESTS = 20  # per side, over the shared strata
ALPHA = 0.01
# name -> (unit, smallest absolute effect worth a finding). The floor is relative too: how sure a model
# is depends on the model and the task, so an effect counts from REL_FLOOR of the peers' own level
# (10% more or less surprisal per token) and is critical from REL_CRITICAL.
METRICS = {
    "mean_logprob": ("nats/token", 0.01),
    "low_prob_share": ("share of tokens", 0.005),
}
REL_FLOOR, REL_CRITICAL = 0.10, 0.50
EXACT_EVIDENCE = ("drift", "probe")  # diagnostics whose token-exact findings outrank this one

_STRATUM = f"""concat(workload, '|', family, '|T', multiIf(temp = 0, '0', temp <= 0.5, '<=0.5', temp <= 0.85, '<=0.85',
        temp <= 1.1, '<=1.1', '>1.1'), '|p', multiIf(top_p >= 1, '1', top_p >= 0.9, '>=0.9', top_p >= 0.5, '>=0.5',
        '<0.5'), '|k', multiIf(top_k <= 0, 'off', top_k < 20, '<20', '>=20'),
        '|n', multiIf(n_tok >= {K}, '{K}', n_tok >= 8, '8-{K - 1}', n_tok >= 4, '4-7', '{MIN_TOKENS}-3'))"""

_QUERY_COLUMNS = (f"{prompt_family.COLUMNS}, t.replica_id AS replica_id, "
                  "t.output_logprobs AS output_logprobs, t.sampling_params_json AS sampling_params_json, "
                  "t.finish_reason AS finish_reason")
_CLIENT = f"(SELECT * FROM {{source}} WHERE workload NOT IN {ACTIVE_WORKLOADS_SQL})"

_QUERY = f"""
SELECT model_name, replica_id, stratum, count() AS n,
       groupArraySample({CAP}, 7)((mean_lp, low_share)) AS sample
FROM (
    SELECT model_name, replica_id, {_STRATUM} AS stratum, arrayAvg(head) AS mean_lp,
           arrayAvg(arrayMap(x -> x < {LOW_LOGPROB}, head)) AS low_share
    FROM (
        SELECT t.model_name AS model_name, t.replica_id AS replica_id, t.workload AS workload, t.family AS family,
               arraySlice(t.output_logprobs, 1, {K}) AS head, length(head) AS n_tok,
               -- one parse of the JSON for the three fields (three JSONExtract calls cost three)
               JSONExtract(t.sampling_params_json, 'Tuple(temperature Float64, top_p Nullable(Float64), top_k Int64)')
                   AS sp,
               sp.1 AS temp, ifNull(sp.2, 1.0) AS top_p, sp.3 AS top_k
        FROM {{source}} AS t
        WHERE t.finish_reason NOT IN ('abort', 'error') AND length(t.output_logprobs) >= {MIN_TOKENS}
              AND t.workload NOT IN {ACTIVE_WORKLOADS_SQL}  -- probes, rescores: not client traffic
    )
)
GROUP BY model_name, replica_id, stratum
ORDER BY model_name, replica_id, stratum
"""

# per (model, replica): the client requests the rule could read, and those it measures (with logprobs)
_COUNTS_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, t.workload AS workload, "
                   # the arrays' sizes only (a subcolumn), not their values
                   "length(t.output_logprobs) AS n_logprobs, t.finish_reason AS finish_reason")
_COUNTS = f"""
SELECT model_name, replica_id, count() AS n, countIf(n_logprobs >= {MIN_TOKENS}) AS measured
FROM {{source}} AS t
WHERE t.finish_reason NOT IN ('abort', 'error') AND t.workload NOT IN {ACTIVE_WORKLOADS_SQL}
GROUP BY model_name, replica_id
"""

_EXACT = """
SELECT DISTINCT diagnostic, kind FROM findings FINAL
WHERE has({diagnostics:Array(String)}, diagnostic) AND severity != 'info' AND position(subject, {replica:String}) > 0
"""


# -- statistics --------------------------------------------------------------------------------------

def _normal_ci(pairs) -> tuple[float, float]:
    """95% interval of the standardized difference from the within-stratum standard errors."""
    weights = np.array([len(a) for a, _ in pairs], dtype=float)
    weights /= weights.sum()
    point = sum(w * (a.mean() - b.mean()) for w, (a, b) in zip(weights, pairs))
    se = np.sqrt(sum(w * w * (a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)) for w, (a, b) in zip(weights, pairs)))
    return float(point - 1.96 * se), float(point + 1.96 * se)


def requests_needed(pairs, delta: float) -> int:
    """Per side, for a two-sided 1% test with 80% power to see `delta` (normal approximation)."""
    values = np.concatenate([np.concatenate([a, b]) for a, b in pairs]) if pairs else np.array([])
    sd = float(values.std()) if len(values) > 1 else 1.0
    return int(np.ceil(2 * ((stats.norm.isf(ALPHA / 2) + stats.norm.isf(0.2)) * max(sd, 1e-6) / delta) ** 2))


# -- reading -----------------------------------------------------------------------------------------

def per_replica_strata(store, scope: Scope) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """model -> replica -> stratum -> [n, 2] sample of (mean_logprob, low_prob_share) per request."""
    client = _CLIENT.replace("{source}", requests_in(_QUERY_COLUMNS, scope=scope))
    # like with like: a tenant's own system prompt or prompt lengths move how sure the model is
    source = prompt_family.with_family(client)
    table = store.query_arrow(_QUERY.replace("{source}", source), scope.parameters())
    # the samples as one numpy block (list<struct> -> offsets + two value columns), not Python tuples
    samples = table.column("sample").combine_chunks()
    offsets = samples.offsets.to_numpy()
    values = np.column_stack([samples.values.field(i).to_numpy(zero_copy_only=False) for i in range(2)]).astype(float)
    out: dict = {}
    keys = zip(*(table.column(c).to_pylist() for c in ("model_name", "replica_id", "stratum")))
    for i, (model, replica, stratum) in enumerate(keys):
        out.setdefault(model, {}).setdefault(replica, {})[stratum] = values[offsets[i]:offsets[i + 1]]
    return out


def _shared_pairs(mine: dict, peers: list[dict], col: int) -> list[tuple[np.ndarray, np.ndarray]]:
    pairs = []
    for stratum, a in mine.items():
        b = [p[stratum][:, col] for p in peers if stratum in p]
        if len(a) >= MIN_PER_STRATUM and b and sum(len(x) for x in b) >= MIN_PER_STRATUM:
            pairs.append((a[:, col], np.concatenate(b)))
    return pairs


# -- the diagnostic ----------------------------------------------------------------------------------

def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    data = per_replica_strata(store, scope)
    counts = request_counts(store, scope)
    findings = _without_logprobs(scope, data, counts)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    baselines = baselines_by_model(store, [identity[r] for m in data.values() for r in m if r in identity],
                                   request, models=data)
    rng = np.random.default_rng(0)
    decided = []
    for model, reps in data.items():
        if len(reps) == 2:
            decided += _test_all(model, reps, _two(sorted(reps), baselines.get(model), identity), findings, scope,
                                 counts=counts.get(model, {}))
        elif len(reps) > 2:
            decided += _peeled(model, reps, findings, scope, counts.get(model, {}))
    for d, p_adj in zip(decided, holm([d["p"] for d in decided])):
        d["p_holm"] = p_adj
        # the bootstrap where it decides (a finding needs its CI to exclude 0); elsewhere the
        # normal approximation of the same stratified difference, and says so
        d["ci"], d["ci_method"] = ((standardized_difference(d["pairs"], rng)[1], "bootstrap") if p_adj < ALPHA
                                   else (_normal_ci(d["pairs"]), "normal"))
    by_subject: dict[tuple, list[dict]] = {}
    for d in decided:
        by_subject.setdefault((d["model"], d["subject"]), []).append(d)
    for (model, subject), results in by_subject.items():
        findings.append(_finding(store, scope, model, subject, results, identity, baselines.get(model)))
    return findings


def _two(replicas: list[str], baseline, identity: dict) -> list[tuple[str, list[str]]]:
    """Two replicas: the canary against the baseline side; the same identity on both: the later
    started against the first."""
    base = [r for r in replicas if baseline is not None and r in baseline.replicas]
    if len(base) == 1:
        return [(next(r for r in replicas if r != base[0]), base)]
    first, later = sorted(replicas, key=lambda r: (str(identity.get(r, {}).get("started", "")), r))
    return [(later, [first])]


def _peeled(model, reps, findings, scope, counts) -> list[dict]:
    """3+ replicas, each against the pooled others; a shifted replica in the pool would make its peers
    look shifted the other way, so the most shifted significant one leaves the pool and everyone is
    compared again, until no new one is significant (Holm within each round to pick, over all at the end)."""
    names, outliers = sorted(reps), []
    while True:
        clean = [r for r in names if r not in outliers]
        comparisons = [(r, [p for p in clean if p != r]) for r in names]
        results = _test_all(model, reps, comparisons, [], scope, metrics=("mean_logprob",))
        for d, p_adj in zip(results, holm([d["p"] for d in results])):
            d["p_holm"] = p_adj
        new = [d for d in results if d["subject"] not in outliers and d["p_holm"] < ALPHA and _large_enough(d)]
        if not new or len(clean) - 1 < 2:
            return _test_all(model, reps, comparisons, findings, scope, counts=counts)
        outliers.append(max(new, key=lambda d: abs(d["effect"]))["subject"])


def _test_all(model, reps, comparisons, findings, scope, metrics=tuple(METRICS), counts=None) -> list[dict]:
    """Every (subject, peers) x metric: the stratified test and the effect; too few measured requests:
    `insufficient`, saying how many are measured of how many served and how many are needed."""
    out = []
    for subject, peers in comparisons:
        for col, metric in enumerate(METRICS):
            if metric not in metrics:
                continue
            pairs = _shared_pairs(reps[subject], [reps[p] for p in peers], col)
            n_a, n_b = sum(len(a) for a, _ in pairs), sum(len(b) for _, b in pairs)
            if n_a < MIN_REQUESTS or n_b < MIN_REQUESTS:
                if metric == "mean_logprob":  # one "cannot decide" per comparison, not per metric
                    findings.append(_too_few(model, subject, peers, pairs, n_a, n_b, counts or {}, scope))
                continue
            test = van_elteren(pairs)
            z, p = test.statistic, test.p_value
            effect, _, level = standardized_difference(pairs, None, n_boot=0)
            out.append(dict(model=model, subject=subject, peers=peers, metric=metric, pairs=pairs, z=z, p=p,
                            effect=effect, peer_level=level, relative=effect / max(abs(level), 1e-9),
                            n=n_a, n_peers=n_b))
    return out


def _too_few(model, subject, peers, pairs, n_a, n_b, counts, scope) -> Finding:
    """"Cannot decide", in measured requests (those with sampled-token logprobs): how many there are, of
    how many served, and how many are needed; where a side measures only a share, the traffic that takes."""
    need = max(MIN_REQUESTS, requests_needed(pairs, 0.1))
    served_a, measured_a = counts.get(subject, (0, 0))
    served_b = sum(counts.get(p, (0, 0))[0] for p in peers)
    measured_b = sum(counts.get(p, (0, 0))[1] for p in peers)
    share = min(_share(measured_a, served_a), _share(measured_b, served_b))
    traffic = (f"; with logprobs on {share:.0%} of requests (the proxy's --logprobs-fraction), about "
               f"{int(np.ceil(need / share))} requests per side" if 0 < share < 0.95 else "")
    return insufficient(
        KIND, subject, DIAGNOSTIC, scope,
        f"{n_a} measured requests on {subject} and {n_b} on {', '.join(peers)} in shared strata (workload x "
        f"sampling x length, >= {MIN_PER_STRATUM} each; of {served_a} and {served_b} served, {measured_a} and "
        f"{measured_b} carry >= {MIN_TOKENS} sampled-token logprobs: a request without them is not measured); "
        f"need >= {MIN_REQUESTS} measured per side, about {need} measured per side to see a 0.1 nats/token "
        f"shift{traffic}",
        requests=n_a, peer_requests=n_b, needed_per_side=need, model_name=model, peers=peers,
        served=served_a, peer_served=served_b, measured_share=share)


def _share(measured: int, served: int) -> float:
    return measured / served if served else 0.0


def _large_enough(d: dict) -> bool:
    return abs(d["effect"]) >= METRICS[d["metric"]][1] and abs(d["relative"]) >= REL_FLOOR


def _significant(d: dict) -> bool:
    low, high = d["ci"]
    return d["p_holm"] < ALPHA and (low > 0 or high < 0) and _large_enough(d)


def _finding(store, scope, model, subject, results, identity, baseline) -> Finding:
    hits = [d for d in results if _significant(d)]
    peers = results[0]["peers"]
    evidence = {
        "model_name": model, "replica": subject, "peers": peers,
        "unit": f"request (mean of its first {K} sampled-token raw logprobs; share of them with p < 5%)",
        "test": "van Elteren stratified Wilcoxon-Mann-Whitney, Holm across replicas x metrics",
        "effect": "difference of means standardized to the replica's stratum counts, 95% CI: bootstrap "
                  "(requests resampled within strata) where the test is significant, normal approximation elsewhere",
        "controlled_for": ["model", "workload (prompt mix)", "temperature / top-p / top-k bucket",
                           f"output length (first {K} tokens; length bucket)"],
        "baseline": baseline.describe() if baseline is not None and len(peers) == 1 else
        {"rule": "pooled_peers", "replicas": peers},
        "metrics": {d["metric"]: {"effect": d["effect"], "ci95": d["ci"], "ci_method": d["ci_method"],
                                  "unit": METRICS[d["metric"]][0],
                                  "peer_level": d["peer_level"], "relative": d["relative"],
                                  "z": d["z"], "p": d["p"], "p_holm": d["p_holm"], "requests": d["n"],
                                  "peer_requests": d["n_peers"], "strata": len(d["pairs"])} for d in results},
    }
    if not hits:
        return Finding("sampled_logprobs_unchanged", "info", subject,
                       f"{subject}: sampled-token logprobs match {', '.join(peers)} "
                       f"({results[0]['n']} vs {results[0]['n_peers']} requests)", DIAGNOSTIC, scope, evidence,
                       id_kind=KIND)
    lead = next((d for d in hits if d["metric"] == "mean_logprob"), hits[0])
    critical = any(abs(d["relative"]) >= REL_CRITICAL for d in hits)
    diffs = identity_differences(identity.get(subject, {}), [identity[p] for p in peers if p in identity])
    evidence["identity_differences"] = diffs
    exact = store.query_arrow(_EXACT, {"diagnostics": list(EXACT_EVIDENCE), "replica": subject}).to_pylist()
    evidence["exact_token_findings"] = exact
    unit = METRICS[lead["metric"]][0]
    direction = "less" if (lead["metric"] == "mean_logprob") == (lead["effect"] < 0) else "more"
    summary = (f"{subject} ({model}) is {direction} sure of the tokens it samples than {', '.join(peers)}: "
               f"{lead['metric']} {lead['effect']:+.3f} {unit} [95% CI {lead['ci'][0]:+.3f}, {lead['ci'][1]:+.3f}] "
               f"({lead['relative']:+.0%} of the peers' {lead['peer_level']:.3f}), "
               f"van Elteren p_holm={lead['p_holm']:.2g}, {lead['n']} vs {lead['n_peers']} requests in "
               f"{len(lead['pairs'])} strata (workload x sampling x length)")
    if diffs:
        summary += "; differs in " + differs_in(diffs, 4)
    summary += ("; exact-token evidence exists (" + ", ".join(f"{e['diagnostic']}: {e['kind']}" for e in exact)
                + ") and is the stronger evidence" if exact else
                "; confirm with exact tokens: `infersight diagnose probe` / `drift` (golden probes, greedy replays)")
    if len(peers) == 1 and baseline is not None and not baseline.decided:
        # started together, no role, no pin: the difference is the pair's, neither side is named
        pair = " vs ".join(sorted((subject, *peers)))
        evidence["symmetric"] = True
        return Finding(KIND, "warning", pair, f"{pair}: {summary}; no baseline: {baseline.reason}", DIAGNOSTIC,
                       scope, evidence)
    return Finding(KIND, "critical" if critical else "warning", subject, summary, DIAGNOSTIC, scope, evidence)


def request_counts(store, scope: Scope) -> dict[str, dict[str, tuple[int, int]]]:
    """model -> replica -> (client requests served, those measured: with >= MIN_TOKENS logprobs)."""
    source = requests_in(_COUNTS_COLUMNS, scope=scope)
    out: dict = {}
    for r in store.query_arrow(_COUNTS.replace("{source}", source), scope.parameters()).to_pylist():
        out.setdefault(r["model_name"], {})[r["replica_id"]] = (int(r["n"]), int(r["measured"]))
    return out


def _without_logprobs(scope: Scope, data: dict, counts: dict) -> list[Finding]:
    """A model whose requests carry no logprobs at all: say why nothing can be compared."""
    out = []
    for model, replicas in counts.items():
        n = sum(served for served, _ in replicas.values())
        if model not in data and n > 0:
            out.append(insufficient(KIND, model, DIAGNOSTIC, scope,
                                    f"none of {n} requests of {model} carry >= {MIN_TOKENS} output_logprobs, so "
                                    f"none is measured (an engine before migration 0005, vLLM without the recording "
                                    f"proxy, or a proxy with --no-logprobs); need >= {MIN_REQUESTS} measured "
                                    f"requests per replica",
                                    requests=n, model_name=model))
    return out
