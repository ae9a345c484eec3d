"""Replicas: which replica of a model is slower than its peers, like for like, and what about it differs.

Requests are compared only within strata (diagnostics.request_strata: model, workload, prompt-length
bucket, output-length bucket, offered load: the tokens of the requests that arrived at it in the
seconds before), so a replica that got longer prompts, longer outputs or far more load is not called
slow for it. Prefill and TTFT are compared in strata of computed prompt tokens instead of prompt and
output length (request_strata.BY_COMPUTED: the prompt less its prefix-cache hits is the work a prefill
does), so a replica whose scheduler budget cuts prompts into chunks is compared at the same work.
Its own queue is no control: a slow replica queues more at the same arrivals, and that is its slowness.
Per model, each replica with MIN_REQUESTS requests is tested against its peers' pooled requests on
each metric (queue, prefill, TTFT, decode time per output token, mean ITL, e2e) by van Elteren's
stratified Mann-Whitney (evals.stats.stratified); the effect is the median of its requests' latency
over the peers' median in the same stratum, with a stratified bootstrap interval. The tail too
(diagnostics.tail_latency): p90 of queue time and TTFT against the peers' in the same strata, a block
bootstrap over time, for a replica whose few queued requests wait far longer (max_num_seqs 1) while
its median does not move; a p90 past the bar over fewer time blocks than its bootstrap needs is said to
be insufficient data, with the traffic it needs. Holm over replicas x metrics (median and tail tests); a
replica is lagging when the adjusted p < ALPHA and the interval's lower bound exceeds MIN_EFFECT. Decode
time per output token and ITL depend on the batch a replica's scheduler limits (max_num_seqs,
max_num_batched_tokens) let it build, so they are compared only among replicas with the same
limits: one held to a single sequence is slower to first token and faster per token, and its
batching peers are not lagging for that. Peers are pooled requests, not per-replica summaries, so
two replicas (baseline + canary) and three work.

Two findings of their own come first (diagnostics.traffic_mix, diagnostics.prefix_hits): a replica
whose outputs end differently for the same workload (`output_mix_shift`: eos changed, every request
runs to max_tokens) is not given an e2e verdict, only the per-token ones; a replica with a much lower
prefix-cache hit rate is `prefix_hit_gap`. A lagging replica's identity is compared with its peers'
(NUMA mismatch, CPU count, CPUs shared, config hash, version, tokenizer and template hashes ...), and
its mechanism is looked for in the same window (diagnostics.mechanisms: preemptions, KV pressure, queue
at max_num_seqs, CPU quota, prefix hits, host time against its peers'), or said not to be in the records.
A lag whose only mechanism is its queue at max_num_seqs, filled by heavier work than its peers were sent
(output tokens hold a slot a step each: the token count of offered load does not weigh them), on steps as
fast as its peers', is kept at info as its own traffic (diagnostics.own_traffic).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from diagnostics import config_keys, mechanisms, own_traffic, prefix_hits, request_strata, tail_latency, traffic_mix
from diagnostics.findings import Finding, insufficient
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import replicas_in
from engine.core.model_files import SECTION as MODEL_FILES
from engine.core.model_files import hash_column
from evals.stats import holm, stratified

DIAGNOSTIC = "replicas"
KIND = "lagging_replica"
LATENCIES = request_strata.METRICS
MIN_REQUESTS = 20
MIN_EFFECT = 1.15  # the interval's lower bound must be at least this much slower than the peers
CRITICAL_RATIO = 2.0
ALPHA = 0.01
# ratios are taken over a peer median of at least this much (seconds): an idle queue of 50 us is not 0
FLOORS = {"queue": 1e-3, "prefill": 1e-3, "ttft": 1e-3, "tpot": 1e-4, "itl": 1e-4, "e2e": 1e-3}
# prefill and TTFT are compared in strata of computed prompt tokens (request_strata.BY_COMPUTED): a replica
# whose scheduler budget cuts each prompt into chunks spends a step per chunk while its steps are small, not
# slow (diagnostics.steps). Real 32-token budget canary: prefill 1.0x its peer's at <= 32 computed
# tokens, 1.25-2.0x at 33-64, 1.4-4x at 65-96 (more the busier the host); in prompt-length strata its
# median TTFT read 1.46x, CI low 1.148 (missed), in computed-token strata 1.59x, CI low 1.18
BY_COMPUTED = request_strata.BY_COMPUTED
CONTROLLED = ("model", "workload", "prompt-length bucket (4x)", "output-length bucket (sqrt 2)",
              f"offered load: tokens (prompt + output) of the requests that arrived at the replica in the "
              f"{request_strata.OFFERED_WINDOW:g} s before (2x)")
COMPUTED_CONTROLLED = ("model", "workload", "computed prompt tokens: prompt less prefix-cache hits (sqrt 2)",
                        CONTROLLED[-1])
# per-token decode time depends on the batch a replica may build: its scheduler's limits (config keys
# ending in these) bound it, so those metrics are compared only among replicas with the same limits
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens")
PER_BATCH = ("tpot", "itl")
# identity fields compared with the peers, in the order a person would check them
IDENTITY = ("numa_mismatch", "cpu_count", "config_hash", "engine_version", "tokenizer_hash", "chat_template_hash",
            "quantization", "speculative_mode", "attention_backend", "dtype", "device", "weights_hash", "host",
            "gpu_numa_node")


def identity_differences(subject: dict, peers: list[dict]) -> list[dict]:
    """How `subject` differs from the most common value among `peers`, most specific first: the config
    document's keys (config_keys: the model files' keys such as config.json's rope_theta, then engine options,
    serve flags, cgroup limits), then the row's columns; a hash column only where no key under it says more
    (config_hash where no config key differs, tokenizer_hash where no tokenizer file key does). Each entry:
    field, replica (its value), peers ({value: count}), reference (the peers' most common), said (for people)."""
    keys = [d for d in config_keys.differences(subject, peers, lambda k: not k.endswith((".sha256", ".bytes")))]
    out = [{"field": d["key"], "replica": d["replica"], "peers": d["peers"], "reference": d["reference"],
            "said": config_keys.say(d["key"], d["replica"], d["reference"])} for d in keys]
    covered = {hash_column(d["key"].split(".")[1]) for d in keys
               if config_keys.section(d["key"]) == MODEL_FILES} | ({"config_hash"} if keys else set()) \
        | {d["key"] for d in keys}  # an engine option of a column's name (quantization ...) says it already
    for f in IDENTITY:
        counts = Counter(str(p.get(f)) for p in peers)
        if not counts:
            break
        common, _ = counts.most_common(1)[0]
        if str(subject.get(f)) != common and f not in covered:
            out.append({"field": f, "replica": subject.get(f), "peers": dict(counts), "reference": common,
                        "said": f"{f} {subject.get(f)} vs {common}"})
    shared = _cpus_shared(subject, peers)
    if shared:
        out.append({"field": "cpus_shared_with", "replica": sorted(set(subject.get("cpu_affinity") or [])),
                    "peers": shared, "said": f"shares CPUs {sorted(set(subject['cpu_affinity']))} with "
                                             f"{', '.join(shared)}"})
    return out


def _cpus_shared(subject: dict, peers: list[dict]) -> list[str]:
    """The peers `subject` shares CPUs with, where it shares with more of them than a peer typically does
    (two replicas on the same CPUs share them both ways: that is no difference of one of them)."""
    everyone = [subject, *peers]

    def overlaps(r):
        mine = set(r.get("cpu_affinity") or [])
        return [o["replica_id"] for o in everyone if o is not r and mine & set(o.get("cpu_affinity") or [])]

    shared = sorted(overlaps(subject))
    typical = sorted(len(overlaps(p)) for p in peers)
    return shared if shared and (not typical or len(shared) > typical[len(typical) // 2]) else []


def differs_in(diffs: list[dict], limit: int = 3) -> str:
    """`rope_theta 10000 vs 100000 in config.json, ...`: the first `limit` differences said."""
    return ", ".join(d.get("said") or f"{d['field']}={d['replica']}" for d in diffs[:limit])


def _is_scheduler_key(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in SCHEDULER_KEYS


def scheduler_limits(identity: dict) -> str:
    """The replica's scheduler limits as one comparable value ("" when it records none)."""
    flat = config_keys.flat(identity.get("config_json"))
    return ";".join(f"{k}={flat[k]}" for k in sorted(flat) if _is_scheduler_key(k))


def _explain(diffs: list[dict]) -> str:
    if not diffs:
        return "no identity difference recorded (look at the host: neighbours, load, throttling)"
    return "differs in " + "; ".join(d.get("said") or f"{d['field']} {d['replica']}" for d in diffs[:4])


def _pooled(entries: list[dict], metric: str, key: str = "strata") -> dict:
    """{stratum: the peers' values of `metric`, concatenated} (key "arrivals": their arrival times, aligned)."""
    out: dict = {}
    for e in entries:
        for s, values in e[key].items():
            out.setdefault(s, []).append(values[metric])
    return {s: np.concatenate(v) for s, v in out.items()}


def _own(entry: dict, metric: str, key: str = "strata") -> dict:
    return {s: v[metric] for s, v in entry[key].items()}


def _sides(entry: dict, peers: list[dict], metric: str) -> tuple[dict, dict]:
    """(the replica's, its peers' pooled) {stratum: values} of `metric`, in the strata it is compared in."""
    key = "by_computed" if metric in BY_COMPUTED else "strata"
    return _own(entry, metric, key), _pooled(peers, metric, key)


def _coarse(by_stratum: dict) -> dict:
    """{stratum: values} merged over output-length buckets (request_strata.without_output_bucket), in key order."""
    out: dict = {}
    for s in sorted(by_stratum):
        out.setdefault(request_strata.without_output_bucket(s), []).append(by_stratum[s])
    return {s: np.concatenate(v) for s, v in out.items()}


TAIL = {f"{m}_p90": m for m in tail_latency.METRICS}  # the tail tests' metric names -> the latency
LABELS = {**request_strata.LABELS, **{t: f"p90 {request_strata.LABELS[m]}" for t, m in TAIL.items()}}


def peers_for(group: dict[str, dict], rid: str, metric: str, limits: dict[str, str]) -> list[dict]:
    """The peers `rid` is compared with on `metric`: all of them, or on a per-token decode metric those
    with its scheduler limits (a replica limited to one sequence decodes faster per token than one that
    batches eight: not a slower peer, another trade-off)."""
    return [e for p, e in sorted(group.items()) if p != rid
            and (metric not in PER_BATCH or limits.get(p, "") == limits.get(rid, ""))]


def tests(group: dict[str, dict], skip: dict[str, set], limits: dict[str, str] | None = None) -> list[dict]:
    """Every (replica, metric) test of one model's replicas against their peers, Holm-adjusted together.
    `skip`: replica -> metrics not compared for it (e2e when its output mix differs); `limits`: replica ->
    its scheduler limits (scheduler_limits)."""
    limits = limits or {}
    out = []
    for rid, entry in sorted(group.items()):
        if entry["n"] < MIN_REQUESTS:
            continue
        for m in LATENCIES:
            peers = peers_for(group, rid, m, limits)
            if m in skip.get(rid, ()) or not peers:
                continue
            c = stratified.compare(*_sides(entry, peers, m), FLOORS[m], MIN_REQUESTS)
            if c is not None:
                out.append({"replica": rid, "metric": m, "comparison": c})
        for t, m in TAIL.items():  # bootstrapped only when the point ratio could fire (else p = 1)
            peers = peers_for(group, rid, m, limits)
            if m in skip.get(rid, ()) or not peers:
                continue
            # queue and TTFT come before the request's own output: strata without its length keep more per p90
            c = tail_latency.compare(_coarse(_own(entry, m)), _coarse(_own(entry, m, "arrivals")),
                                     _coarse(_pooled(peers, m)), _coarse(_pooled(peers, m, "arrivals")), FLOORS[m],
                                     MIN_REQUESTS, screen=MIN_EFFECT)
            if c is not None:
                out.append({"replica": rid, "metric": t, "comparison": c})
    for t, q in zip(out, holm([t["comparison"].p_value for t in out])):
        t["holm_p"] = q
    return out


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    findings = traffic_mix.run(store, request, identity) + prefix_hits.run(store, request, identity)
    skip = {f.subject: {"e2e"} for f in findings if f.kind == traffic_mix.KIND}
    by_model: dict[str, dict[str, dict]] = {}
    for (model, rid), entry in request_strata.samples(store, scope).items():
        by_model.setdefault(model, {})[rid] = entry
    lagging = []
    for model, group in sorted(by_model.items()):
        for rid, entry in sorted(group.items()):
            if entry["n"] < MIN_REQUESTS:
                lagging.append(insufficient(KIND, rid, DIAGNOSTIC, scope,
                                            f"{entry['n']} requests on {rid} (need {MIN_REQUESTS})",
                                            requests=entry["n"], model_name=model))
        if len(group) < 2:
            continue
        limits = {rid: scheduler_limits(identity.get(rid, {})) for rid in group}
        done = tests(group, skip, limits)
        tested = {t["replica"] for t in done}
        for rid, entry in sorted(group.items()):
            if entry["n"] >= MIN_REQUESTS and rid not in tested:
                lagging.append(insufficient(KIND, rid, DIAGNOSTIC, scope,
                                            f"fewer than {MIN_REQUESTS} of {rid}'s {entry['n']} requests fall in "
                                            f"strata (workload, prompt and output length, offered load) its peers "
                                            f"also served: needs peers' traffic at the same offered tokens and lengths",
                                            requests=entry["n"], model_name=model))
        verdicts = _verdicts(store, model, group, done, identity, skip, scope, limits)
        lagging += verdicts + _short_tails(model, done, {f.subject for f in verdicts}, scope)
    return lagging + findings


def _short_tails(model: str, done: list[dict], named: set[str], scope) -> list[Finding]:
    """Insufficient data, said, for a replica whose p90 reads past the bar while its compared requests lie
    in fewer time blocks than the block bootstrap needs (tail_latency.MIN_BLOCKS: a short window, or a
    canary that joined late). Without it that test is p = 1, silently. Not for a replica named lagging:
    an insufficient finding stands in for its kind's finding on the replica (the same finding id)."""
    short: dict[str, list] = {}
    for t in done:
        c = t["comparison"]
        if t["metric"] in TAIL and t["replica"] not in named and c.too_few_blocks:
            short.setdefault(t["replica"], []).append((t["metric"], c))
    out = []
    for rid, tails in sorted(short.items()):
        first = tails[0][1]
        read = ", ".join(f"{LABELS[m]} {c.ratio:.2f}x over {c.n_subject} requests" for m, c in tails)
        out.append(insufficient(
            KIND, rid, DIAGNOSTIC, scope,
            f"{rid} against its peers of {model}: {read}, but its compared requests lie in {first.blocks} time "
            f"blocks of {first.block_seconds:g} s; the block bootstrap needs them in {tail_latency.MIN_BLOCKS} "
            f"(traffic over a longer span)", model_name=model,
            tails={m: {"ratio": c.ratio, "blocks": c.blocks, "block_seconds": c.block_seconds,
                       "requests": c.n_subject} for m, c in tails},
            min_blocks=tail_latency.MIN_BLOCKS))
    return out


def _verdicts(store, model, group, done, identity, skip, scope, limits) -> list[Finding]:
    flagged: dict[str, dict] = {}
    for t in done:
        c, rid, m = t["comparison"], t["replica"], t["metric"]
        if t["holm_p"] >= ALPHA or c.ratio < MIN_EFFECT:
            continue
        peers = peers_for(group, rid, m, limits)
        full = c if m in TAIL else stratified.compare(*_sides(group[rid], peers, m), FLOORS[m], MIN_REQUESTS,
                                                      bootstrap=True)
        if full.ratio_ci is None or full.ratio_ci[0] <= MIN_EFFECT:
            continue
        flagged.setdefault(rid, {})[m] = {"ratio_to_peers": full.ratio, "ratio_ci": full.ratio_ci,
                                          "bar": MIN_EFFECT, "holm_p": t["holm_p"], "test_vs_peers": full.to_dict(),
                                          "controlled_for": list(COMPUTED_CONTROLLED if m in BY_COMPUTED
                                                                 else CONTROLLED)}
    findings = []
    for rid, metrics in flagged.items():
        worst_metric, worst = max(metrics.items(), key=lambda kv: kv[1]["ratio_to_peers"])
        me = identity.get(rid, {"replica_id": rid})
        peers = [identity.get(p, {"replica_id": p}) for p in sorted(group) if p != rid]
        diffs = identity_differences(me, peers)
        ratio, (lo, hi) = worst["ratio_to_peers"], worst["ratio_ci"]
        tw = worst["test_vs_peers"]
        like = (f"{tw['n_subject']} requests like for like in {tw['strata']} strata of workload, "
                + ("computed prompt tokens" if worst_metric in BY_COMPUTED else "prompt / output length")
                + " and offered load")
        if worst_metric in TAIL:
            summary = (f"{rid}'s {LABELS[worst_metric]} is {ratio:.2f}x its {len(peers)} peer(s)' of {model} "
                       f"(95% CI {lo:.2f}-{hi:.2f}x; {like}; {tw['above_peer_quantile']:.0%} of them above the "
                       f"peers' stratum p90, ~10% if alike; block bootstrap over {tw['blocks']} time blocks of "
                       f"{tw['block_seconds']:g} s, Holm p={worst['holm_p']:.1e} over {len(done)} tests); "
                       + _explain(diffs))
        else:
            summary = (f"{rid} is {ratio:.2f}x slower than its {len(peers)} peer(s) of {model} on "
                       f"{LABELS[worst_metric]} (95% CI {lo:.2f}-{hi:.2f}x; {like}; van Elteren "
                       f"p={tw['p_value']:.1e}, Holm over {len(done)} tests); " + _explain(diffs))
        evidence = {"model_name": model, "replica": rid, "peers": [p["replica_id"] for p in peers],
                    "metrics": metrics, "identity_differences": diffs,
                    "identity": {k: me.get(k) for k in
                                 (*IDENTITY, "cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes")},
                    "requests": {r: e["n"] for r, e in group.items()}, "unit": "request",
                    "controlled_for": list(COMPUTED_CONTROLLED if worst_metric in BY_COMPUTED else CONTROLLED),
                    "not_compared": sorted(
                        set(skip.get(rid, ())) | {m for m in PER_BATCH if not peers_for(group, rid, m, limits)}),
                    "compared_per_token_with": [p for p in sorted(group) if p != rid
                                                and limits.get(p, "") == limits.get(rid, "")],
                    "correction": f"Holm over {len(done)} tests (replicas x metrics, median and p90 tests)",
                    "method": "medians: latency over the peers' median in the same stratum, van Elteren stratified "
                              "MWU against the peers' pooled requests, stratified bootstrap CI of the ratio; p90 "
                              "(queue, TTFT): weighted mean log ratio of stratum p90s, block bootstrap over time "
                              "(diagnostics.tail_latency); prefill and TTFT in strata of computed prompt tokens "
                              "instead of prompt / output length"}
        severity = "critical" if ratio >= CRITICAL_RATIO else "warning"
        finding = Finding(KIND, severity, rid, summary, DIAGNOSTIC, scope, evidence)
        # a queue its own heavier traffic fills, on steps as fast as its peers', is kept at info (own_traffic)
        findings.append(own_traffic.kept_at_info(store, scope, mechanisms.cite(store, scope, finding, identity)))
    return findings
