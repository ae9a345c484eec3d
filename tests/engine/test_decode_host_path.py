"""The cheap decode path (fused projections, joint rotary, few-op decode plan, fused logprob)
computes exactly what the plain path does."""

from __future__ import annotations

import torch
from torch import nn

from engine.core.attention.simple_batch import SimplePagedBatcher
from engine.core.attention.torch_backend import TorchAttentionBackend
from engine.core.models import allocate_kv_cache, load_model
from engine.core.models.rope import RotaryEmbedding, apply_rotary
from engine.core.sampler import sampled_logprobs


def test_projections_are_fused_views_of_one_weight(tiny_llama):
    loaded = load_model(tiny_llama)
    attn = loaded.model.model.layers[0].self_attn
    fused = attn._qkv
    assert fused.weight is not None
    assert attn.q_proj.weight.data_ptr() == fused.weight.data_ptr()  # no second copy
    assert loaded.model.model.layers[0].mlp._gate_up.weight is not None


def _logits(loaded, ids):
    model = loaded.model
    caches = allocate_kv_cache(loaded, 16, 4)
    batcher = SimplePagedBatcher(16, 4)
    input_ids, positions, metadata = batcher.step([("a", ids)])
    with torch.inference_mode():
        return model.compute_logits(model(input_ids, positions, metadata, caches, TorchAttentionBackend()))


def test_swapped_projection_is_used_not_the_stale_fused_weight(tiny_llama):
    loaded = load_model(tiny_llama)
    ids = [5, 9, 17, 3, 11]
    before = _logits(loaded, ids)
    attn = loaded.model.model.layers[0].self_attn
    old = attn.q_proj
    new = nn.Linear(old.in_features, old.out_features, bias=old.bias is not None)
    with torch.no_grad():
        new.weight.copy_(old.weight * 0.5)
    attn.q_proj = new  # what quantization does: a new module under the same name
    after = _logits(loaded, ids)
    assert attn._qkv.weight is None  # the fused copy was dropped
    assert not torch.allclose(before, after)
    attn.q_proj = old  # the plain modules again: same numbers as the fused path
    torch.testing.assert_close(_logits(loaded, ids), before, rtol=1e-5, atol=1e-5)


