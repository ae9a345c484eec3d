"""The OpenAI / vLLM logits processors against transformers' reference processors (and numpy for
OpenAI's presence / frequency formula), batched with rows that do not use them, through the Sampler."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

from engine.core.logits_processors import apply_min_p, apply_raw_processors
from engine.core.sampler import Sampler
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

VOCAB = 40


def make_seq(prompt: list[int], output: list[int], **params) -> Sequence:
    seq = Sequence("r", list(prompt), SamplingParams(**params), 0.0)
    seq.token_ids.extend(output)
    return seq


def random_logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3  # both signs


def batch():
    """Rows with repeated prompt and output tokens; row 1 uses no processor at all."""
    return [([1, 2, 2, 5], [5, 7, 7, 7, 9]), ([3, 4], [4, 4]), ([8], [1, 8, 8, 30, 30, 30, 30]), ([0, 11], [])]


def test_repetition_penalty_matches_transformers():
    logits = random_logits(4)
    penalties = [1.3, 1.0, 0.7, 2.0]  # 0.7 < 1: a reward, as HF applies it
    seqs = [make_seq(p, o, repetition_penalty=r) for (p, o), r in zip(batch(), penalties)]
    out = apply_raw_processors(logits, seqs)
    for i, ((prompt, output), r) in enumerate(zip(batch(), penalties)):
        ref = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([prompt + output]), logits[i:i + 1].clone())
        torch.testing.assert_close(out[i], ref[0])
    assert not torch.equal(out[0], logits[0])  # the penalty did something


def test_presence_and_frequency_penalties_match_the_openai_formula():
    logits = random_logits(4, seed=1)
    presence, frequency = [0.5, 0.0, -1.0, 2.0], [0.3, 0.0, 1.5, -0.4]
    seqs = [make_seq(p, o, presence_penalty=a, frequency_penalty=b)
            for (p, o), a, b in zip(batch(), presence, frequency)]
    out = apply_raw_processors(logits, seqs).numpy()
    for i, (_, output) in enumerate(batch()):
        counts = np.bincount(np.array(output, dtype=int), minlength=VOCAB)  # output tokens only, not the prompt
        expected = logits[i].numpy() - frequency[i] * counts - presence[i] * (counts > 0)
        np.testing.assert_allclose(out[i], expected, rtol=1e-6, atol=1e-6)
    # the prompt's tokens are not penalised (row 0's prompt token 2 never appears in its output)
    assert out[0][2] == pytest.approx(float(logits[0][2]))


def test_logit_bias_matches_transformers_sequence_bias():
    logits = random_logits(3, seed=2)
    biases = [{3: 5.0, 17: -100.0}, None, {0: 0.25, 39: 100.0}]
    seqs = [make_seq([1], [], logit_bias=b) for b in biases]
    out = apply_raw_processors(logits, seqs)
    for i, bias in enumerate(biases):
        if bias is None:
            torch.testing.assert_close(out[i], logits[i])
            continue
        ref = SequenceBiasLogitsProcessor([[[t], v] for t, v in bias.items()])(torch.tensor([[1]]),
                                                                                logits[i:i + 1].clone())
        torch.testing.assert_close(out[i], ref[0])


def test_order_is_bias_then_repetition_then_frequency_presence():
    """vLLM's order on the raw logits (sampler.py): logit bias, repetition, frequency, presence."""
    logits = random_logits(1, seed=3)
    prompt, output = [4, 6], [6, 6, 9]
    seq = make_seq(prompt, output, logit_bias={6: 4.0, 9: -3.0, 12: 1.0}, repetition_penalty=1.7,
                   frequency_penalty=0.5, presence_penalty=0.8)
    ids = torch.tensor([prompt + output])
    ref = SequenceBiasLogitsProcessor([[[6], 4.0], [[9], -3.0], [[12], 1.0]])(ids, logits.clone())
    ref = RepetitionPenaltyLogitsProcessor(1.7)(ids, ref)
    counts = torch.bincount(torch.tensor(output), minlength=VOCAB).float()
    ref = ref - 0.5 * counts - 0.8 * (counts > 0).float()
    torch.testing.assert_close(apply_raw_processors(logits, [seq])[0], ref[0])


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9, 1.0])
def test_min_p_matches_transformers(min_p):
    x = random_logits(3, seed=4) / 0.8  # min_p comes after temperature
    out = apply_min_p(x.clone(), torch.full((3,), min_p))
    ref = MinPLogitsWarper(min_p)(torch.tensor([[1]] * 3), x.clone())
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    torch.testing.assert_close(out[~torch.isinf(out)], ref[~torch.isinf(ref)])


