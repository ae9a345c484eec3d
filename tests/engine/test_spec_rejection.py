"""Speculative-decoding building blocks: rejection sampling preserves the target
distribution (a statistical test), greedy verification, the n-gram proposer,
and the acceptance metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from engine.core.spec_decode import NgramProposer, SpecDecodeStats, rejection_sample, verify_greedy

VOCAB, K, N = 5, 3, 4000
ALPHA = 0.01


def _dist(g: torch.Generator, rows: int, zeros: int = 0) -> torch.Tensor:
    p = torch.rand(rows, VOCAB, generator=g) ** 2 + 0.01
    if zeros:  # like top-k truncation: some tokens impossible under the target
        p[:, :zeros] = 0.0
    return p / p.sum(-1, keepdim=True)


def _run(p: torch.Tensor, q: torch.Tensor | None, draft_fixed: list[int] | None, seed: int):
    """N speculative steps with independent positions (position i's target is p[i]
    whatever came before). Returns (first emitted tokens, second emitted tokens where
    there is one, accepted count at position 0)."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, N, replacement=True, generator=g).T.tolist() if q is not None else [draft_fixed] * N
    first, second, accepted0 = [], [], 0
    for d in drafts:
        res = rejection_sample(p, d, q, g)
        assert len(res.token_ids) == res.num_accepted + 1
        assert res.token_ids[: res.num_accepted] == d[: res.num_accepted]
        first.append(res.token_ids[0])
        if len(res.token_ids) > 1:
            second.append(res.token_ids[1])
        accepted0 += res.num_accepted >= 1
    return np.array(first), np.array(second), accepted0


def _chi2_pvalue(samples: np.ndarray, p: torch.Tensor) -> float:
    p = p.double().numpy()
    counts = np.bincount(samples, minlength=VOCAB)
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    return stats.chisquare(counts[support], p[support] / p[support].sum() * counts.sum()).pvalue


def _cases():
    g = torch.Generator().manual_seed(1234)
    yield "random p, random q", _dist(g, K + 1), _dist(g, K), None
    yield "random p, q = p", (p := _dist(g, K + 1)), p[:K].clone(), None
    yield "p with zeros (top-k like), random q", _dist(g, K + 1, zeros=2), _dist(g, K), None
    q_disjoint = torch.zeros(K, VOCAB)
    q_disjoint[:, 0] = 1.0
    yield "q on a token p never picks", _dist(g, K + 1, zeros=1), q_disjoint, None
    yield "one-hot q (deterministic proposer)", _dist(g, K + 1), None, [1, 3, 0]
    yield "one-hot q on impossible tokens", _dist(g, K + 1, zeros=2), None, [0, 1, 0]


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_rejection_sampling_preserves_target_distribution(case):
    name, p, q, draft_fixed = case
    first, second, accepted0 = _run(p, q, draft_fixed, seed=7)
    # the first emitted token (accepted draft or correction) is distributed as p[0] ...
    assert _chi2_pvalue(first, p[0]) > ALPHA, name
    # ... and so is the next one, as p[1] (positions are independent by construction here)
    if len(second) > 200:
        assert _chi2_pvalue(second, p[1]) > ALPHA, name
    # the acceptance probability at position 0 is sum_x min(p(x), q(x)) (one-hot q: p(draft))
    q0 = q[0] if q is not None else torch.nn.functional.one_hot(torch.tensor(draft_fixed[0]), VOCAB).double()
    expected = min(1.0, float(torch.minimum(p[0].double(), q0.double()).sum()))
    assert stats.binomtest(accepted0, N, expected).pvalue > ALPHA, (name, accepted0 / N, expected)


def test_the_statistical_test_has_power():
    """Negative control: emitting the draft token unconditionally (no rejection step)
    gives q's distribution, which the same chi-square test must reject."""
    g = torch.Generator().manual_seed(5)
    p, q = _dist(g, 1), _dist(g, 1)
    samples = torch.multinomial(q[0], N, replacement=True, generator=g).numpy()
    assert _chi2_pvalue(samples, p[0]) < 1e-6


def test_bonus_token_when_all_accepted():
    # one-hot q on tokens p surely picks: all k accepted, then one bonus from p[k]
    p = torch.zeros(K + 1, VOCAB)
    p[torch.arange(K), torch.tensor([2, 4, 1])] = 1.0
    p[K, 3] = 1.0
    res = rejection_sample(p, [2, 4, 1], None, torch.Generator().manual_seed(0))
    assert res.token_ids == [2, 4, 1, 3] and res.num_accepted == K


def test_seeded_rejection_sampling_is_reproducible():
    g = torch.Generator().manual_seed(3)
    p, q = _dist(g, K + 1), _dist(g, K)
    a = [rejection_sample(p, [0, 1, 2], q, torch.Generator().manual_seed(s)).token_ids for s in range(20)]
    b = [rejection_sample(p, [0, 1, 2], q, torch.Generator().manual_seed(s)).token_ids for s in range(20)]
    assert a == b and len({tuple(x) for x in a}) > 1