def test_rotary_matches_the_rotate_half_form_bit_for_bit():
    rope = RotaryEmbedding(32, 10000.0)
    positions = torch.arange(77)
    x = torch.randn(77, 5, 32)
    cos, sin = rope(positions, torch.float32)
    f = positions.float()[:, None] * rope.inv_freq[None, :]
    c, s = f.cos()[:, None, :], f.sin()[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    assert torch.equal(apply_rotary(x, cos, sin), torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def test_fused_logprob_equals_log_softmax():
    logits = torch.randn(7, 1000) * 4
    tokens = torch.randint(0, 1000, (7,))
    want = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(sampled_logprobs(logits, tokens), want, rtol=0, atol=1e-5)
    row_max, greedy = logits.max(dim=-1)
    want = torch.log_softmax(logits, -1).gather(-1, greedy[:, None]).squeeze(-1)
    torch.testing.assert_close(sampled_logprobs(logits, greedy, row_max), want, rtol=0, atol=1e-5)


def test_decode_group_with_unequal_lengths_matches_per_sequence_attention():
    torch.manual_seed(0)
    kvh, h, d, bs = 2, 4, 8, 4
    k_cache = torch.zeros(32, bs, kvh, d)
    v_cache = torch.zeros(32, bs, kvh, d)
    batcher = SimplePagedBatcher(32, bs)
    backend = TorchAttentionBackend()
    keys = {}
    # prefill three sequences of different lengths, then one decode step for all
    for name, n in (("a", 3), ("b", 9), ("c", 6)):
        ids, pos, md = batcher.step([(name, [1] * n)])
        k, v = torch.randn(n, kvh, d), torch.randn(n, kvh, d)
        backend.forward(torch.randn(n, h, d), k, v, k_cache, v_cache, md, 0.3)
        keys[name] = (k, v)
    ids, pos, md = batcher.step([(s, [1]) for s in ("a", "b", "c")])
    q, k, v = torch.randn(3, h, d), torch.randn(3, kvh, d), torch.randn(3, kvh, d)
    out = backend.forward(q, k, v, k_cache, v_cache, md, 0.3)
    for i, name in enumerate(("a", "b", "c")):
        ks = torch.cat((keys[name][0], k[i:i + 1])).transpose(0, 1)  # [KVH, L, D]
        vs = torch.cat((keys[name][1], v[i:i + 1])).transpose(0, 1)
        qs = q[i].view(kvh, h // kvh, d)
        want = torch.softmax(qs @ ks.transpose(1, 2) * 0.3, -1) @ vs
        torch.testing.assert_close(out[i], want.reshape(h, d), rtol=1e-5, atol=1e-5)


def test_int8_projections_fuse_and_match_the_unfused_int8_path(tiny_llama, monkeypatch):
    import engine.core.quantization.int8 as int8
    from engine.core.quantization import quantize_model

    monkeypatch.setattr(int8, "FAST_MIN_NUMEL", 0)  # the tiny model's matrices take the int8 kernel

    loaded = load_model(tiny_llama)
    quantize_model(loaded.model, "int8")
    attn, mlp = loaded.model.model.layers[0].self_attn, loaded.model.model.layers[0].mlp
    assert attn._qkv._int8 is not None and mlp._gate_up._int8 is not None  # one int8 matmul each
    ids = [5, 9, 17, 3, 11]  # 5 rows: the int8 kernel's path
    fused = _logits(loaded, ids)
    with torch.no_grad():  # an in-place write to a projection's (viewed) int8 rows reaches the fused kernel
        attn.q_proj.qweight.neg_()
    changed = _logits(loaded, ids)
    assert attn._qkv._int8 is not None and not torch.allclose(fused, changed)
    with torch.no_grad():
        attn.q_proj.qweight.neg_()
    for layer in loaded.model.model.layers:  # drop the fused kernels: one call per projection
        layer.self_attn._qkv._int8 = layer.mlp._gate_up._int8 = None
    torch.testing.assert_close(_logits(loaded, ids), fused, rtol=1e-5, atol=1e-5)


def test_compiled_decode_is_one_graph_and_gives_the_eager_tokens(tiny_llama, monkeypatch):
    """compile_decode traces a whole decode step, attention included, without a graph break (a
    break is where it stops paying), gives the eager engine's greedy tokens, and a second batch
    of another size and other lengths reuses the graphs (a recompile is ~10-20 s mid-run: the
    tiny model's 2 kv heads must not be taken for a batch of 2, nor a view of the memo's slot
    table for another layout). Traced with dynamo's "eager" backend: inductor's build is torch's to test."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine
    from engine.core.sampling_params import SamplingParams

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")
    # unequal lengths, longest first: a masked decode group whose rows are scattered back
    batches = [[[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30]], [[4, 6, 8, 10, 12, 14, 16, 18, 20], [3, 5, 7, 9, 11], [2, 4, 6]]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    torch._dynamo.reset()
    counters.clear()
    # one step per schedule: the graphs counted are the one-step function's (auto multi-step would compile its
    # own function too, on the request path here; test_multi_step's compiled run checks that one)
    compiled = LLMEngine(tiny_llama, block_size=4, num_kv_blocks=64, compile_decode=True, num_scheduler_steps=1)
    eager = LLMEngine(tiny_llama, block_size=4, num_kv_blocks=64)
    for prompts in batches:
        assert _generate(compiled, prompts, params) == _generate(eager, prompts, params)
    assert compiled.runner._compiled is not None  # decode steps did take the compiled path
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


def test_compiled_int8_decode_is_one_graph_and_gives_the_eager_int8_tokens(tiny_llama, monkeypatch):
    """With int8 weights, compile_decode still traces one graph per step: each int8 matmul is one
    opaque op (infersight::int8_matmul) whose packing checks and fbgemm call run at call time;
    traced through, they broke the graph at every projection. Tokens equal the eager int8 engine's,
    and the traced graph holds the op (the int8 kernel, not a cast, runs inside it)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import engine.core.model_runner as model_runner
    import engine.core.quantization.int8 as int8
    from engine.core.engine import LLMEngine
    from engine.core.sampling_params import SamplingParams

    graphs = []

    def recording_backend(gm, example_inputs):  # dynamo's "eager" backend, keeping the graph it got
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", recording_backend)
    monkeypatch.setattr(int8, "FAST_MIN_NUMEL", 0)  # the tiny model's matrices take the int8 kernel
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    prompts = [[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30]]

    torch._dynamo.reset()
    counters.clear()
    kw = dict(block_size=4, num_kv_blocks=64, quantization="int8", quant_skip_layers=[])
    compiled = LLMEngine(tiny_llama, compile_decode=True, num_scheduler_steps=1, **kw)  # one-step graphs (above)
    eager = LLMEngine(tiny_llama, **kw)
    assert _generate(compiled, prompts, params) == _generate(eager, prompts, params)
    assert compiled.runner._compiled is not None
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    layers = len(compiled.loaded.model.model.layers)
    # fused qkv, o, fused gate/up, down per layer, and lm_head
    op = torch.ops.infersight.int8_matmul  # dynamo records the packet, the overload after it
    assert sum(t in (op, op.default) for t in ops) == 4 * layers + 1, ops
    torch._dynamo.reset()


def _generate(engine, prompts, params) -> list[list[int]]:
    """Each prompt's output tokens, the engine stepped until every request has finished."""
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params, stream=False)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    return [done[str(i)] for i in range(len(prompts))]
