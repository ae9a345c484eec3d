"""The KV pool's size: what the scheduler can fill when no budget is given, else the budget or the block count."""

from __future__ import annotations

import torch

from engine.core.kv_cache import DEFAULT_KV_CACHE_MEMORY_BYTES, kv_pool_blocks
from engine.core.llm import LLM
from engine.core.process_memory import memory_at_start

torch.set_num_threads(1)


def test_no_budget_sizes_the_pool_to_what_max_num_seqs_full_sequences_fill():
    # 4 sequences of 100 tokens in blocks of 16: 7 blocks each, one more for lookahead slots
    assert kv_pool_blocks(1024, 16, max_num_seqs=4, max_model_len=100) == 4 * 8


def test_no_budget_is_capped_by_the_default_budget():
    per_block = 2**20
    assert kv_pool_blocks(per_block, 16, max_num_seqs=64, max_model_len=8192) == DEFAULT_KV_CACHE_MEMORY_BYTES // per_block


def test_a_given_budget_or_block_count_is_taken_as_given():
    assert kv_pool_blocks(1024, 16, 4, 100, budget_bytes=1024 * 1000) == 1000
    assert kv_pool_blocks(1024, 16, 4, 100, budget_bytes=1024 * 1000, num_kv_blocks=3) == 3


def test_an_engine_without_a_budget_allocates_only_what_it_can_fill(tiny_llama):
    llm = LLM(tiny_llama, block_size=16, max_num_seqs=4, max_model_len=64)
    assert llm.engine.kv_cache.num_blocks == 4 * (64 // 16 + 1)
    out = llm.generate([[1, 2, 3]] * 4, None, use_tqdm=False)  # every sequence still fits at once
    assert len(out) == 4
    mem = memory_at_start(llm.engine.loaded.model, llm.engine.runner.kv_caches)
    k = llm.engine.runner.kv_caches[0][0]
    assert mem.kv_bytes == 2 * len(llm.engine.runner.kv_caches) * k.numel() * k.element_size()
    assert mem.weights_bytes > 0 and mem.rss_bytes > mem.weights_bytes + mem.kv_bytes
    assert "memory: RSS" in mem.describe() and "KV pool" in mem.describe()
