"""Drift: did a configuration change what the model answers?

From eval runs: per suite, a candidate run against a baseline run of another configuration over
the same items: accuracy with Wilson intervals, McNemar's test on the paired items, greedy
agreement and where the outputs first diverge (the gate's statistics, from evals.stats).

From production: greedy requests (temperature 0) with identical prompt token IDs and the same
output limits, served by replicas of different configurations. Their outputs should be
identical. Per prompt the reference is the output most replicas produced; where no output is the
most common (the usual one baseline beside one canary: a 1-to-1 disagreement) it is the baseline
side's output (diagnostics.baseline.choose_baseline per model: a pin, the requested side, a recorded
role, or the identity deployed first), so the candidate that differs counts as differing. Only a tie
that no baseline-side replica takes part in stays undecided ("tied"). A replica whose outputs often
differ from the reference is named (critical from 50% of its prompts, warning when the Wilson
lower bound of its rate is above 2%), with the first divergence decoded, its identity differences
(quantization, config hash ...) and the baseline it was judged against. Where the baseline rule
decides nothing (replicas started together, no role, no pin), the ties of a model are ONE symmetric
`output_drift` on the pair (subject "r0 vs r1": "r0 and r1 disagree on 41 of 42 ..."), a warning at most, naming
both sides' identity differences and asking for a `role`.
"""

from __future__ import annotations

from collections import Counter

from diagnostics.baseline import Baseline, baselines_by_model
from diagnostics.findings import Finding, insufficient
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.replicas import differs_in, identity_differences
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from diagnostics.token_evidence import divergence
from evals.stats import greedy_agreement, mcnemar, wilson_interval

DIAGNOSTIC = "drift"
MIN_ITEMS = 20  # paired eval items
MIN_PROMPTS = 10  # greedy prompts a replica shares with replicas of another config
ALPHA = 0.05
MAX_EXAMPLES = 3

# -- SQL: eval runs, production greedy outputs ------------------------------------------------------

_RUNS = """
SELECT run_id, suite, start_time, config_hash, config_json, model_name, quantization, speculative_mode, git_sha,
       num_items, accuracy
FROM eval_runs
WHERE start_time >= toDateTime64({start:Float64}, 6, 'UTC') AND start_time < toDateTime64({end:Float64}, 6, 'UTC')
  AND (empty({models:Array(String)}) OR has({models:Array(String)}, model_name))
  AND (empty({configs:Array(String)}) OR has({configs:Array(String)}, config_hash))
ORDER BY suite, start_time
"""

_ITEMS = """
SELECT run_id, item_id, task, score, output_token_ids, output_text, reference
FROM eval_items WHERE has({runs:Array(String)}, run_id)
"""

# the same request: prompt token IDs and sampling parameters (the seed left out: greedy ignores it)
_KEY = "cityHash64(prompt_token_ids, replaceRegexpOne(sampling_params_json, '\"seed\": *[^,}]*,? *', ''))"
# a sample of prompts chosen by a cheap fingerprint, so a prompt is in or out on every replica alike
_SAMPLED = ("cityHash64(length(prompt_token_ids), prompt_token_ids[1], prompt_token_ids[2], prompt_token_ids[-1], "
            "prompt_token_ids[-2]) % 1000 < {permille:UInt32}")

# one output per (replica, request): the latest
_GREEDY = f"""
SELECT model_name, key, groupArray((replica_id, config_hash, out)) AS outputs
FROM (
    SELECT model_name, key, replica_id, any(config_hash) AS config_hash,
           argMax(cityHash64(output_token_ids), arrival_time) AS out
    FROM (
        SELECT model_name, replica_id, config_hash, output_token_ids, arrival_time, {_KEY} AS key
        FROM {{source}}
        WHERE {_SAMPLED} AND finish_reason IN ('stop', 'length')
          AND JSONExtractFloat(sampling_params_json, 'temperature') = 0
    )
    GROUP BY model_name, key, replica_id
)
GROUP BY model_name, key
HAVING uniqExact(config_hash) > 1
"""

