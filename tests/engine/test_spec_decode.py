"""Speculative decoding in the engine: greedy output identical to plain decoding
(both proposers, several batch sizes, prefix caching on), the target distribution
kept at temperature > 0, KV rollback without leaks under arbitrary accept/reject
patterns, and the acceptance metrics in the step and request records."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from engine.core.engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from tests.engine.test_engine_greedy import StepCollector

MAX_TOKENS = 16
K = 3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # many tiny forwards: extra threads only add contention on a small shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_prompts(n, seed, shared_prefix=()):
    """Prompts with a shared prefix, then a distinct token, then a repeated motif (so
    n-gram lookup finds something)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        motif = [rng.randrange(6, 500) for _ in range(rng.randint(2, 5))]
        body = [rng.randrange(6, 500) for _ in range(rng.randint(3, 16))]
        prompts.append(list(shared_prefix) + [100 + i] + body + motif * rng.randint(1, 3) + body[:3])
    return prompts


def generate(engine, prompts, params, check_each_step=False):
    params = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp, stream=False)
    results, steps = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                results[int(out.request_id)] = out
        if check_each_step:
            check_kv_state(engine)
        steps += 1
        assert steps < 5000
    assert engine.kv_cache.num_used_blocks == 0, "blocks leaked"
    engine.kv_cache.check_invariants()
    return [results[i] for i in range(len(prompts))]


def check_kv_state(engine):
    """Between steps every running sequence holds exactly the blocks of its computed tokens
    (rejected drafts' blocks went back), and the pool's books balance."""
    kv = engine.kv_cache
    kv.check_invariants()
    for seq in engine.scheduler.running:
        assert seq.num_computed_tokens == len(seq.token_ids) - 1
        assert len(seq.block_table) == kv.blocks_for(seq.num_computed_tokens)
    held = {b for seq in engine.scheduler.running for b in seq.block_table}
    assert len(held) <= kv.num_used_blocks


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def draft(tiny_model_factory, target):
    # a 1-layer random llama sharing the target's tokenizer: low acceptance, which is fine for exactness
    return tiny_model_factory("llama", num_layers=1, seed=7, tokenizer_dir=str(target))


@pytest.fixture(scope="module")
def reference(target):
    prompts = make_prompts(6, seed=3, shared_prefix=[11, 12, 13, 14, 15, 16, 17, 18, 19])
    engine = LLMEngine(target, block_size=4, num_kv_blocks=512)
    return prompts, [o.token_ids for o in generate(engine, prompts, GREEDY)]


def spec_config(mode, target, draft):
    return {"ngram": dict(speculative_mode="ngram"),
            "draft": dict(speculative_mode="draft", draft_model=str(draft)),
            "draft-is-target": dict(speculative_mode="draft", draft_model=str(target))}[mode]


@pytest.mark.parametrize("mode", ["ngram", "draft", "draft-is-target"])
@pytest.mark.parametrize("max_num_seqs", [1, 4])
def test_greedy_output_identical_to_plain_decoding(target, draft, reference, mode, max_num_seqs):
    prompts, expected = reference
    obs = StepCollector()
    engine = LLMEngine(target, obs, block_size=4, num_kv_blocks=512, enable_prefix_caching=True,
                       max_num_seqs=max_num_seqs, num_speculative_tokens=K, **spec_config(mode, target, draft))
    outs = generate(engine, prompts, GREEDY, check_each_step=True)
    assert [o.token_ids for o in outs] == expected
    assert sum(s.prefix_hit_tokens for s in obs.steps) > 0  # the shared prefix was served from cache

    proposed = sum(s.spec_proposed for s in obs.steps)
    accepted = sum(s.spec_accepted for s in obs.steps)
    assert proposed > 0
    assert proposed == sum(r.spec_proposed for r in obs.requests) == sum(o.metrics.spec_proposed for o in outs)
    assert accepted == sum(r.spec_accepted for r in obs.requests) == sum(o.metrics.spec_accepted for o in outs)
    for s in obs.steps:
        assert sum(s.spec_accepted_per_pos) == s.spec_accepted <= s.spec_proposed
        assert all(a >= b for a, b in zip(s.spec_accepted_per_pos, s.spec_accepted_per_pos[1:]))
    if mode == "draft-is-target":
        assert accepted == proposed  # every greedy draft is the target's own argmax
    if mode == "ngram":
        assert 0 < accepted < proposed  # partial acceptance: the rollback path ran
    # one target forward emitted several tokens where drafts were accepted
    assert sum(s.num_generated_tokens for s in obs.steps) == len(prompts) * MAX_TOKENS
    if accepted:
        assert len([s for s in obs.steps if s.phase != "prefill"]) < len(prompts) * (MAX_TOKENS - 1)


