"""The cross-scoring diagnostic on a real (embedded) store with controlled numbers.

Each rule has a case that goes red when it is removed: the shift against the self-rescoring control,
the effect floor (a significant but numerically tiny difference must not fire), Holm over pairs,
the naming with 2 replicas (baseline rule) and with 3 (the one that differs from agreeing peers),
and `insufficient data` with the requests needed.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import stats

from diagnostics import DIAGNOSTICS, rescore
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from telemetry.contract.probes import RESCORE_WORKLOAD, parse_rescore_request_id, rescore_request_id
from tests.diagnostics.diag_records import replica, request

T0 = time.time() - 3600
PROMPT = [1, 5, 6, 7, 8]
NOISE = 3e-5  # fp32 batch-composition noise, nats


def served(rid: str, i: int, lp0: np.ndarray):
    out = [20 + i % 7, 30 + i % 5, 40, 41][:len(lp0)]
    return request(rid, i, T0 + i * 0.01, prompt_ids=PROMPT, output_ids=out, workload="chat",
                   temperature=0.9, output_logprobs=[float(x) for x in lp0])


def scored(orig, scorer: str, delta: np.ndarray, round_: str = "p1000"):
    """scorer's rescore row of `orig`: its prompt logprobs, the output positions moved by `delta`."""
    ids = list(orig.prompt_token_ids) + list(orig.output_token_ids)
    head = [-2.0] * (len(orig.prompt_token_ids) - 1)
    return request(scorer, 0, orig.arrival_time + 60, prompt_ids=ids, output_ids=[3], workload=RESCORE_WORKLOAD,
                   request_id=rescore_request_id(round_, scorer, orig.request_id), temperature=0.0,
                   prompt_logprobs=head + [float(a + b) for a, b in zip(orig.output_logprobs, delta)])


def scored_fleet(store, n: int, replicas, seed: int, n_tok: int, starts, delta) -> None:
    """Every replica serves n requests; each is rescored by every replica, `delta(rng, served, scorer)`
    moving the scorer's logprobs of the output positions."""
    rng = np.random.default_rng(seed)
    store.insert_records("replicas", [replica(r, T0 - 100 + (starts or {}).get(r, k)) for k, r in enumerate(replicas)])
    rows = []
    for r in replicas:
        for i in range(n):
            orig = served(r, i, np.minimum(rng.normal(-0.4, 0.3, n_tok), -1e-3))
            rows.append(orig)
            for s in replicas:
                rows.append(scored(orig, s, delta(rng, r, s)))
    store.insert_records("requests", rows)


def fleet(store, n: int, damage: dict[frozenset, float], replicas=("a", "b"), seed=0, n_tok=4, starts=None,
          noise=NOISE):
    """A pair in `damage` moves the cross scores by N(0, sd) per token; every other pair (self included)
    by NOISE."""
    def delta(rng, r, s):
        return rng.normal(0, damage.get(frozenset((r, s)), noise) if s != r else noise, n_tok)

    scored_fleet(store, n, replicas, seed, n_tok, starts, delta)


def run(store):
    return rescore.run(store, DiagnosticRequest(Scope(start=T0 - 600)))


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_registered_and_ids_round_trip():
    assert DIAGNOSTICS["rescore"] is rescore
    rid = rescore_request_id("p17", "r.1", "req.9")
    assert rid == "rescore.p17.r.1.req.9"
    parsed = parse_rescore_request_id(rid, "r.1")
    assert (parsed.round_id, parsed.scorer_replica, parsed.original_request_id) == ("p17", "r.1", "req.9")
    assert parse_rescore_request_id("probe.p1.x.solo.r", "r") is None


def test_two_replicas_cross_shift_names_the_later_started(clean):
    fleet(clean, 16, {frozenset(("a", "b")): 0.02})
    found = above_info(run(clean))
    assert [(f.kind, f.subject) for f in found] == [("cross_score_shift", "b")]
    ev = found[0].evidence
    lead = max((p for p in ev["pairs"] if p["differs"]), key=lambda p: p["mean_cross_nats"])
    assert lead["ci95"][0] > 100 * lead["mean_self_nats"] and lead["p_holm"] < 0.05
    assert ev["control"].startswith("self-rescoring") and "identity_differences" in ev


def test_self_noise_only_is_clean(clean):
    fleet(clean, 16, {}, replicas=("a", "b", "c"))
    found = run(clean)
    assert not above_info(found)
    assert [f.kind for f in found] == ["cross_scores_agree"]


def test_difference_within_ten_times_the_self_floor_does_not_fire(clean):
    # noisy numerics (1e-3 nats on self-rescoring), cross 4x that: Wilcoxon says "larger" on 16
    # requests and the mean clears MIN_EFFECT, but the CI does not clear 10x the self floor
    fleet(clean, 16, {frozenset(("a", "b")): 4e-3}, noise=1e-3)
    found = run(clean)
    pairs = found[0].evidence["pairs"]
    assert min(p["p_holm"] for p in pairs) < 0.05 and max(p["mean_cross_nats"] for p in pairs) > 1e-3
    assert not above_info(found)


def test_immaterial_difference_does_not_fire(clean):
    # deterministic numerics (3e-7 self), cross 100x that (a kernel-level difference, equal weights):
    # significant and far above the self floor, but 3e-5 nats/token is below MIN_EFFECT
    fleet(clean, 16, {frozenset(("a", "b")): 3e-5}, noise=3e-7)
    found = run(clean)
    pairs = found[0].evidence["pairs"]
    assert min(p["p_holm"] for p in pairs) < 0.05 and max(p["ci95"][0] for p in pairs) > 10 * 3e-7
    assert not above_info(found)