_EXAMPLE_OUTPUTS = f"""
SELECT replica_id, key, argMax(prompt_token_ids, arrival_time) AS prompt_ids,
       argMax(output_token_ids, arrival_time) AS ids
FROM (SELECT replica_id, prompt_token_ids, output_token_ids, arrival_time, {_KEY} AS key
      FROM requests
      WHERE has({{replicas:Array(String)}}, replica_id)
        AND arrival_time >= toDateTime64({{start:Float64}}, 6, 'UTC')
        AND arrival_time < toDateTime64({{end:Float64}}, 6, 'UTC') AND {_SAMPLED})
WHERE has({{keys:Array(UInt64)}}, key)
GROUP BY replica_id, key
"""

_COUNT = "SELECT count() AS n FROM {source}"
_SOURCE_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, "
                   "t.prompt_token_ids AS prompt_token_ids, "
                   "t.output_token_ids AS output_token_ids, t.arrival_time AS arrival_time, "
                   "t.sampling_params_json AS sampling_params_json, t.finish_reason AS finish_reason")


def _runs(store, scope: Scope) -> list[dict]:
    return store.query_arrow(_RUNS, scope.parameters()).to_pylist()


def run_pairs(store, scope: Scope, baseline: Scope | None, candidate: Scope | None) -> list[tuple[dict, dict]]:
    """(baseline run, candidate run) per suite: the latest run of each side, or, without sides,
    the latest run and the latest earlier run of another configuration."""
    pairs = []
    if baseline is not None and candidate is not None:
        base, cand = _runs(store, baseline), _runs(store, candidate)
        for suite in sorted({r["suite"] for r in base} & {r["suite"] for r in cand}):
            b = [r for r in base if r["suite"] == suite][-1]
            c = [r for r in cand if r["suite"] == suite][-1]
            if b["run_id"] != c["run_id"]:
                pairs.append((b, c))
        return pairs
    runs = _runs(store, scope)
    for suite in sorted({r["suite"] for r in runs}):
        suite_runs = [r for r in runs if r["suite"] == suite]
        latest = suite_runs[-1]
        earlier = [r for r in suite_runs[:-1] if r["config_hash"] != latest["config_hash"]]
        if earlier:
            pairs.append((earlier[-1], latest))
    return pairs


def eval_drift(store, scope: Scope, baseline: Scope | None = None, candidate: Scope | None = None,
               source: TokenizerSource | None = None) -> list[Finding]:
    source = source or TokenizerSource()
    findings = []
    for base, cand in run_pairs(store, scope, baseline, candidate):
        items = store.query_arrow(_ITEMS, {"runs": [base["run_id"], cand["run_id"]]}).to_pylist()
        b = {i["item_id"]: i for i in items if i["run_id"] == base["run_id"]}
        c = {i["item_id"]: i for i in items if i["run_id"] == cand["run_id"]}
        common = sorted(set(b) & set(c))
        subject = f"{base['suite']}: {cand['config_hash'][:12]} vs {base['config_hash'][:12]}"
        runs = {"baseline": _run_info(base), "candidate": _run_info(cand)}
        if len(common) < MIN_ITEMS:
            findings.append(insufficient("quality_drift", subject, DIAGNOSTIC, scope,
                                         f"{len(common)} items in both runs of {base['suite']} (need {MIN_ITEMS})",
                                         items=len(common), runs=runs))
            continue
        findings.append(_eval_finding(subject, scope, base, cand, [b[i] for i in common], [c[i] for i in common],
                                      common, runs, source))
    return findings


def _run_info(run: dict) -> dict:
    keys = ("run_id", "suite", "config_hash", "model_name", "quantization", "speculative_mode", "git_sha", "accuracy")
    return {k: run[k] for k in keys}


