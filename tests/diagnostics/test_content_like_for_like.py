"""Content diagnostics compare the same kind of prompt: a healthy replica that serves another tenant
(its own system prompt, longer prompts, several times the load) is not a faulty one.

Each case pairs a must-not-fire fleet (r1 also serves a tenant r0 never sees) with a must-fire one
(a real fault under the same traffic), on the migrated chdb store. The tenant cases go red when the
prompt families (diagnostics.prompt_family) are taken out: pooled, r1's content differs from r0's.
"""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
from diag_faults import with_normalizer
from diag_records import replica, request

from diagnostics import prefix_hits, prompt_family, quality, request_strata
from diagnostics import token_frequencies as freq
from diagnostics import tokenizer as tokdiag
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.prompt import chat_prompt
from engine.core.tokenization import Tokenizer
from telemetry.contract.probes import PROBE_WORKLOAD

WORDS = ("the cache replica latency token prompt model queue batch decode prefill kernel memory request "
         "answer sort reverse numbers value key string").split()
OTHER_WORDS = ("Paris invoice Tuesday refund customer shipping warranty Alice order Bob parcel delivery "
               "London receipt account").split()


def _words(rng: random.Random, vocabulary, n: int) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(n))


def system_prompt(seed: int, vocabulary=WORDS) -> str:
    """As loadgen's chat workload writes one: a shared opening, then words of the tenant's seed."""
    return "You are a helpful assistant for inference engineers. " + _words(random.Random(seed), vocabulary, 30)


def tenant_chats(rid: str, tok: Tokenizer, system: str, n: int, t0: float, start: int, rng: random.Random,
                 vocabulary=WORDS, question_words: int = 8, workload: str = "chat") -> list:
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": _words(rng, vocabulary, question_words) + "?"}]
        p = chat_prompt(tok, messages)
        out.append(request(rid, start + i, t0 + 0.01 * (start + i), prompt_ids=p.token_ids, temperature=0.8,
                           workload=workload,
                           prompt_text_hash=p.text_hash, rendered_prompt_hash=p.rendered_hash))
    return out


@pytest.fixture(scope="module")
def dirs(tiny_llama, tmp_path_factory):
    return {"clean": tiny_llama,
            "lower": with_normalizer(tiny_llama, tmp_path_factory.mktemp("tenant") / "lower", {"type": "Lowercase"})}


def tenant_fleet(store, dirs, t0: float, r1_kind: str = "clean", tenant: str = "system_prompt") -> dict:
    """r0 and r1 share tenant A's chats; r1 also serves tenant B, 4.8x A's share, that r0 never sees:
    B's own system prompt and vocabulary, or A's system prompt with much longer questions."""
    toks = {"r0": Tokenizer(dirs["clean"]), "r1": Tokenizer(dirs[r1_kind])}
    store.insert_records("replicas", [replica(rid, t0 - 600 + 60 * k, model_dir=str(dirs["clean" if rid == "r0"
                                                                                         else r1_kind]),
                                              tokenizer_hash=tok.tokenizer_hash)
                                      for k, (rid, tok) in enumerate(toks.items())])
    rng = random.Random(7)
    a = system_prompt(1)
    for rid, tok in toks.items():
        store.insert_records("requests", tenant_chats(rid, tok, a, 60, t0, 0, rng))
    if tenant == "system_prompt":
        b = tenant_chats("r1", toks["r1"], system_prompt(2, OTHER_WORDS), 290, t0, 1000, rng, OTHER_WORDS)
    else:  # the same system prompt, questions eight times longer (another prompt-length bucket)
        b = tenant_chats("r1", toks["r1"], a, 290, t0, 1000, rng, OTHER_WORDS, question_words=120)
    store.insert_records("requests", b)
    return toks


def diagnose(store, t0: float) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in tokdiag.run(store, DiagnosticRequest(Scope(start=t0 - 60))):
        out.setdefault(f.kind, []).append(f)
    return out


def above_info(found: dict) -> list:
    return [f for fs in found.values() for f in fs if f.severity != "info"]


# -- token frequencies ------------------------------------------------------------------------------

@pytest.mark.parametrize("tenant", ["system_prompt", "prompt_length"])
def test_a_tenant_of_its_own_is_not_a_token_distribution_shift(clean, dirs, tenant):
    t0 = time.time() - 300
    tenant_fleet(clean, dirs, t0, tenant=tenant)
    found = diagnose(clean, t0)
    assert above_info(found) == []
    assert "token_distribution_traffic" not in found and "token_distribution_shift" not in found
    # compared on tenant A's family only: B's requests were left out, not pooled
    [t], _ = freq.pair_tests(freq.read_workloads(clean, Scope(start=t0 - 60)))
    assert t.requests == (60, 60) and t.left_out == (0, 290) and not t.differs
    assert all(f != prompt_family.UNSHARED for f in t.families)