def test_three_replicas_names_the_one_that_differs_from_agreeing_peers(clean):
    fleet(clean, 12, {frozenset(("b", "a")): 0.02, frozenset(("b", "c")): 0.02}, replicas=("a", "b", "c"),
          starts={"a": 5, "b": 0, "c": 2})  # b is neither last started nor last by name: the rule names it
    found = above_info(run(clean))
    assert [(f.subject, f.severity) for f in found] == [("b", "warning")]
    assert found[0].evidence["baseline"] == {"rule": "agreeing_peers", "replicas": ["a", "c"]}


def test_three_replicas_two_damaged_names_no_single_replica(clean):
    fleet(clean, 12, {frozenset(("c", "a")): 0.02, frozenset(("c", "b")): 0.02, frozenset(("a", "b")): 0.02},
          replicas=("a", "b", "c"))
    found = above_info(run(clean))
    assert [(f.kind, f.subject) for f in found] == [("cross_score_shift", "tiny")]


def test_holm_over_pairs(clean):
    """a->b: cross above self on 7 of 8 requests, below on one at rank 5 of 8 (|difference|):
    one-sided p = 10/256 = 0.039 alone, 0.078 after Holm over the two pairs: no finding."""
    clean.insert_records("replicas", [replica("a", T0 - 100), replica("b", T0 - 99)])
    rng = np.random.default_rng(3)
    rows = []
    cross = [1e-4, 2e-4, 3e-4, 4e-4, 0.0, 0.05, 0.06, 0.07]
    self_ = [0.0, 0.0, 0.0, 0.0, 5e-4, 0.0, 0.0, 0.0]
    for i in range(8):
        orig = served("a", i, np.full(4, -0.5))
        rows += [orig, scored(orig, "a", np.full(4, self_[i])), scored(orig, "b", np.full(4, cross[i]))]
        other = served("b", i, np.full(4, -0.5))
        rows += [other, scored(other, "b", rng.normal(0, NOISE, 4)), scored(other, "a", rng.normal(0, NOISE, 4))]
    clean.insert_records("requests", rows)
    diffs = np.array(cross) - np.array(self_)
    assert 0.025 < stats.wilcoxon(diffs, alternative="greater").pvalue < 0.05
    found = run(clean)
    assert not above_info(found), [f.summary for f in found]
    ab = next(p for p in found[0].evidence["pairs"] if p["served"] == "a")
    assert ab["p"] < 0.05 < ab["p_holm"]
    assert ab["ci95"][0] > ab["floor_nats"] and ab["mean_cross_nats"] > 1e-3  # Holm alone keeps it quiet


def test_too_few_rescored_requests_is_insufficient(clean):
    fleet(clean, 4, {frozenset(("a", "b")): 0.02})
    found = run(clean)
    assert found and all(f.kind == "insufficient_data" and f.severity == "info" for f in found)
    assert "need >= 8" in found[0].summary


def test_rows_of_another_prompt_are_not_joined(clean):
    """A request id that repeats on another replica is joined to the original whose prompt + output
    the scorer was given, not to both."""
    fleet(clean, 16, {})
    twin = served("b", 0, np.full(4, -3.0))  # b-0 exists; a row "b-0" on replica z with other tokens
    import dataclasses
    clean.insert_records("requests", [dataclasses.replace(twin, replica_id="z", output_token_ids=[90, 91, 92, 93])])
    assert not above_info(run(clean))


def test_noisy_numerics_everywhere_is_the_floor_not_a_shift(clean):
    """Replicas whose own numerics are noisy (bf16-like: 0.01 nats on self-rescoring too) agree with
    each other as well as with themselves: the control, not zero, is what a pair is compared with."""
    rng = np.random.default_rng(5)
    clean.insert_records("replicas", [replica("a", T0 - 100), replica("b", T0 - 99)])
    rows = []
    for r in ("a", "b"):
        for i in range(16):
            orig = served(r, i, np.full(4, -0.5))
            rows += [orig] + [scored(orig, s, rng.normal(0, 0.01, 4)) for s in ("a", "b")]
    clean.insert_records("requests", rows)
    assert not above_info(run(clean))


def test_two_identities_started_together_get_one_finding_on_the_pair(clean):
    fleet(clean, 16, {frozenset(("a", "b")): 0.02})
    # the same fleet start for both (one deploy instant), b on other weights, no role: neither side is named
    clean.insert_records("replicas", [replica("a", T0 - 90, deploy_time=T0 - 120),
                                      replica("b", T0 - 90.5, deploy_time=T0 - 120, weights_hash="w-other")])
    found = above_info(run(clean))
    assert [(f.kind, f.severity, f.subject) for f in found] == [("cross_score_shift", "warning", "a vs b")]
    assert found[0].evidence["symmetric"] and "no baseline" in found[0].summary


def test_three_replicas_with_untested_pairs_wait_instead_of_warning_on_the_model(clean):
    # continuous cross-scoring sends each pick to one peer: c's requests were scored by a (enough to
    # differ) but b<->c has too few either way, so nothing names c yet, and nothing blames the model
    fleet(clean, 12, {frozenset(("c", "a")): 0.02}, replicas=("a", "c"))
    extra = [served("b", 100 + i, np.full(4, -0.4)) for i in range(3)]
    clean.insert_records("replicas", [replica("b", T0 - 100)])
    clean.insert_records("requests", extra + [scored(o, s, np.zeros(4)) for o in extra for s in ("b", "c")])
    found = run(clean)
    assert not above_info(found)
    assert any(f.evidence.get("status") == "insufficient_data" and f.subject == "tiny" for f in found)