def _eval_finding(subject, scope, base, cand, b_items, c_items, ids, runs, source) -> Finding:
    bs = [i["score"] >= 0.5 for i in b_items]
    cs = [i["score"] >= 0.5 for i in c_items]
    n = len(ids)
    test = mcnemar(bs, cs)
    agreement = greedy_agreement([i["output_token_ids"] for i in b_items], [i["output_token_ids"] for i in c_items])
    tok = source.for_replica({"replica_id": cand["run_id"], "model_name": cand["model_name"],
                              "config_json": cand["config_json"]})
    examples = []
    for item_id, bi, ci in zip(ids, b_items, c_items):
        if len(examples) >= MAX_EXAMPLES:
            break
        if list(bi["output_token_ids"]) != list(ci["output_token_ids"]):
            examples.append({"item_id": item_id, "baseline_score": bi["score"], "candidate_score": ci["score"],
                             "reference": bi["reference"],
                             **divergence(bi["output_token_ids"], ci["output_token_ids"], tok, tok,
                                          "baseline", "candidate")})
    b_acc, c_acc = sum(bs) / n, sum(cs) / n
    worse = c_acc < b_acc
    if worse and test.p_mid < ALPHA / 5:
        severity = "critical"
    elif worse and test.p_mid < ALPHA:
        severity = "warning"
    else:
        severity = "info"
    verdict = ("accuracy dropped" if severity != "info" else
               "accuracy holds" if not worse or test.p_mid >= ALPHA else "accuracy change not significant")
    summary = (f"{base['suite']}: {verdict}: {b_acc:.1%} -> {c_acc:.1%} over {n} paired items "
               f"(McNemar mid-p={test.p_mid:.3g}, {test.baseline_only} lost / {test.candidate_only} gained); "
               f"greedy outputs identical on {agreement.agreement:.0%}")
    evidence = {"suite": base["suite"], "model_name": cand["model_name"], "runs": runs, "items": n,
                "baseline_accuracy": b_acc, "baseline_ci": wilson_interval(sum(bs), n),
                "candidate_accuracy": c_acc, "candidate_ci": wilson_interval(sum(cs), n),
                "mcnemar": {"baseline_only": test.baseline_only, "candidate_only": test.candidate_only,
                            "p_exact": test.p_exact, "p_mid": test.p_mid},
                "greedy": {"identical": agreement.identical, "agreement": agreement.agreement,
                           "agreement_ci": agreement.agreement_ci,
                           "median_first_divergence": agreement.median_first_divergence,
                           "min_first_divergence": agreement.min_first_divergence},
                "examples": examples, "tests": "Wilson intervals, McNemar (exact and mid-p) on paired items, "
                                               "greedy agreement (evals.stats)"}
    # no significant drop is an info outcome of its own kind (alerts key on quality_drift), same id
    kind = "quality_drift" if severity != "info" else "quality_unchanged"
    return Finding(kind, severity, subject, summary, DIAGNOSTIC, scope, evidence, id_kind="quality_drift")


# -- production greedy outputs ----------------------------------------------------------------------

SAMPLE_ROWS = 200_000  # requests whose prompts are hashed for the greedy comparison, at most


def _source() -> str:
    return requests_in(_SOURCE_COLUMNS)


def reference(outputs: list[tuple], baseline: Baseline | None, identity: dict) -> tuple[int, str, str]:
    """(reference output, a replica that produced it, how it was chosen) for one prompt's outputs
    [(replica, config hash, output hash)]: "majority" (the most common output), "baseline" (no
    most common one: the baseline side's), or "tie" (neither decides)."""
    counts = Counter(out for _, _, out in outputs).most_common()
    if len(counts) == 1 or counts[0][1] > counts[1][1]:
        return counts[0][0], next(r for r, _, out in outputs if out == counts[0][0]), "majority"
    base = [(r, out) for r, _, out in outputs
            if baseline is not None and r in identity and baseline.is_baseline(identity[r])]
    if base:
        ref = Counter(out for _, out in base).most_common(1)[0][0]
        return ref, next(r for r, out in base if out == ref), "baseline"
    return counts[0][0], next(r for r, _, out in outputs if out == counts[0][0]), "tie"


