"""The sampler on hand-made logits: greedy, top-k/top-p, seeds, the sampled distribution, logprobs."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from engine.core.sampler import Sampler, apply_top_k_top_p, token_logprobs
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence


def seqs_for(sampler: Sampler, params: list[SamplingParams]) -> list[Sequence]:
    out = []
    for i, p in enumerate(params):
        s = Sequence(str(i), [1], p, 0.0)
        if p.seed is not None:
            s.generator = sampler.make_generator(p.seed)
        out.append(s)
    return out


def random_logits(n, vocab=50, seed=0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_the_argmax():
    logits = random_logits(5)
    sampler = Sampler()
    out = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=0.0)] * 5))
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 5


@pytest.mark.parametrize("temperature", [1e-300, 1e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    # 1e-300 is 0 in float32: dividing by it gave inf/NaN rows (a 500 under a grammar); vLLM treats < 1e-5 as greedy
    logits = random_logits(6)
    sampler = Sampler(seed=1)
    params = [SamplingParams(temperature=temperature), SamplingParams(temperature=1.0)] * 3
    out = sampler(logits, seqs_for(sampler, params))
    assert out.token_ids[::2] == logits[::2].argmax(-1).tolist()
    assert all(torch.isfinite(torch.tensor(out.sampled_logprobs)))


def test_top_k_one_equals_greedy_at_any_temperature():
    logits = random_logits(8)
    sampler = Sampler(seed=3)
    out = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=1.5, top_k=1)] * 8))
    assert out.token_ids == logits.argmax(-1).tolist()


def test_greedy_rows_stay_greedy_in_a_mixed_batch():
    logits = random_logits(6)
    sampler = Sampler()
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0) for i in range(6)]
    out = sampler(logits, seqs_for(sampler, params))
    for i in range(1, 6, 2):
        assert out.token_ids[i] == int(logits[i].argmax())


def test_same_seed_same_tokens_regardless_of_the_batch():
    logits = random_logits(1, seed=5)[0]
    alone = Sampler(seed=0)
    crowd = Sampler(seed=99)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    a = seqs_for(alone, [seeded])
    b = seqs_for(crowd, [SamplingParams(temperature=0.7), seeded, SamplingParams(temperature=1.0, seed=1)])
    tokens_alone, tokens_crowd = [], []
    for step in range(20):
        others = random_logits(3, seed=step + 100)
        tokens_alone.append(alone(logits[None], a).token_ids[0])
        tokens_crowd.append(crowd(torch.stack([others[0], logits, others[2]]), b).token_ids[1])
    assert tokens_alone == tokens_crowd
    assert len(set(tokens_alone)) > 1  # really sampled, not a constant


def test_different_seeds_give_different_streams():
    logits = torch.zeros(1, 1000)
    s = Sampler()
    a = seqs_for(s, [SamplingParams(seed=1)])
    b = seqs_for(s, [SamplingParams(seed=2)])
    assert [s(logits, a).token_ids[0] for _ in range(5)] != [s(logits, b).token_ids[0] for _ in range(5)]


def test_samples_follow_the_softmax_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = probs.log().expand(n, 4).contiguous()
    sampler = Sampler(seed=7)
    out = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=1.0)] * n))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=4)
    assert stats.chisquare(counts.numpy(), (probs * n).numpy()).pvalue > 0.001


def test_temperature_sharpens_the_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0]]).expand(3000, 3).contiguous()
    sampler = Sampler(seed=1)
    cold = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=0.2)] * 3000)).token_ids
    hot = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=2.0)] * 3000)).token_ids
    assert cold.count(0) > hot.count(0) + 500


def test_top_k_and_top_p_keep_only_their_tokens():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]]))
    cut = apply_top_k_top_p(logits, torch.tensor([2, 4]), torch.tensor([2.0, 0.65]))
    assert torch.isfinite(cut[0]).tolist() == [True, True, False, False]  # top-2
    assert torch.isfinite(cut[1]).tolist() == [True, True, False, False]  # 0.4 + 0.3 >= 0.65
    sampler = Sampler(seed=2)
    n = 500
    out = sampler(logits[:1].expand(n, 4).contiguous(),
                  seqs_for(sampler, [SamplingParams(temperature=1.0, top_p=0.5)] * n))
    assert set(out.token_ids) == {0, 1}


def test_logprobs_are_the_models_log_softmax_with_top_n():
    logits = random_logits(3, vocab=30)
    sampler = Sampler()
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.8, logprobs=0)]
    out = sampler(logits, seqs_for(sampler, params))
    ref = torch.log_softmax(logits, -1)
    lp0 = out.logprobs[0]
    assert lp0.token_id == out.token_ids[0]
    assert lp0.logprob == pytest.approx(float(ref[0].max()), abs=1e-6)
    top = ref[0].topk(3)
    assert list(lp0.top) == top.indices.tolist()
    assert list(lp0.top.values()) == pytest.approx(top.values.tolist(), abs=1e-6)
    assert out.logprobs[1] is None
    lp2 = out.logprobs[2]
    assert lp2.logprob == pytest.approx(float(ref[2, out.token_ids[2]]), abs=1e-6) and lp2.top == {}


def test_token_logprobs_for_teacher_forcing():
    logits = random_logits(4, vocab=20)
    targets = torch.tensor([3, 0, 19, 7])
    got = token_logprobs(logits, targets, [1, 1, 1, 1])
    ref = torch.log_softmax(logits, -1)
    assert [g.logprob for g in got] == pytest.approx(ref[torch.arange(4), targets].tolist(), abs=1e-6)
    assert [g.token_id for g in got] == targets.tolist()


def test_a_top_p_that_rounds_to_zero_keeps_the_best_token():
    # 5e-324 is 0 in float32: without the rank-0 guard every token was cut and the row sampled token 0
    logits = random_logits(6)
    logits[:, 0] = -50.0  # token 0 is never the best
    sampler = Sampler(seed=2)
    out = sampler(logits, seqs_for(sampler, [SamplingParams(temperature=1.0, top_p=5e-324)] * 6))
    assert out.token_ids == logits.argmax(-1).tolist()