def test_greedy_logprobs_and_stop_tokens_match_plain_decoding(target, reference):
    prompts, expected = reference
    stop = expected[0][5]  # a token the first request emits mid-way: it must stop exactly there
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, stop_token_ids=[stop])
    plain = generate(LLMEngine(target, block_size=4, num_kv_blocks=512), prompts, params)
    spec = generate(LLMEngine(target, block_size=4, num_kv_blocks=512, speculative_mode="draft",
                              draft_model=str(target), num_speculative_tokens=K), prompts, params)
    assert plain[0].finish_reason == "stop" and plain[0].token_ids[-1] == stop
    for a, b in zip(plain, spec):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert len(b.logprobs) == len(b.token_ids)
        for la, lb in zip(a.logprobs, b.logprobs):
            assert la.token_id == lb.token_id
            assert la.logprob == pytest.approx(lb.logprob, abs=1e-4)
            assert la.top.keys() == lb.top.keys()


def test_sampling_distribution_kept_at_temperature(target):
    """Temperature 1 with top-k 3 (a three-token vocabulary per position): the 2nd and 3rd
    output tokens of many seeded requests are distributed alike with and without
    speculation (chi-square test of homogeneity). The draft is the target itself, so
    every decode step proposes and the rejection sampler decides every token."""
    n = 400
    prompt = [11, 21, 22, 23, 24, 25]
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=s) for s in range(n)]
    common = dict(block_size=4, num_kv_blocks=1024, max_num_seqs=128)
    plain = generate(LLMEngine(target, **common), [prompt] * n, params)
    obs = StepCollector()
    spec = generate(LLMEngine(target, obs, speculative_mode="draft", draft_model=str(target),
                              num_speculative_tokens=2, **common), [prompt] * n, params)
    assert sum(s.spec_proposed for s in obs.steps) >= n  # speculation really ran for every request
    for pos in (1, 2):
        a = Counter(o.token_ids[pos] for o in plain)
        b = Counter(o.token_ids[pos] for o in spec)
        tokens = sorted(set(a) | set(b))
        table = [[a[t] for t in tokens], [b[t] for t in tokens]]
        assert stats.chi2_contingency(table).pvalue > 0.01, (pos, table)
    # and it is not greedy in disguise: several tokens occur at each position
    assert len({o.token_ids[1] for o in spec}) >= 3


# ---- KV rollback under arbitrary accept / reject patterns --------------------------------------

class ScriptedProposer:
    """Proposes, for each sequence, a prefix of its true greedy continuation of a drawn
    length followed by wrong tokens: so the number accepted per step is chosen by the test."""

    def __init__(self, continuations: dict[int, list[int]], accept_lengths: list[int], draft_lengths: list[int]):
        self.continuations = continuations  # prompt -> prompt + greedy output
        self.accept_lengths, self.draft_lengths = accept_lengths, draft_lengths
        self.calls = 0
        self.expected_accepts: list[int] = []

    def propose(self, token_ids, k):
        full = next(f for p, f in self.continuations.items() if tuple(token_ids[:len(p)]) == p)
        i = self.calls
        self.calls += 1
        length = min(k, self.draft_lengths[i % len(self.draft_lengths)])
        good = min(length, self.accept_lengths[i % len(self.accept_lengths)])
        truth = full[len(token_ids):len(token_ids) + length]
        drafts = truth[:good] + [(t + 1) % 500 for t in truth[good:]]
        self.expected_accepts.append(min(good, len(truth)))
        return drafts[:len(truth)]


