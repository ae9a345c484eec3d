"""Sampled tokens a peer finds less likely: a replica that serves another model, seen in its own samples.

A small model stays confident while wrong: its sampled tokens keep high logprobs under its own weights
(diagnostics/quality.py sees nothing), but a peer with the intended weights gives them less.
The cross-score (engine/traffic/probe/cross_scoring.py: each scored request teacher-forced by a peer S and by
the replica R that served it) gives, per request and output position, lp_S(token) and lp_R(token)
under the same conditions (both prefill, same prompt). Per request:

    x = mean over output positions of (lp_S(token) - lp_R(token))

For tokens drawn from R's distribution the expectation of log p_S - log p_R is -KL(p_R || p_S) <= 0
(Gibbs' inequality; sampling at a temperature below 1 sharpens p_R and keeps the sign): any
difference between the models pulls x below 0, in both directions of a pair, while numerical noise
(kernels, batch composition) moves it either way. So, unlike |dlogprob| (diagnostics/rescore.py),
the sign itself separates another model from noise.

Unit: the request. Per unordered pair {A, B} of one model, both directions pooled (A's requests scored
by B, B's by A): one-sided Wilcoxon signed-rank that x < 0, Holm over the model's pairs; effect: mean x
with a 95% bootstrap CI over requests, a pair disagrees when p_holm < ALPHA and the CI's high end is
below -MIN_EFFECT nats/token. Naming as cross_scores: two replicas, the baseline rule (no baseline:
one finding on the pair); three or more, the replica every one of whose pairs disagrees while its
peers agree among themselves.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from diagnostics.rescore import name_subject, run_scored_models
from diagnostics.findings import Finding, insufficient
from evals.stats import holm, mean_interval
from diagnostics.replicas import differs_in, identity_differences
from diagnostics.request import DiagnosticRequest

DIAGNOSTIC = "agreement"
KIND = "sampled_token_disagreement"
ALPHA = 0.05
MIN_REQUESTS = 8  # scored requests per pair, both directions together
MIN_EFFECT = 1e-3  # nats/token: a KL the peer pays on the replica's samples; numerics stay ~1e-5
CRITICAL = 0.05


def pair_values(served: dict, a: str, b: str) -> np.ndarray:
    """x per request for the pair {a, b}: a's requests scored by b, and b's by a, each against its self-score."""
    xs = []
    for owner, peer in ((a, b), (b, a)):
        mine = served.get(owner, {})
        cross, self_ = mine.get(peer, {}), mine.get(owner, {})
        xs += [cross[i][1] - self_[i][1] for i in sorted(set(cross) & set(self_))]
    return np.array(xs, dtype=float)


def signed_rank_less(x: np.ndarray) -> float:
    if not np.any(x != 0):
        return 1.0
    return float(stats.wilcoxon(x, alternative="less", zero_method="wilcox").pvalue)


def decide_pairs(served: dict, replicas: list[str], rng) -> list[dict]:
    pairs = []
    for i, a in enumerate(replicas):
        for b in replicas[i + 1:]:
            x = pair_values(served, a, b)
            if len(x):
                pairs.append({"pair": (a, b), "n": len(x), "x": x})
    tested = [p for p in pairs if p["n"] >= MIN_REQUESTS]
    for p in tested:
        p["p"] = signed_rank_less(p["x"])
    for p, q in zip(tested, holm([p["p"] for p in tested])):
        p["p_holm"], p["mean"] = q, float(np.mean(p["x"]))
        p["ci"] = mean_interval(p["x"], rng)
        p["disagrees"] = bool(q < ALPHA and p["ci"][1] < -MIN_EFFECT)
    return pairs


def run(store, request: DiagnosticRequest) -> list[Finding]:
    return run_scored_models(store, request, _scored_model)


def _scored_model(model, served, replicas, identity, baseline, scope, rng) -> list[Finding]:
    pairs = decide_pairs(served, replicas, rng)
    findings = [insufficient(KIND, " vs ".join(p["pair"]), DIAGNOSTIC, scope,
                             f"{p['n']} requests of the pair cross-scored with their self-score; need >= "
                             f"{MIN_REQUESTS} ({MIN_REQUESTS - p['n']} more: continuous cross-scoring, "
                             f"[cross_score] share)", requests=p["n"], needed=MIN_REQUESTS, model_name=model)
                for p in pairs if p["n"] < MIN_REQUESTS]
    return findings + _model_findings(model, replicas, [p for p in pairs if "p_holm" in p], identity, baseline, scope,
                                      untested=any(p["n"] < MIN_REQUESTS for p in pairs))


def _evidence(p: dict) -> dict:
    return {"pair": list(p["pair"]), "requests": p["n"], "mean_nats": p["mean"], "ci95": p["ci"],
            "kl_estimate_nats": -p["mean"], "p": p["p"], "p_holm": p["p_holm"], "disagrees": p["disagrees"]}


def _model_findings(model, replicas, pairs, identity, baseline, scope, untested=False) -> list[Finding]:
    if not pairs:
        return []
    evidence = {
        "model_name": model, "replicas": replicas,
        "unit": "request: mean over its output positions of the peer's minus the serving replica's teacher-forced "
                "logprob of the sampled token (both from the cross-score), nats/token; both directions pooled",
        "test": "one-sided Wilcoxon signed-rank (below 0), Holm over the model's pairs",
        "effect": f"mean over requests, 95% bootstrap CI; its high end below -{MIN_EFFECT:g} nats/token",
        "why": "samples of p_R scored by p_S: expectation -KL(p_R || p_S) <= 0; numerical noise has no sign",
        "pairs": [_evidence(p) for p in pairs],
    }
    hits = [p for p in pairs if p["disagrees"]]
    if not hits:
        return [Finding("sampled_tokens_agree", "info", model,
                        f"{model}: each replica's sampled tokens are as likely under its peers on {len(pairs)} pairs "
                        f"(mean {min(p['mean'] for p in pairs):.2g} nats/token at the lowest)", DIAGNOSTIC, scope,
                        evidence, id_kind=KIND)]
    subject = name_subject(replicas, {frozenset(p["pair"]) for p in hits}, baseline, identity, evidence)
    if subject is None:
        names = ", ".join(" vs ".join(p["pair"]) for p in hits)
        if untested:  # a pair with too few requests yet may still name one replica: wait for it
            return [insufficient(KIND, model, DIAGNOSTIC, scope, f"sampled tokens disagree on {names}, and other "
                                 f"pairs have fewer than {MIN_REQUESTS} scored requests: which replica differs is "
                                 "not known yet", model_name=model, pairs=evidence["pairs"])]
        return [Finding(KIND, "warning", model, f"{model}: sampled tokens disagree on pairs {names}, which no single "
                        "replica explains (several replicas differ?)", DIAGNOSTIC, scope, evidence)]
    lead = max((p for p in hits if subject in p["pair"]), key=lambda p: -p["ci"][1])
    peers = [r for r in replicas if r != subject]
    diffs = identity_differences(identity.get(subject, {}), [identity[p] for p in peers if p in identity])
    evidence["replica"], evidence["identity_differences"] = subject, diffs
    summary = (f"{subject} ({model}) and its peers find each other's sampled tokens less likely: pair "
               f"{' vs '.join(lead['pair'])} {lead['mean']:.3g} nats/token [95% CI {lead['ci'][0]:.3g}, "
               f"{lead['ci'][1]:.3g}] (a KL of ~{-lead['mean']:.2g}) over {lead['n']} requests, Wilcoxon "
               f"signed-rank p_holm={lead['p_holm']:.2g}; {len([p for p in hits if subject in p['pair']])} of "
               f"{len(pairs)} pairs disagree")
    if diffs:
        summary += "; differs in " + differs_in(diffs, 4)
    if len(replicas) == 2 and baseline is not None and not baseline.decided:
        pair = " vs ".join(sorted(replicas))
        evidence["symmetric"] = True
        return [Finding(KIND, "warning", pair, f"{pair}: {summary}; no baseline: {baseline.reason}", DIAGNOSTIC,
                        scope, evidence)]
    severity = "critical" if lead["ci"][1] <= -CRITICAL else "warning"
    return [Finding(KIND, severity, subject, summary, DIAGNOSTIC, scope, evidence)]
