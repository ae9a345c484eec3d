"""The sampled-token agreement rule on a real (embedded) store with controlled numbers: a peer's
logprob of each replica's sampled tokens against the replica's own (both from the cross-score).

Must fire: every pair with the candidate loses nats on the other's samples (a KL, negative in both
directions). Must not fire: numerical noise with no sign, however large (which |dlogprob| alone
cannot tell from another model), a shift too small to matter, too few requests (insufficient data).
"""

from __future__ import annotations

import numpy as np

from diagnostics import DIAGNOSTICS, agreement
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from tests.diagnostics.diag_records import replica
from tests.diagnostics.test_rescore import NOISE, T0, above_info, scored, scored_fleet, served


def fleet(store, n: int, kl: dict[frozenset, float], replicas=("a", "b"), seed=0, sd=NOISE, n_tok=4, starts=None):
    """Every replica serves n requests, each scored by every replica. A pair in `kl` scores the other's
    tokens lower by that many nats/token on average (spread 0.5x); all scores carry N(0, sd) noise."""
    def delta(rng, r, s):
        shift = kl.get(frozenset((r, s)), 0.0) if s != r else 0.0
        return rng.normal(0, sd, n_tok) - shift * rng.uniform(0.5, 1.5, n_tok)

    scored_fleet(store, n, replicas, seed, n_tok, starts, delta)


def run(store):
    return agreement.run(store, DiagnosticRequest(Scope(start=T0 - 600)))


def test_registered():
    assert DIAGNOSTICS["agreement"] is agreement


def test_peer_finds_the_candidates_samples_less_likely_fires(clean):
    fleet(clean, 8, {frozenset(("a", "b")): 0.02})
    found = above_info(run(clean))
    assert [(f.kind, f.subject) for f in found] == [("sampled_token_disagreement", "b")]  # b started later
    (pair,) = found[0].evidence["pairs"]
    assert pair["requests"] == 16 and pair["ci95"][1] < -1e-3 and pair["kl_estimate_nats"] > 0.01


def test_large_noise_without_a_sign_does_not_fire(clean):
    # every score moved by N(0, 0.05) nats/token: |dlogprob| is far above any floor, the sign is not
    fleet(clean, 16, {}, sd=0.05)
    found = run(clean)
    assert not above_info(found) and [f.kind for f in found] == ["sampled_tokens_agree"]


def test_immaterial_shift_does_not_fire(clean):
    # a systematic 1e-4 nats/token (below MIN_EFFECT) under tiny noise: significant, not material
    fleet(clean, 16, {frozenset(("a", "b")): 1e-4}, sd=1e-6)
    found = run(clean)
    assert found[0].evidence["pairs"][0]["p_holm"] < 0.05
    assert not above_info(found)


def test_three_replicas_name_the_one_that_disagrees_with_agreeing_peers(clean):
    fleet(clean, 6, {frozenset(("c", "a")): 0.02, frozenset(("c", "b")): 0.02}, replicas=("a", "b", "c"),
          starts={"a": 5, "b": 3, "c": 0})  # c started first: the peers' agreement names it, not start order
    found = above_info(run(clean))
    assert [(f.kind, f.subject) for f in found] == [("sampled_token_disagreement", "c")]
    assert found[0].evidence["baseline"]["rule"] == "agreeing_peers"


def test_too_few_requests_is_insufficient(clean):
    fleet(clean, 3, {frozenset(("a", "b")): 0.05})
    found = run(clean)
    assert not above_info(found)
    assert [f.evidence.get("status") for f in found] == ["insufficient_data"] and found[0].evidence["needed"] == 8


def test_three_replicas_with_an_untested_pair_wait_instead_of_warning_on_the_model(clean):
    fleet(clean, 6, {frozenset(("c", "a")): 0.02}, replicas=("a", "c"))
    few = [served("b", 100 + i, np.full(4, -0.4)) for i in range(2)]
    clean.insert_records("replicas", [replica("b", T0 - 100)])
    clean.insert_records("requests", few + [scored(o, s, np.zeros(4)) for o in few for s in ("b", "c")])
    found = run(clean)
    assert not above_info(found)
    assert any(f.evidence.get("status") == "insufficient_data" and f.subject == "tiny" for f in found)
