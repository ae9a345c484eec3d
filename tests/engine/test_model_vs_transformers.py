"""Our Llama-family forward through the paged cache gives transformers' logits.

Each architecture's tiny random model is run by transformers (whole sequences,
no cache) and by us (a batch of prompts of different lengths in one prefill step
through non-contiguous cache blocks, then decode steps, then a chunked prefill
mixed with decodes), and the logits are compared token by token.
"""

from __future__ import annotations

import pytest
import torch

from engine.core.attention import get_backend
from engine.core.attention.simple_batch import SimplePagedBatcher
from engine.core.models import allocate_kv_cache, load_model

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}

CASES = {
    "llama": ("llama", {}),
    "llama3_rope_tied": ("llama", {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True}),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "qwen3_mha": ("qwen3", {"num_kv_heads": 4}),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matrices: extra threads only fight over the shared cores
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_path(tiny_model_factory, tiny_llama):
    """`model_path(arch, **overrides)`: a tiny model sharing tiny_llama's tokenizer (training one is slow)."""
    return lambda arch, **kw: tiny_model_factory(arch, tokenizer_dir=tiny_llama, **kw)


def reference_logits(ref, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return ref(torch.tensor([tokens])).logits[0].float()


@pytest.fixture(scope="module")
def transformers_model():
    import transformers

    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        return cache[path]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_and_decode_match_transformers(case, model_path, transformers_model):
    arch, overrides = CASES[case]
    path = model_path(arch, **overrides)
    ref = transformers_model(path)
    loaded = load_model(path)
    backend = get_backend("torch")
    block_size = 4
    kv = allocate_kv_cache(loaded, 64, block_size)
    batcher = SimplePagedBatcher(64, block_size, seed=1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, loaded.vocab_size, (n,), generator=gen).tolist() for n in (5, 19, 1, 8, 33)]

    ids, pos, md = batcher.step(list(enumerate(prompts)))
    with torch.inference_mode():
        logits = loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend))
    assert logits.dtype == torch.float32 and logits.shape == (sum(map(len, prompts)), loaded.vocab_size)
    offset = 0
    for p in prompts:
        torch.testing.assert_close(logits[offset:offset + len(p)], reference_logits(ref, p), atol=1e-4, rtol=1e-4)
        offset += len(p)

    # greedy decoding: each next token is the reference's argmax
    seqs = [list(p) for p in prompts]
    nxt = [int(reference_logits(ref, s)[-1].argmax()) for s in seqs]
    for _ in range(3):
        ids, pos, md = batcher.step([(i, [t]) for i, t in enumerate(nxt)])
        with torch.inference_mode():
            logits = loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend))
        for i, t in enumerate(nxt):
            seqs[i].append(t)
            expected = reference_logits(ref, seqs[i])[-1]
            torch.testing.assert_close(logits[i], expected, atol=1e-4, rtol=1e-4)
            nxt[i] = int(expected.argmax())


def test_chunked_prefill_mixed_with_decode(model_path, transformers_model):
    """A prompt prefilled in chunks, in the same steps as other sequences' decodes."""
    path = model_path("qwen2")
    ref = transformers_model(path)
    loaded = load_model(path)
    backend = get_backend("torch")
    kv = allocate_kv_cache(loaded, 64, 4)
    batcher = SimplePagedBatcher(64, 4, seed=2)
    gen = torch.Generator().manual_seed(3)
    short = torch.randint(0, loaded.vocab_size, (6,), generator=gen).tolist()
    long = torch.randint(0, loaded.vocab_size, (23,), generator=gen).tolist()
    ids, pos, md = batcher.step([("short", short)])
    with torch.inference_mode():
        loaded.model(ids, pos, md, kv, backend)
    done = list(short)
    for chunk in (long[:7], long[7:16], long[16:]):  # chunks of 7, 9, 7 after a cached prefix
        nxt = int(torch.randint(0, loaded.vocab_size, (1,), generator=gen))
        ids, pos, md = batcher.step([("short", [nxt]), ("long", chunk)])
        with torch.inference_mode():
            logits = loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend))
        done.append(nxt)
        seen = long[:batcher.lengths["long"]]
        torch.testing.assert_close(logits[0], reference_logits(ref, done)[-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits[1:], reference_logits(ref, seen)[-len(chunk):], atol=1e-4, rtol=1e-4)


def test_bfloat16_loads_and_runs(tiny_llama, transformers_model):
    path = tiny_llama
    ref = transformers_model(path)
    loaded = load_model(path, dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    backend = get_backend("torch")
    kv = allocate_kv_cache(loaded, 16, 8)
    assert kv[0][0].dtype == torch.bfloat16
    prompt = list(range(3, 40))
    ids, pos, md = SimplePagedBatcher(16, 8).step([(0, prompt)])
    with torch.inference_mode():
        logits = loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend))
    assert logits.dtype == torch.float32
    expected = reference_logits(ref, prompt)
    # bf16 keeps ~3 significant digits; the ranking of the top token mostly survives
    assert (logits - expected).abs().max() < 0.1 * expected.abs().max()
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9
