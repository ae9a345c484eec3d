"""Decode attention over the paged pool in place (engine/core/attention/paged_decode.py), compiled by inductor.

These compile for real (inductor's C++ flex template, ~5-15 s each): the block lists only mean something
to that template, so a traced-but-eager graph would not test them."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.core.attention import paged_decode
from engine.core.attention.torch_backend import PAGED_MIN_BLOCK_SIZE, PAGED_MIN_ROW_BYTES, attends_in_place

pytestmark = pytest.mark.skipif(paged_decode.unavailable_reason(torch.device("cpu")) is not None,
                                reason=str(paged_decode.unavailable_reason(torch.device("cpu"))))


def _reference(q, k_flat, v_flat, tables, context_lens, block_size):
    """Each sequence alone: its keys gathered in order, SDPA with the kv heads repeated."""
    out = []
    for b, (table, n) in enumerate(zip(tables, context_lens)):
        slots = torch.tensor([blk * block_size + i for blk in table for i in range(block_size)])[:n]
        o = F.scaled_dot_product_attention(q[b][:, None], k_flat[slots].transpose(0, 1), v_flat[slots].transpose(0, 1),
                                           enable_gqa=True)
        out.append(o[:, 0])
    return torch.stack(out)


def _batch(rng, context_lens, num_blocks, block_size, spare):
    """Block tables in a shuffled pool; `spare` blocks allocated past the context (as the scheduler's
    look-ahead does), so a table is longer than its keys."""
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    tables = []
    for n in context_lens:
        k = (n + block_size - 1) // block_size + spare
        tables.append([free.pop() for _ in range(k)])
    return tables


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (2, 2)])
def test_compiled_paged_decode_equals_each_sequence_alone(heads, kv_heads):
    """Random pool contents everywhere: keys past a sequence's context in its last block, and blocks it does
    not own, hold finite garbage, so a mask or block list gone wrong changes the output. Contexts of 1, of a
    whole block, and of blocks plus one; batches of other sizes and batch 1 through the same compiled function."""
    torch.manual_seed(0)
    rng = random.Random(0)
    head_dim, block_size, num_blocks = 16, PAGED_MIN_BLOCK_SIZE, 96
    k_flat = torch.randn(num_blocks * block_size, kv_heads, head_dim)
    v_flat = torch.randn_like(k_flat)
    lists = paged_decode.BlockLists(num_blocks, torch.device("cpu"))
    attend = torch.compile(paged_decode.attend, dynamic=True)
    for context_lens, spare in [([1, 16, 17, 46, 80], 1), ([34, 6, 128], 0), ([60], 1)]:
        tables = _batch(rng, context_lens, num_blocks, block_size, spare)
        q = torch.randn(len(tables), heads, head_dim)
        blocks = lists.decode_blocks(tables, context_lens, block_size)
        out = attend(q, k_flat, v_flat, blocks, head_dim ** -0.5)
        torch.testing.assert_close(out, _reference(q, k_flat, v_flat, tables, context_lens, block_size),
                                   atol=1e-5, rtol=1e-5)


def test_block_lists_name_whole_blocks_then_the_last():
    lists = paged_decode.BlockLists(32, torch.device("cpu"))
    blocks = lists.decode_blocks([[5, 9, 2, 30], [7]], [17, 3], block_size=8)
    assert blocks.full_num.flatten().tolist() == [2, 0]
    assert blocks.full_index[0, 0, 0, :2].tolist() == [5, 9]
    assert blocks.partial_num.flatten().tolist() == [1, 1]
    assert blocks.partial_index[:, 0, 0, 0].tolist() == [2, 7]  # the block holding the last key
    assert blocks.end_slot.tolist() == [2 * 8 + 1, 7 * 8 + 3]
    # the pool-wide widths FlexAttention checks, fixed whatever the batch's lengths
    assert blocks.partial_index.shape[-1] == blocks.full_index.shape[-1] == 32
    with pytest.raises(ValueError, match="sequence 1: 1 blocks cannot hold 9 tokens"):
        lists.decode_blocks([[5, 9], [7]], [3, 9], block_size=8)


def test_compiled_engine_attends_in_place_and_gives_the_eager_tokens(tiny_llama, monkeypatch):
    """compile_decode with inductor: decode steps take the in-place path (the plan carries block lists),
    multi-step batches and a batch of one included, and the greedy tokens equal
    the eager engine's, for a batch of unequal lengths (its rows in one group, its last blocks partly
    written) whose requests end at different steps."""
    import torch._dynamo

    import engine.core.attention.torch_backend as torch_backend
    from engine.core.engine import LLMEngine
    from engine.core.sampling_params import SamplingParams

    monkeypatch.setattr(torch_backend, "PAGED_MIN_ROW_BYTES", 0)  # the tiny model's rows are 256 bytes
    prompts = [[5, 9, 17, 3, 11, 8, 2, 40, 41, 42], [7, 7, 1, 30], list(range(20, 39))]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (11, 5, 14)]
    torch._dynamo.reset()
    compiled = LLMEngine(tiny_llama, block_size=16, num_kv_blocks=64, compile_decode=True, num_scheduler_steps=4)
    eager = LLMEngine(tiny_llama, block_size=16, num_kv_blocks=64)
    seen = []
    prepare = compiled.backend.prepare

    def record(metadata):
        prepare(metadata)
        plan = metadata.scratch["torch_plan"]
        if metadata.num_tokens == metadata.num_seqs:
            seen.append((metadata.num_seqs, plan.groups[0].paged is not None))

    compiled.backend.prepare = record
    assert _generate(compiled, prompts, params) == _generate(eager, prompts, params)
    assert {n for n, _ in seen} >= {1, 2, 3}, seen
    assert all(paged for _, paged in seen), seen
    torch._dynamo.reset()


def test_in_place_only_for_rows_worth_it_and_with_inductor(tiny_llama, monkeypatch):
    """The template's fixed cost is paid back only by rows of PAGED_MIN_ROW_BYTES or more, and only inductor
    honours the block lists (dynamo's "eager" backend would run flex's math over the whole pool)."""
    import engine.core.attention.torch_backend as torch_backend
    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine

    kw = dict(block_size=16, num_kv_blocks=16, compile_decode=True)
    assert LLMEngine(tiny_llama, **kw).backend._paged is None  # 2 kv heads of 16 in float32: 256 bytes
    monkeypatch.setattr(torch_backend, "PAGED_MIN_ROW_BYTES", 256)
    assert LLMEngine(tiny_llama, **kw).backend._paged is not None
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")
    assert LLMEngine(tiny_llama, **kw).backend._paged is None


def test_an_open_block_size_is_the_in_place_tile_only_where_decodes_attend_in_place(tiny_llama, monkeypatch):
    """block_size left open: PAGED_BLOCK_SIZE where compiled decodes read the pool in place (the template reads
    a block per tile), the default elsewhere; the replica's config says which, and the server's preflight plans
    the same pool; an explicit block size always wins."""
    import engine.core.attention.torch_backend as torch_backend
    import engine.core.model_runner as model_runner
    from engine.core.config import DEFAULT_BLOCK_SIZE, EngineConfig
    from engine.core.engine import LLMEngine
    from engine.serving.server.preflight import _model_config, kv_plan

    def chosen(**kw):
        engine = LLMEngine(tiny_llama, num_kv_blocks=8, **kw)
        plan = kv_plan(EngineConfig(model=str(tiny_llama), num_kv_blocks=8, **kw), _model_config(str(tiny_llama)))
        assert engine.kv_cache.block_size == engine.config.block_size == plan.block_size
        return engine.config.block_size

    assert torch_backend.PAGED_BLOCK_SIZE != DEFAULT_BLOCK_SIZE
    assert chosen() == DEFAULT_BLOCK_SIZE
    assert chosen(compile_decode=True) == DEFAULT_BLOCK_SIZE  # 256-byte rows: decodes gather, not in place
    monkeypatch.setattr(torch_backend, "PAGED_MIN_ROW_BYTES", 256)
    assert chosen(compile_decode=True) == torch_backend.PAGED_BLOCK_SIZE
    assert chosen(compile_decode=True, block_size=8) == 8
    assert chosen() == DEFAULT_BLOCK_SIZE  # eager decodes
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")
    assert chosen(compile_decode=True) == DEFAULT_BLOCK_SIZE


def _generate(engine, prompts, params) -> list[list[int]]:
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp, stream=False)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    return [done[str(i)] for i in range(len(prompts))]


def test_blocks_smaller_than_the_templates_key_tile_are_gathered_not_read_in_place():
    """Blocks of 8 came out wrong from inductor's CPU template on an AVX2-only CPU: the engine gathers them."""
    if paged_decode.unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip(paged_decode.unavailable_reason(torch.device("cpu")))
    row = PAGED_MIN_ROW_BYTES
    assert attends_in_place(row, torch.device("cpu"), True, PAGED_MIN_BLOCK_SIZE)
    assert not attends_in_place(row, torch.device("cpu"), True, PAGED_MIN_BLOCK_SIZE // 2)