def test_pooled_the_same_tenant_traffic_would_read_as_a_shift(clean, dirs, monkeypatch):
    # the control for the test above: without prompt families, r1's extra tenant moves its token mix
    t0 = time.time() - 300
    tenant_fleet(clean, dirs, t0)
    monkeypatch.setattr(prompt_family, "HEADS", ())  # every request "unshared": one family per length bucket
    [t], _ = freq.pair_tests(freq.read_workloads(clean, Scope(start=t0 - 60)))
    assert t.differs and t.requests[1] > 60  # B pooled with A


def test_a_tokenizer_fault_under_tenant_traffic_is_still_caught(clean, dirs):
    # the same chats became other IDs on r1 (lowercasing): same-text evidence, whatever the tenants
    t0 = time.time() - 300
    toks = tenant_fleet(clean, dirs, t0, r1_kind="lower")
    found = diagnose(clean, t0)
    assert "tokenizer_divergence" not in found  # load-balanced chats: no text reached both replicas
    # the prober's round: the same chats on every replica
    system = system_prompt(3)
    for rid, tok in toks.items():
        clean.insert_records("requests", tenant_chats(rid, tok, system, 6, t0, 5000, random.Random(3),
                                                      workload=PROBE_WORKLOAD))
    found = diagnose(clean, t0)
    [div] = found["tokenizer_divergence"]
    assert div.subject == "r1" and div.severity == "critical" and div.evidence["divergent"] == 6
    assert "r0" not in {f.subject.split()[0] for f in above_info(found)}


def test_a_shift_is_a_tokenizer_warning_only_with_tokenizer_evidence():
    # the labelling rule alone: the same differing pair, with and without same-text evidence
    t = freq.PairTest("m", "chat", "r0", "r1", 10, 500.0, 1.0, 9.0, 1e-9, 0.3, 0.2, (50, 50), (900, 900),
                      p_holm=1e-8, families=("f|prompt<64",))
    w = freq.Workload("m", "chat", "f|prompt<64", ["r0", "r1"], np.array([50, 50]), np.array([5, 6]),
                      np.ones((2, freq.BLOCKS, 3)))
    g = freq.Group("m", "chat", [w])
    scope = Scope(start=0.0)
    sample = {"requests_in_window": 100}
    plain = freq._finding(g, "r1", [t], [t], None, None, scope, False, sample, None)
    assert (plain.kind, plain.severity, plain.evidence["cause"]) == ("token_distribution_traffic", "info", "traffic")
    named = freq._finding(g, "r1", [t], [t], None, None, scope, False, sample, "3 of 20 prompt texts ...")
    assert (named.kind, named.severity, named.evidence["cause"]) == ("token_distribution_shift", "warning",
                                                                     "tokenizer")


# -- prefix hits ------------------------------------------------------------------------------------

def _prompt(head: int, rng: random.Random, length: int) -> list[int]:
    """A shared 64-token preamble (head's), then the request's own tokens."""
    return [1] + list(range(head, head + 63)) + [rng.randrange(2000, 3000) for _ in range(length)]


def hit_requests(rid: str, head: int, n: int, start: float, every: float, rate: float, rng, first: int = 0):
    """n requests of the family of `head` arriving every `every` s, hitting about `rate` of their prompt."""
    out = []
    for k in range(n):
        ids = _prompt(head, rng, rng.randint(15, 25))
        cached = int(round(len(ids) * min(1.0, max(0.0, rate + rng.uniform(-0.05, 0.05)))))
        out.append(request(rid, first + k, start + every * k, prompt_ids=ids, cached_tokens=cached))
    return out


def prefix_fleet(store, t0: float, r1_hits_a: float = 0.75) -> None:
    """Tenant A (preamble cached: ~75% of its prompt tokens hit) on r0 and r1; tenant B, 4.8x, on r1
    only, whose preamble is short of a cache block: ~5% hit."""
    rng = random.Random(31)
    store.insert_records("replicas", [replica(r, t0 - 60) for r in ("r0", "r1")])
    store.insert_records("requests", hit_requests("r0", 100, 60, t0, 0.1, 0.75, rng)
                         + hit_requests("r1", 100, 60, t0 + 6, 0.1, r1_hits_a, rng)
                         + hit_requests("r1", 500, 290, t0 + 12, 0.1, 0.05, rng, first=60))


def test_a_tenant_with_its_own_prompts_is_not_a_prefix_hit_gap(clean):
    t0 = time.time() - 600
    prefix_fleet(clean, t0)
    assert prefix_hits.run(clean, DiagnosticRequest(Scope(start=t0 - 60)), {}) == []


