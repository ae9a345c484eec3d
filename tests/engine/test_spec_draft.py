"""The draft-model proposer: greedy drafts equal the draft model's own greedy
continuation, its private KV cache rolls back to what the sequence still holds,
and its block pool never leaks."""

from __future__ import annotations

import pytest
import torch

from engine.core.attention import get_backend
from engine.core.spec_decode.draft import DraftModelProposer


@pytest.fixture(scope="module")
def draft(tiny_llama):
    from engine.core.models import load_model

    return load_model(tiny_llama)


def _fresh_greedy(loaded, tokens: list[int], n: int) -> list[int]:
    """n greedy tokens, each from a fresh proposer (full recompute, no cache reuse)."""
    ref = DraftModelProposer(loaded, get_backend("torch"), 1, block_size=4, num_blocks=16)
    out = list(tokens)
    for i in range(n):
        out += ref.propose([(f"fresh-{i}", out, 1)])[0]
        ref.free(f"fresh-{i}")
    return out[len(tokens):]


def test_drafts_follow_greedy_and_roll_back(draft):
    prop = DraftModelProposer(draft, get_backend("torch"), 4, block_size=4, num_blocks=32)
    a, b = [1, 5, 9, 33, 2, 7, 100], [1, 3, 3, 3]
    ga, gb = _fresh_greedy(draft, a, 4), _fresh_greedy(draft, b, 4)
    # batched, with a per-sequence k
    assert prop.propose([("a", a, 4), ("b", b, 3)]) == [ga, gb[:3]]
    # a: two drafts accepted then a different correction token; b: all accepted plus its bonus
    a2, b2 = a + ga[:2] + [11], b + gb[:3] + [gb[3]]
    assert prop.propose([("a", a2, 4), ("b", b2, 4)]) == [_fresh_greedy(draft, a2, 4), _fresh_greedy(draft, b2, 4)]
    # the cache now holds each sequence plus k - 1 drafts, in ceil(len / block_size) blocks
    for seq_id, toks in (("a", a2), ("b", b2)):
        assert len(prop.seqs[seq_id].tokens) == len(toks) + 3
        assert len(prop.seqs[seq_id].blocks) == -(-(len(toks) + 3) // 4)
    # a sequence that shrank (e.g. its request restarted with a shorter history) shrinks its blocks too
    assert prop.propose([("a", a[:3], 1)]) == [_fresh_greedy(draft, a[:3], 1)]
    assert len(prop.seqs["a"].blocks) == 1
    prop.free("a")
    prop.free("b")
    prop.free("never-seen")  # harmless
    assert prop.num_free_blocks == 32


def test_pool_exhaustion_means_no_draft_not_a_stall(draft):
    prop = DraftModelProposer(draft, get_backend("torch"), 4, block_size=4, num_blocks=3)
    long_seq = list(range(1, 20))  # 19 + 3 tokens need 6 blocks
    short = [1, 2, 3]
    assert prop.propose([("long", long_seq, 4), ("short", short, 4)]) == [[], _fresh_greedy(draft, short, 4)]
    assert "long" not in prop.seqs
    prop.free("short")
    assert prop.num_free_blocks == 3


def test_no_draft_past_the_context_limit(draft):
    prop = DraftModelProposer(draft, get_backend("torch"), 4, block_size=16, num_blocks=8)
    near_end = [1] * (draft.max_model_len - 2)
    assert prop.propose([("x", near_end, 4)]) == [[]]
    with torch.no_grad():
        assert prop.propose([("y", [1, 2], 0)]) == [[]]