def test_min_p_in_the_sampler_never_draws_a_removed_token():
    """A flat-ish row sampled 3000 times: with min_p 0.5 after temperature 2, only the kept tokens come out."""
    logits = torch.linspace(0.0, 3.0, VOCAB)[None, :].repeat(3000, 1)
    sampler = Sampler(seed=0)
    seqs = [make_seq([1], [], temperature=2.0, min_p=0.5) for _ in range(3000)]
    tokens = torch.tensor(sampler(logits, seqs).token_ids)
    probs = torch.softmax(logits[0] / 2.0, dim=-1)
    kept = set(torch.nonzero(probs >= 0.5 * probs.max()).flatten().tolist())
    # exactly the kept ones (each >= 1/44 likely: all show up in 3000 draws); min_p on the logits before
    # temperature would keep fewer
    assert set(tokens.tolist()) == kept


def test_greedy_follows_the_processed_logits_and_logprobs_stay_raw():
    logits = random_logits(3, seed=5)
    target = int(logits[0].argmin())
    seqs = [make_seq([1], [], temperature=0.0, logit_bias={target: 100.0}),
            make_seq([1], [], temperature=0.0),
            make_seq([2], [int(logits[2].argmax())] * 3, temperature=0.0, repetition_penalty=50.0,
                     frequency_penalty=2.0, presence_penalty=2.0)]
    out = Sampler()(logits, seqs)
    assert out.token_ids[0] == target
    assert out.token_ids[1] == int(logits[1].argmax())
    assert out.token_ids[2] != int(logits[2].argmax())  # the repeated argmax is penalised away
    raw = torch.log_softmax(logits, dim=-1)
    for i, seq in enumerate(seqs):  # the model's distribution, not the processed one (the engine appends it)
        assert [out.sampled_logprobs[i]] == [pytest.approx(float(raw[i, out.token_ids[i]]), abs=1e-5)]


def test_sampled_rows_see_bias_and_penalties():
    logits = random_logits(2, seed=6)
    sampler = Sampler(seed=1)
    banned = int(logits[0].argmax())
    seqs = [make_seq([1], [], temperature=1.0, seed=s, logit_bias={banned: -100.0}) for s in range(200)]
    tokens = sampler(logits[:1].repeat(200, 1), seqs).token_ids
    assert banned not in tokens


def test_default_requests_cost_nothing():
    logits = random_logits(4)
    seqs = [make_seq(p, o) for p, o in batch()]
    assert apply_raw_processors(logits, seqs) is logits  # no copy, no work


def test_a_processed_batch_leaves_the_raw_logits_alone():
    logits = random_logits(2)
    before = logits.clone()
    apply_raw_processors(logits, [make_seq([1], [1], repetition_penalty=2.0, logit_bias={1: 3.0}),
                                  make_seq([1], [1], frequency_penalty=1.0)])
    assert torch.equal(logits, before)


@pytest.mark.parametrize("params, words", [
    ({"presence_penalty": 2.5}, "presence_penalty must be a finite number in [-2, 2]"),
    ({"frequency_penalty": -2.1}, "frequency_penalty must be a finite number in [-2, 2]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number in (0, inf)"),
    ({"min_p": 1.5}, "min_p must be a finite number in [0, 1]"),
    ({"logit_bias": {3: 101.0}}, "logit_bias value of token 3 must be a finite number in [-100, 100]"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias keys (token IDs) must be an integer in [0, 2**63 - 1]"),
])
def test_out_of_range_parameters_are_refused(params, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        SamplingParams(**params)


def test_to_json_carries_the_processors():
    import json

    d = json.loads(SamplingParams(presence_penalty=0.5, min_p=0.1, logit_bias={10: 1.0, 9: -2.0}).to_json())
    assert (d["presence_penalty"], d["frequency_penalty"], d["repetition_penalty"], d["min_p"]) == (0.5, 0.0, 1.0, 0.1)
    assert d["logit_bias"] == {"10": 1.0, "9": -2.0}
