"""Speculative traffic for tests: requests with per-request acceptance, and the steps that carry their drafts."""

from __future__ import annotations

import json
import random

from diag_records import replica, request, step

SPEC = {"speculative_mode": "draft"}


def spec_replica(rid: str, t0: float, k: int = 3, **kw):
    return replica(rid, t0 - 10, config_json=json.dumps({"model": "/x", "num_speculative_tokens": k}), **SPEC, **kw)


def spec_traffic(rid: str, t0: float, plan, k: int = 3, seed: int = 0, spacing: float = 1.0):
    """`plan`: one (workload, q, drafts) per request; each of its `drafts` k-token drafts accepts position i
    with probability q given i - 1 was accepted. One request per `spacing` seconds, its drafts in one step."""
    rng = random.Random(seed)
    reqs, steps = [], []
    for j, (workload, q, drafts) in enumerate(plan):
        per_pos = [0] * k
        for _ in range(drafts):
            for pos in range(k):
                if rng.random() >= q:
                    break
                per_pos[pos] += 1
        t = t0 + j * spacing
        reqs.append(request(rid, j, t, workload=workload, spec_proposed=k * drafts, spec_accepted=sum(per_pos)))
        steps.append(step(rid, j, t, spec_proposed=k * drafts, spec_accepted=sum(per_pos), per_pos=per_pos))
    return reqs, steps


def exact_traffic(rid: str, t0: float, n_requests: int, proposals: int, accepted_total: int, seed: int = 0,
                  workload: str = "chat"):
    """k = 1: `n_requests` requests of `proposals` each, binomial per request, adjusted to `accepted_total` exactly."""
    rng = random.Random(seed)
    q = accepted_total / (n_requests * proposals)
    counts = [sum(rng.random() < q for _ in range(proposals)) for _ in range(n_requests)]
    while sum(counts) != accepted_total:  # nudge single tokens: the dispersion stays binomial
        i = rng.randrange(n_requests)
        if sum(counts) < accepted_total and counts[i] < proposals:
            counts[i] += 1
        elif sum(counts) > accepted_total and counts[i] > 0:
            counts[i] -= 1
    reqs = [request(rid, j, t0 + j, workload=workload, spec_proposed=proposals, spec_accepted=c)
            for j, c in enumerate(counts)]
    steps = [step(rid, j, t0 + j, spec_proposed=proposals, spec_accepted=c, per_pos=[c]) for j, c in enumerate(counts)]
    return reqs, steps