def greedy_drift(store, scope: Scope, source: TokenizerSource | None = None,
                 request: DiagnosticRequest | None = None) -> list[Finding]:
    source = source or TokenizerSource()
    request = request or DiagnosticRequest(scope)
    n = store.query_arrow(_COUNT.replace("{source}", _source()), scope.parameters()).to_pylist()[0]["n"]
    permille = 1000 if n <= SAMPLE_ROWS else max(1, -(-1000 * SAMPLE_ROWS // n))
    params = {**scope.parameters(), "permille": permille}
    groups = store.query_arrow(_GREEDY.replace("{source}", _source()), params).to_pylist()
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    baselines = baselines_by_model(store, list(identity.values()), request, {g["model_name"] for g in groups})
    stats: dict[str, dict] = {}
    ties: dict[str, dict] = {}  # model -> its prompts' ties, where no baseline decides (one finding on the pair)
    for g in groups:
        outputs = [tuple(o.values()) if isinstance(o, dict) else tuple(o) for o in g["outputs"]]
        ref, ref_replica, how = reference(outputs, baselines[g["model_name"]], identity)
        tie = how == "tie"
        b = baselines[g["model_name"]]
        if b is not None and not b.decided:
            t = ties.setdefault(g["model_name"], {"compared": 0, "tied": 0, "replicas": set(), "example": None})
            t["compared"] += 1
            t["replicas"].update(rid for rid, _, _ in outputs)
            if tie:
                t["tied"] += 1
                other = next((rid for rid, _, out in outputs if out != ref), None)
                if t["example"] is None and other is not None:
                    t["example"] = (g["key"], other, ref_replica)
        for rid, _, out in outputs:
            s = stats.setdefault(rid, {"model": g["model_name"], "compared": 0, "differ": 0, "tied": 0,
                                       "by_baseline": 0, "examples": []})
            s["compared"] += 1
            if out != ref:
                s["tied" if tie else "differ"] += 1
                s["by_baseline"] += how == "baseline"
                if len(s["examples"]) < MAX_EXAMPLES and not (tie and s["differ"]):
                    s["examples"].append((g["key"], ref_replica))
    findings = []
    models = {r["model_name"] for r in identity.values()}
    for model in sorted(models - {s["model"] for s in stats.values()}):
        findings.append(insufficient("output_drift", model, DIAGNOSTIC, scope,
                                     "no greedy prompt was served by replicas of different configurations",
                                     model_name=model))
    outputs = _example_outputs(store, params, stats)
    for rid, s in sorted(stats.items()):
        if s["model"] in ties and not s["differ"] and s["compared"] >= MIN_PROMPTS:
            continue  # its ties are the pair's finding
        findings += _replica_drift(scope, rid, s, identity, source, outputs, permille, baselines.get(s["model"]))
    for model, t in sorted(ties.items()):
        if t["tied"]:
            findings.append(_disagreement(store, scope, model, t, identity, source, params, baselines[model]))
    return findings


def _disagreement(store, scope, model, t, identity, source, params, baseline: Baseline) -> Finding:
    """One finding on the replicas whose greedy outputs split with no side to call the reference."""
    names = sorted(t["replicas"])
    n, k = t["compared"], t["tied"]
    low, high = wilson_interval(k, n)
    example, diffs = {}, []
    if t["example"] is not None:
        key, a, b = t["example"]
        rows = _example_outputs(store, params, {a: {"compared": MIN_PROMPTS, "examples": [(key, b)]}})
        mine, theirs = rows.get((a, key)), rows.get((b, key))
        if mine is not None and theirs is not None:
            example = {"replica": a, "reference_replica": b, "prompt_token_ids": list(mine["prompt_ids"]),
                       **divergence(mine["ids"], theirs["ids"], source.for_replica(identity[a]) if a in identity
                                    else None, source.for_replica(identity[b]) if b in identity else None,
                                    "replica", "reference")}
        if a in identity and b in identity:
            diffs = identity_differences(identity[a], [identity[b]])
    first = example.get("first_divergence")
    severity = "warning" if n >= MIN_PROMPTS and low > 0.02 else "info"
    summary = (f"{' and '.join(names)} disagree on {k} of {n} identical greedy prompts ({k / n:.0%}, "
               f"95% CI {low:.0%}-{high:.0%})"
               + (f"; first divergence at output token {first}" if first is not None else "")
               + (f"; {a} vs {b}: {differs_in(diffs)}" if diffs else "")
               + f"; no baseline: {baseline.reason}")
    evidence = {"replicas": names, "model_name": model, "compared": n, "disagree": k, "rate": k / n,
                "rate_ci": [low, high], "symmetric": True, "baseline": baseline.describe(),
                "identity_differences": diffs, "examples": [example] if example else [],
                "method": "greedy requests grouped by prompt token IDs and output limits; no majority and no "
                          "baseline (diagnostics.baseline: started together, no role, no pin): one finding on the "
                          "pair, no side named"}
    return Finding("output_drift", severity, " vs ".join(names), summary, DIAGNOSTIC, scope, evidence)


def _example_outputs(store, params: dict, stats: dict) -> dict:
    """(replica, key) -> its prompt and output IDs, for every example, in one scan."""
    wanted = [(rid, key, ref) for rid, s in stats.items() if s["compared"] >= MIN_PROMPTS
              for key, ref in s["examples"]]
    if not wanted:
        return {}
    replicas = sorted({r for rid, _, ref in wanted for r in (rid, ref)})
    rows = store.query_arrow(_EXAMPLE_OUTPUTS, {**params, "replicas": replicas,
                                                "keys": sorted({key for _, key, _ in wanted})}).to_pylist()
    return {(r["replica_id"], r["key"]): r for r in rows}


def _replica_drift(scope, rid, s, identity, source, outputs, permille: int,
                   baseline: Baseline | None) -> list[Finding]:
    differ = s["differ"] + s["tied"]
    if s["compared"] < MIN_PROMPTS:
        return [insufficient("output_drift", rid, DIAGNOSTIC, scope,
                             f"{rid} shares {s['compared']} greedy prompts with replicas of other configurations "
                             f"(need {MIN_PROMPTS})", compared=s["compared"], differ=differ)]
    if not differ:
        return []
    rate = differ / s["compared"]
    low, high = wilson_interval(differ, s["compared"])
    # ties that no baseline-side replica took part in cannot say which side drifted: alone, info
    severity = "critical" if rate >= 0.5 and s["differ"] else "warning" if low > 0.02 and s["differ"] else "info"
    me = identity.get(rid, {"replica_id": rid})
    examples, references = [], set()
    for key, ref in s["examples"]:
        mine, theirs = outputs.get((rid, key)), outputs.get((ref, key))
        if mine is None or theirs is None:
            continue
        references.add(ref)
        tok = source.for_replica(me) if rid in identity else None
        ref_tok = source.for_replica(identity[ref]) if ref in identity else tok
        examples.append({"reference_replica": ref, "prompt_token_ids": list(mine["prompt_ids"]),
                         **divergence(mine["ids"], theirs["ids"], tok, ref_tok, "replica", "reference")})
    peers = [identity[r] for r in sorted(references) if r in identity]
    diffs = identity_differences(me, peers) if peers else []
    first = examples[0]["first_divergence"] if examples else None
    summary = (f"{rid}: greedy outputs differ from the reference on {differ} of {s['compared']} identical "
               f"prompts ({rate:.0%}, 95% CI {low:.0%}-{high:.0%})"
               + (f", {s['by_baseline']} of them decided by the baseline (no majority)" if s["by_baseline"] else "")
               + (f", {s['tied']} of them ties no baseline replica took part in" if s["tied"] else "")
               + (f"; first divergence at output token {first}" if first is not None else "")
               + (f"; {rid} differs in {differs_in(diffs)}" if diffs else "")
               + (f"; baseline: {baseline.label()}" if baseline is not None else ""))
    evidence = {"replica": rid, "model_name": s["model"], "compared": s["compared"], "differ": s["differ"],
                "tied": s["tied"], "decided_by_baseline": s["by_baseline"], "rate": rate, "rate_ci": [low, high],
                "baseline": baseline.describe() if baseline is not None else None,
                "identity_differences": diffs, "examples": examples, "sampled_prompts_per_mille": permille,
                "method": "greedy requests grouped by prompt token IDs and output limits across replicas of "
                          "different config hashes; the most common output is the reference, and where there is "
                          "none the baseline side's (diagnostics.baseline); ties without a baseline replica are "
                          "counted as tied"}
    return [Finding("output_drift", severity, rid, summary, DIAGNOSTIC, scope, evidence)]


def run(store, request: DiagnosticRequest) -> list[Finding]:
    source = TokenizerSource(dict(request.model_dirs))
    return (eval_drift(store, request.scope, request.baseline, request.candidate, source)
            + greedy_drift(store, request.scope, source, request))