def test_rejection_sample_rejects_bad_shapes():
    p = torch.full((3, VOCAB), 1 / VOCAB)
    with pytest.raises(ValueError, match="len\\(draft\\) \\+ 1"):
        rejection_sample(p, [1], None)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rejection_sample(p, [1, VOCAB], None)
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(p, [1, 2], torch.full((1, VOCAB), 0.2))


# ---- greedy ----------------------------------------------------------------------------------

def _logits_with_argmax(argmaxes: list[int]) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), 11, generator=torch.Generator().manual_seed(0))
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 10.0
    return logits


@pytest.mark.parametrize("drafts,argmaxes,expected,accepted", [
    ([4, 5, 6], [4, 5, 6, 7], [4, 5, 6, 7], 3),  # all accepted + bonus
    ([4, 5, 6], [4, 9, 6, 7], [4, 9], 1),  # first mismatch at 1: its argmax replaces it
    ([4, 5, 6], [1, 5, 6, 7], [1], 0),  # nothing accepted: plain greedy step
    ([], [8], [8], 0),  # no draft: one normal token
    ([4, 4], [4, 4, 4], [4, 4, 4], 2),
])
def test_verify_greedy(drafts, argmaxes, expected, accepted):
    res = verify_greedy(_logits_with_argmax(argmaxes), drafts)
    assert res.token_ids == expected and res.num_accepted == accepted


# ---- n-gram proposer ------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,k,nmin,nmax,expected", [
    ([1, 2, 3, 4, 9, 1, 2, 3], 2, 1, 3, [4, 9]),  # trigram 1 2 3 seen before
    ([1, 2, 3, 4, 9, 1, 2, 3], 5, 1, 3, [4, 9, 1, 2, 3]),  # continues up to the end of history
    ([5, 6, 7, 8, 7, 0, 6, 7], 2, 1, 2, [8, 7]),  # bigram 6 7 beats the more recent unigram 7 -> 0
    ([5, 7, 0, 6, 7], 2, 1, 2, [0, 6]),  # no earlier bigram: the unigram 7 -> 0 6
    ([1, 2, 1, 2, 3, 1, 2], 1, 1, 2, [3]),  # the most recent match of "1 2" wins
    ([3, 3], 4, 1, 2, [3, 3, 3, 3]),  # a period-1 tail keeps its period past the history
    ([1, 2, 1, 2], 5, 2, 2, [1, 2, 1, 2, 1]),  # period 2
    ([1, 2, 3, 4], 3, 1, 3, []),  # nothing repeats
    ([1, 2, 3, 1], 3, 2, 3, []),  # only a unigram repeats, below ngram_min
    ([7], 3, 1, 3, []),  # too short
])
def test_ngram_proposer(tokens, k, nmin, nmax, expected):
    assert NgramProposer(k, nmin, nmax).propose(tokens) == expected


def _ngram_brute_force(tokens, k, nmin, nmax):
    """The definition, literally: n from nmax down, the last earlier occurrence, copy k."""
    for n in range(min(nmax, len(tokens) - 1), nmin - 1, -1):
        suffix = tokens[-n:]
        starts = [i for i in range(len(tokens) - n) if tokens[i:i + n] == suffix]
        if starts:
            ext = list(tokens)
            for j in range(k):
                ext.append(ext[starts[-1] + n + j])
            return ext[len(tokens):]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 5), st.integers(1, 3), st.integers(0, 3))
def test_ngram_proposer_matches_its_definition(tokens, k, nmin, extra):
    nmax = nmin + extra
    assert NgramProposer(k, nmin, nmax).propose(tokens) == _ngram_brute_force(tokens, k, nmin, nmax)


def test_ngram_proposer_per_call_k_is_capped():
    prop = NgramProposer(3, 1, 2)
    assert prop.propose([1, 2, 3, 4, 1, 2], k=1) == [3]
    assert prop.propose([1, 2, 3, 4, 1, 2], k=10) == [3, 4, 1]
    assert prop.propose([1, 2, 3, 4, 1, 2], k=0) == []


@pytest.mark.parametrize("args", [(0, 1, 2), (2, 0, 2), (2, 3, 2)])
def test_ngram_proposer_bad_config(args):
    with pytest.raises(ValueError):
        NgramProposer(*args)


# ---- metrics --------------------------------------------------------------------------------

def test_spec_metrics_formulas():
    s = SpecDecodeStats()
    s.observe(4, 4)
    s.observe(4, 1)
    s.observe(2, 0)
    s.observe(0, 0)  # no proposal: not a draft
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 10, 5)
    assert s.accepted_per_pos == [2, 1, 1, 1]
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert s.per_position_acceptance_rate == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    other = SpecDecodeStats()
    other.observe(5, 5)
    s.merge(other)
    assert s.accepted_per_pos == [3, 2, 2, 2, 1] and s.num_drafts == 4
    assert s.as_dict()["acceptance_rate"] == pytest.approx(10 / 15)
    with pytest.raises(ValueError):
        s.observe(2, 3)


def test_spec_metrics_empty():
    s = SpecDecodeStats()
    assert (s.acceptance_rate, s.mean_acceptance_length, s.per_position_acceptance_rate) == (0.0, 1.0, [])
