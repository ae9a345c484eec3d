"""CUDA-graph decode (EngineConfig.cuda_graphs, engine/core/cuda_graph.py) on what a CPU can run: the static
buffers, the padding to captured batch sizes, the width buckets and the fixed-shape attention, run eagerly
(`capture=False`); the capture itself is checked on a GPU by engine/benchmarks/gpu_check.py."""

from __future__ import annotations

import pytest
import torch

from engine.core.attention.simple_batch import SimplePagedBatcher
from engine.core.attention.static_decode import SCRATCH_KEY, StaticDecode, attend
from engine.core.attention.torch_backend import TorchAttentionBackend
from engine.benchmarks.gpu_check import eager_graphs_engine
from engine.core.cuda_graph import DecodeGraphs, batch_sizes, width_for
from engine.core.engine import LLMEngine
from engine.core.model_refs import REFERENCE_MODEL
from engine.core.sampling_params import SamplingParams

NUM_BLOCKS = 48


def _graphed_engine(model, **kw) -> LLMEngine:
    return eager_graphs_engine(model, NUM_BLOCKS, **kw)


def _run(engine, prompts, params) -> dict:
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp, stream=False)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return done


def _spy_shapes(engine) -> list[tuple[int, int, int]]:
    """(rows, graph batch, graph width) of every step the graphs run."""
    graphs, seen = engine.runner.graphs, []
    fill = graphs._fill

    def spy(input_ids, positions, metadata, b, size, width):
        seen.append((b, size, width))
        return fill(input_ids, positions, metadata, b, size, width)

    graphs._fill = spy
    return seen


def test_batch_sizes_and_width_buckets():
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert batch_sizes(1) == [1]
    assert [width_for(n, 32) for n in (1, 4, 5, 9, 17, 33)] == [4, 4, 8, 16, 32, 32]


@pytest.mark.parametrize("model", ["tiny_llama", "reference"])
def test_graphed_decode_gives_the_eager_engines_tokens_and_logprobs(model, tiny_llama, request):
    """Five requests of different prompt and output lengths: the batch shrinks 5 -> 1 (graphs of 8, 4, 2,
    1 rows, padding rows in all but the exact sizes) and the contexts cross width buckets; greedy and
    seeded sampled requests get what the engine without graphs gives them. Padding that wrote into a live
    block, or a table or mask off by a block, changes these tokens."""
    path = str(REFERENCE_MODEL) if model == "reference" else tiny_llama
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 9, 30, 2)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=2) for m in (6, 40, 19, 27)]
    params.append(SamplingParams(temperature=0.9, seed=7, max_tokens=33, ignore_eos=True, logprobs=2))
    kw = dict(block_size=4)
    want = _run(LLMEngine(path, num_kv_blocks=NUM_BLOCKS, **kw), prompts, params)
    engine = _graphed_engine(path, **kw)
    seen = _spy_shapes(engine)
    got = _run(engine, prompts, params)
    for rid, out in want.items():
        assert got[rid].token_ids == out.token_ids, rid
        for a, b in zip(got[rid].logprobs, out.logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
    rows = {r for r, _, _ in seen}
    assert rows == {5, 4, 3, 2, 1}, seen  # every decode step took a graph
    assert any(r < b for r, b, _ in seen) and {b for _, b, _ in seen} >= {8, 4, 2, 1}, seen  # padded
    assert len({w for _, _, w in seen}) >= 2, seen  # crossed a width bucket
    assert engine.runner.graphs.shapes == sorted({(b, w) for _, b, w in seen})  # one graph per shape met
    engine.kv_cache.check_invariants()
    assert engine.kv_cache.num_used_blocks == 0


def test_multi_step_batches_beside_graphs(tiny_llama):
    """Multi-step decode (num_scheduler_steps > 1) does not replay graphs: its sub-steps are planned by the
    backend as without graphs (the runner's prepare leaves a graph-shaped step unplanned) and give the
    same tokens."""
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 9)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (6, 21, 11)]
    want = _run(LLMEngine(tiny_llama, num_kv_blocks=NUM_BLOCKS, block_size=4), prompts, params)
    engine = _graphed_engine(tiny_llama, block_size=4, num_scheduler_steps=4)
    runner, multi = engine.runner, []
    forward_steps = runner.forward_steps
    runner.forward_steps = lambda steps: multi.append(len(steps)) or forward_steps(steps)
    got = _run(engine, prompts, params)
    assert multi and max(multi) == 4
    assert {r: o.token_ids for r, o in got.items()} == {r: o.token_ids for r, o in want.items()}


def test_static_attention_equals_the_backends_decode():
    """Rows of different contexts, tables padded with the pad block and padding rows attending it alone:
    the real rows equal the torch backend's decode of the same step."""
    heads, kv_heads, head_dim, block_size, pad_block = 6, 2, 8, 4, 31
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(pad_block + 1, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn_like(k_cache)
    batcher = SimplePagedBatcher(pad_block, block_size, seed=3)
    batcher.step([(s, [0] * n) for s, n in (("a", 13), ("b", 2), ("c", 7))])
    _, _, md = batcher.step([(s, [0]) for s in "abc"])
    b, size, width = 3, 4, 8
    q = torch.randn(size, heads, head_dim, generator=gen)
    k = torch.randn(size, kv_heads, head_dim, generator=gen)
    v = torch.randn(size, kv_heads, head_dim, generator=gen)
    want = TorchAttentionBackend().forward(q[:b], k[:b], v[:b], k_cache.clone(), v_cache.clone(), md,
                                           head_dim ** -0.5)
    table = torch.full((size, width), pad_block)
    for i, t in enumerate(md.block_tables):
        table[i, :len(t)] = torch.tensor(t)
    lens = torch.tensor(md.context_lens + [1])
    slots = torch.cat([md.slot_mapping, torch.tensor([pad_block * block_size])])
    static = StaticDecode(table, lens, torch.arange(block_size), torch.arange(width * block_size), pad_block, width)
    live = k_cache[:pad_block].clone()
    got = attend(q, k, v, k_cache, v_cache, slots, static, head_dim ** -0.5)
    torch.testing.assert_close(got[:b], want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got[b:]).all()
    # the padding row wrote the pad block only: the live blocks hold what the real rows wrote, and nothing else
    live.view(-1, kv_heads, head_dim).index_copy_(0, md.slot_mapping, k[:b])
    assert torch.equal(k_cache[:pad_block], live)


def test_cuda_graphs_on_the_cpu_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        LLMEngine(tiny_llama, num_kv_blocks=8, cuda_graphs=True)


def test_graph_metadata_carries_the_static_views(tiny_llama):
    """A graph's attention reads the runner's buffers through its metadata, never the step's lists."""
    engine = _graphed_engine(tiny_llama, block_size=4)
    graphs: DecodeGraphs = engine.runner.graphs
    md = graphs._static_metadata(4, 8)
    static = md.scratch[SCRATCH_KEY]
    assert static.block_table.data_ptr() == graphs.block_table.data_ptr() and static.block_table.shape == (4, 8)
    assert md.slot_mapping.data_ptr() == graphs.slot_mapping.data_ptr() and md.num_seqs == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_graphs_give_the_eager_tokens_on_cuda():
    from engine.benchmarks.gpu_check import graphs_check

    r = graphs_check("cuda", "float32", "torch")
    assert r["graphs"] > 0 and r["match"] >= 0.95, r
