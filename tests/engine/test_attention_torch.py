"""The torch paged-attention backend against a dense per-sequence reference."""

from __future__ import annotations

import pytest
import torch

from engine.core.attention import get_backend
from engine.core.attention.simple_batch import SimplePagedBatcher
from engine.core.attention.torch_backend import TorchAttentionBackend, plan_groups


def dense_reference(q, keys, values, context_len, scale):
    """q [Q, H, D] of the last Q tokens over keys/values [L, KVH, D]; float64, explicit mask."""
    qlen, heads, _ = q.shape
    group = heads // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)  # [L, H, D]
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    allowed = torch.arange(context_len)[None, :] <= (context_len - qlen + torch.arange(qlen))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_steps(steps, heads=4, kv_heads=2, head_dim=8, block_size=4, num_blocks=64, seed=0):
    """Run each step (a list of (seq, query_len)) through the backend; check against the reference."""
    gen = torch.Generator().manual_seed(seed)
    backend = get_backend("torch", "cpu")
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    batcher = SimplePagedBatcher(num_blocks, block_size, seed=seed)
    history = {}  # seq -> (keys, values) seen so far
    scale = head_dim ** -0.5
    for chunks in steps:
        _, _, md = batcher.step([(seq, [0] * n) for seq, n in chunks])
        t = md.num_tokens
        q = torch.randn(t, heads, head_dim, generator=gen)
        k = torch.randn(t, kv_heads, head_dim, generator=gen)
        v = torch.randn(t, kv_heads, head_dim, generator=gen)
        out = backend.forward(q, k, v, k_cache, v_cache, md, scale)
        assert out.shape == (t, heads, head_dim)
        offset = 0
        for (seq, n), ctx in zip(chunks, md.context_lens):
            keys, values = history.get(seq, (k[:0], v[:0]))
            keys = torch.cat([keys, k[offset:offset + n]])
            values = torch.cat([values, v[offset:offset + n]])
            history[seq] = (keys, values)
            assert len(keys) == ctx
            expected = dense_reference(q[offset:offset + n], keys, values, ctx, scale)
            torch.testing.assert_close(out[offset:offset + n].double(), expected, atol=1e-5, rtol=1e-5)
            offset += n
        # the new keys and values landed in the cache at their slots
        flat_k = k_cache.view(-1, kv_heads, head_dim)
        assert torch.equal(flat_k[md.slot_mapping], k)
        assert torch.equal(v_cache.view(-1, kv_heads, head_dim)[md.slot_mapping], v)


def test_single_fresh_prefill():
    run_steps([[("a", 13)]])


def test_batched_prefill_then_decodes():
    run_steps([[("a", 5), ("b", 1), ("c", 9), ("d", 16), ("e", 3)]] + [[(s, 1) for s in "abcde"]] * 4)


def test_chunked_prefill_with_prefix_mixed_with_decode():
    # chunks of different lengths in one power-of-two bucket (padding), after cached prefixes
    run_steps([
        [("a", 6), ("b", 10)],
        [("a", 1), ("b", 7), ("c", 5)],
        [("a", 1), ("b", 1), ("c", 6), ("d", 2)],
        [("d", 1), ("c", 1), ("a", 3), ("b", 1)],
    ])


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_head_grouping(heads, kv_heads):
    run_steps([[("a", 7), ("b", 2)], [("a", 1), ("b", 1)], [("a", 4), ("b", 1)]], heads=heads, kv_heads=kv_heads)


def test_block_size_one_and_large():
    run_steps([[("a", 5), ("b", 3)], [("a", 1), ("b", 2)]], block_size=1, num_blocks=32)
    run_steps([[("a", 5), ("b", 3)], [("a", 1), ("b", 2)]], block_size=32, num_blocks=4)


def test_bfloat16_cache():
    backend = TorchAttentionBackend()
    batcher = SimplePagedBatcher(8, 4)
    _, _, md = batcher.step([("a", [0] * 6), ("b", [0] * 2)])
    q = torch.randn(8, 4, 8, dtype=torch.bfloat16)
    k = torch.randn(8, 2, 8, dtype=torch.bfloat16)
    k_cache = torch.zeros(8, 4, 2, 8, dtype=torch.bfloat16)
    out = backend.forward(q, k, k.clone(), k_cache, k_cache.clone(), md, 0.35)
    assert out.dtype == torch.bfloat16
    ref = dense_reference(q[:6], k[:6], k[:6], 6, 0.35)
    torch.testing.assert_close(out[:6].double(), ref, atol=3e-2, rtol=3e-2)


def test_groups_decodes_together_fresh_prefills_alone_and_other_prefills_by_length():
    batcher = SimplePagedBatcher(64, 4)
    _, _, md = batcher.step([(i, [0] * n) for i, n in enumerate([1, 5, 1, 8, 2, 30, 7])])
    # nothing cached: each prefill attends itself causally, one call each
    assert plan_groups(md) == [[0, 2], [1], [3], [4], [5], [6]]
    backend = TorchAttentionBackend()
    backend.prepare(md)
    assert [g.fresh_causal for g in md.scratch["torch_plan"].groups] == [False] + [True] * 5
    # chunks after a cached prefix: grouped by the power of two of their length
    _, _, md = batcher.step([(i, [0] * n) for i, n in enumerate([1, 5, 1, 8, 2, 30, 7])])
    assert plan_groups(md) == [[0, 2], [4], [1, 3, 6], [5]]