def test_pooled_the_tenant_would_read_as_a_prefix_hit_gap(clean, monkeypatch):
    t0 = time.time() - 600
    prefix_fleet(clean, t0)
    monkeypatch.setattr(prompt_family, "HEADS", ())
    assert [f.subject for f in prefix_hits.run(clean, DiagnosticRequest(Scope(start=t0 - 60)), {})] == ["r1"]


def test_a_cache_that_misses_on_the_shared_family_is_still_a_gap(clean):
    t0 = time.time() - 600
    prefix_fleet(clean, t0, r1_hits_a=0.05)
    [gap] = prefix_hits.run(clean, DiagnosticRequest(Scope(start=t0 - 60)), {})
    assert gap.subject == "r1"
    w = gap.evidence["workloads"]["chat"]
    assert w["requests"] <= 60 and w["requests_left_out"] >= 290 and w["gap_ci"][0] >= prefix_hits.MIN_GAP


def load_fleet(store, t0: float) -> None:
    """Tenant A on both replicas: r0 at one request a second hits 81% of its prompt tokens; r1, sent
    4.8x the requests, evicts sooner and hits 65%."""
    rng = random.Random(37)
    store.insert_records("replicas", [replica(r, t0 - 60) for r in ("r0", "r1")])
    store.insert_records("requests", hit_requests("r0", 100, 60, t0, 1.0, 0.81, rng)
                         + hit_requests("r1", 100, 288, t0, 1.0 / 4.8, 0.65, rng))


def test_a_replica_sent_more_load_is_not_a_prefix_hit_gap(clean):
    t0 = time.time() - 600
    load_fleet(clean, t0)
    assert prefix_hits.run(clean, DiagnosticRequest(Scope(start=t0 - 60)), {}) == []


def test_without_load_strata_the_heavier_tenant_would_read_as_a_gap(clean, monkeypatch):
    t0 = time.time() - 600
    load_fleet(clean, t0)
    monkeypatch.setattr(request_strata, "OFFERED_WINDOW", 0.0)  # no load counted: one load stratum
    assert [f.subject for f in prefix_hits.run(clean, DiagnosticRequest(Scope(start=t0 - 60)), {})] == ["r1"]


# -- sampled logprobs -------------------------------------------------------------------------------

def logprob_fleet(store, t0: float, r1_shift_a: float = 0.0) -> None:
    """Tenant A on r0 and r1 (the model about as sure on both); tenant B, 4.8x, on r1 only, whose
    prompts leave the model much less sure (-1.5 nats/token lower)."""
    rng = random.Random(41)
    nrng = np.random.default_rng(41)
    store.insert_records("replicas", [replica(r, t0 - 60) for r in ("r0", "r1")])
    reqs, i = [], 0
    for rid, tenant, n in (("r0", "A", 80), ("r1", "A", 80), ("r1", "B", 380)):
        for _ in range(n):
            ids = _prompt(100 if tenant == "A" else 500, rng, rng.randint(15, 25))
            level = -1.0 + (r1_shift_a if rid == "r1" and tenant == "A" else 0.0) - (1.5 if tenant == "B" else 0.0)
            lp = np.minimum(level + nrng.normal(0, 0.5, 16), 0.0)
            reqs.append(request(rid, i, t0 + 0.1 * i, prompt_ids=ids, output_ids=list(range(10, 26)),
                                output_logprobs=[float(x) for x in lp],
                                sampling_params_json=json.dumps({"temperature": 0.9, "top_p": 1.0, "top_k": -1,
                                                                 "max_tokens": 16})))
            i += 1
    store.insert_records("requests", reqs)


def _quality(store, t0):
    return [f for f in quality.run(store, DiagnosticRequest(Scope(start=t0 - 60)))
            if f.kind == quality.KIND]


def test_a_tenant_the_model_is_less_sure_of_is_not_a_logprob_shift(clean):
    t0 = time.time() - 600
    logprob_fleet(clean, t0)
    assert _quality(clean, t0) == []


def test_pooled_the_tenant_would_read_as_a_logprob_shift(clean, monkeypatch):
    t0 = time.time() - 600
    logprob_fleet(clean, t0)
    monkeypatch.setattr(prompt_family, "HEADS", ())
    assert [f.subject for f in _quality(clean, t0)] == ["r1"]


def test_a_damaged_replica_under_tenant_traffic_is_still_a_logprob_shift(clean):
    t0 = time.time() - 600
    logprob_fleet(clean, t0, r1_shift_a=-0.8)
    assert [f.subject for f in _quality(clean, t0)] == ["r1"]