@pytest.fixture(scope="module")
def rollback_engine(target, reference):
    prompts, expected = reference
    # tiny blocks and a tight pool: rollbacks cross block boundaries and preemptions happen
    engine = LLMEngine(target, block_size=2, num_kv_blocks=40, max_num_seqs=4, speculative_mode="ngram",
                       num_speculative_tokens=4, enable_prefix_caching=True)
    continuations = {tuple(p): p + out for p, out in zip(prompts, expected)}
    return engine, prompts, expected, continuations


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(accepts=st.lists(st.integers(0, 4), min_size=1, max_size=8),
       lengths=st.lists(st.integers(0, 4), min_size=1, max_size=8),
       subset=st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True))
def test_kv_rollback_never_leaks(rollback_engine, accepts, lengths, subset):
    engine, prompts, expected, continuations = rollback_engine
    proposer = ScriptedProposer(continuations, accepts, lengths)
    engine.speculator.ngram = proposer
    accepted_before = engine.speculator.total_stats.num_accepted_tokens
    outs = generate(engine, [prompts[i] for i in subset], GREEDY, check_each_step=True)
    assert [o.token_ids for o in outs] == [expected[i] for i in subset]  # rollback never corrupts the KV
    assert engine.kv_cache.num_used_blocks == 0
    # the verifier accepted exactly the scripted number each time, and the requests saw it
    accepted = engine.speculator.total_stats.num_accepted_tokens - accepted_before
    assert accepted == sum(proposer.expected_accepts) == sum(o.metrics.spec_accepted for o in outs)


def test_rollback_engine_preempts(rollback_engine):
    """The pool of the property test above is tight enough that speculation runs
    alongside preemption (so the property covers recompute after rollback too)."""
    engine, prompts, expected, continuations = rollback_engine
    engine.speculator.ngram = ScriptedProposer(continuations, [2], [4])
    before = engine.scheduler.total_preemptions
    assert [o.token_ids for o in generate(engine, prompts, GREEDY, check_each_step=True)] == expected
    assert engine.scheduler.total_preemptions > before


def test_bad_speculative_config_is_a_clear_error(target, tiny_model_factory):
    with pytest.raises(ValueError, match="speculative_mode"):
        LLMEngine(target, num_kv_blocks=16, speculative_mode="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLMEngine(target, num_kv_blocks=16, speculative_mode="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="needs draft_model"):
        LLMEngine(target, num_kv_blocks=16, speculative_mode="draft")
    other = tiny_model_factory("llama", num_layers=1, vocab_size=300)  # its own, smaller tokenizer
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        LLMEngine(target, num_kv_blocks=16, speculative_mode="draft", draft_model=str(other))


def test_failed_step_leaves_no_draft_in_the_output(target, reference):
    prompts, expected = reference
    engine = LLMEngine(target, block_size=4, num_kv_blocks=512, speculative_mode="draft",
                       draft_model=str(target), num_speculative_tokens=K)
    engine.add_request("a", prompts[0], GREEDY, stream=False)
    for _ in range(3):
        engine.step()
    real_forward = engine.runner.forward

    def broken(inputs):
        raise RuntimeError("device lost")

    engine.runner.forward = broken
    generated = engine.requests["a"].output_token_ids
    [out] = engine.step()  # drafts were already in the batch when the forward failed
    assert out.finish_reason == "error" and "device lost" in out.error
    assert out.token_ids == generated == expected[0][:len(generated)]
    assert engine.kv_cache.num_used_blocks == 0
    engine.runner.forward = real_forward  # and the engine keeps serving
    assert [o.token_ids for o in generate(engine, prompts[:2], GREEDY)] == expected[:2]


def test_penalized_requests_decode_as_without_speculation(target, reference):
    """Verification scores drafts on the raw logits; a request whose penalties or bias change the
    distribution gets no draft, so its greedy output is the plain engine's (draft-is-target would
    otherwise accept the raw argmax everywhere)."""
    prompts, _ = reference
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.8, frequency_penalty=0.7)
    plain = generate(LLMEngine(target, block_size=4, num_kv_blocks=512), prompts, params)
    spec = generate(LLMEngine(target, block_size=4, num_kv_blocks=512, speculative_mode="draft",
                              draft_model=str(target), num_speculative_tokens=K), prompts, params)
    assert [a.token_ids for a in plain] == [b.token_ids for b in spec]
    unpenalized = generate(LLMEngine(target, block_size=4, num_kv_blocks=512),
                           prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [a.token_ids for a in plain] != [u.token_ids for u in unpenalized]  # the penalties did change them