def test_mismatched_metadata_is_rejected():
    _, _, md = SimplePagedBatcher(8, 4).step([("a", [0] * 3)])
    md.query_lens = [4]
    with pytest.raises(ValueError, match="query_lens sum to 4"):
        TorchAttentionBackend().prepare(md)


def test_unknown_backend_and_flashinfer_on_cpu():
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("xformers")
    with pytest.raises(ValueError, match="CUDA"):
        get_backend("flashinfer", "cpu")
    assert get_backend("auto", "cpu").name == "torch"


def test_importing_attention_does_not_import_flashinfer():
    import subprocess
    import sys

    code = ("import sys, engine.core.attention, engine.core.attention.flashinfer_backend, engine.core.models; "
            "print('flashinfer' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_decodes_split_by_context_length_only_when_padding_is_costly():
    from engine.core.attention.torch_backend import SPLIT_MIN_SAVING, split_by_length

    short, long = 10, 10 + SPLIT_MIN_SAVING
    lengths = [long, short, short, long, short]
    assert split_by_length(list(range(5)), lengths) == [[1, 2, 4], [0, 3]]
    assert split_by_length(list(range(5)), [40, 30, 35, 20, 40]) == [[3, 1, 2, 0, 4]]


def test_decodes_of_very_different_lengths():
    from engine.core.attention.torch_backend import SPLIT_MIN_SAVING

    # three decodes, one far longer: split into two groups, outputs scattered back in order
    run_steps([[("a", 3), ("b", 9)], [("c", 7)]] + [[("c", 1), ("a", 1), ("b", 1)]] * 2)
    long = SPLIT_MIN_SAVING // 2 + 16
    batcher = SimplePagedBatcher(80, 64)
    batcher.step([("a", [0] * 3), ("b", [0] * 5), ("c", [0] * long)])
    _, _, md = batcher.step([("c", [0]), ("a", [0]), ("b", [0])])
    assert plan_groups(md) == [[1, 2], [0]]
    run_steps([[("a", 3), ("b", 5), ("c", long)], [("c", 1), ("a", 1), ("b", 1)]], block_size=64, num_blocks=80)


def test_decode_steps_reuse_the_last_plan_and_rebuild_when_tables_change():
    # equal lengths (the memo path), block boundaries crossed (block size 4), order swapped,
    # a sequence dropped, another joining with a different length
    run_steps([[("a", 3), ("b", 3)]] + [[("a", 1), ("b", 1)]] * 6 + [[("b", 1), ("a", 1)]] * 2
              + [[("a", 1)]] * 3 + [[("c", 2)], [("a", 1), ("c", 1)], [("a", 1), ("c", 1)]])


def test_decode_memo_is_reused_while_the_block_tables_stay():
    from engine.core.attention.base import AttentionMetadata

    backend = TorchAttentionBackend()

    def step(length, table):
        backend.prepare(AttentionMetadata([1], [length], [table], torch.tensor([length - 1]), 4))
        return backend._decode_memo

    table = [7, 3]
    first = step(5, table)
    assert step(6, table) is first and step(8, table) is first  # same blocks: one view per step
    table.append(9)  # the block table grows in place (as the scheduler's does)
    assert step(9, table) is not first
    assert step(9, [7, 3, 2]) is not step(9, table)  # same length, another block: rebuilt


def test_compiled_decodes_stay_one_group_in_batch_order(tiny_llama):
    """compile_decode turns the split off: each group count or row order would be a graph of its own,
    compiled the first time a batch meets it. Prefills are still grouped by length."""
    from engine.core.attention.torch_backend import SPLIT_MIN_SAVING
    from engine.core.engine import LLMEngine

    long = SPLIT_MIN_SAVING // 2 + 16
    batcher = SimplePagedBatcher(80, 64)
    batcher.step([("a", [0] * 3), ("b", [0] * 5), ("c", [0] * long)])
    _, _, md = batcher.step([("c", [0]), ("a", [0]), ("b", [0]), ("d", [0] * 5)])
    assert plan_groups(md) == [[1, 2], [0], [3]]
    assert plan_groups(md, split_decodes=False) == [[0, 1, 2], [3]]
    assert LLMEngine(tiny_llama, num_kv_blocks=16).backend.split_decodes
    compiled = LLMEngine(tiny_llama, num_kv_blocks=16, compile_decode=True)
    assert not compiled.backend.split_decodes
    _, _, md = batcher.step([("c", [0]), ("a", [0]), ("b", [0])])
    compiled.backend.prepare(md)
    plan = md.scratch["torch_plan"]
    assert len(plan.groups) == 1 and plan.identity and plan.groups[0].mask is not None
