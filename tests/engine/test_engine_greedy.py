"""Greedy generation equals transformers' `generate`, token for token, under every scheduling path:
a batch of different lengths, arrivals mid-flight, prefix caching on and off, chunked prefill,
no chunked prefill, and preemption - for each architecture. The engine runs unpadded and paged;
the reference runs transformers' own model on a left-padded batch."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from engine.core.engine import LLMEngine
from telemetry.contract.hooks import EngineObserver
from engine.core.sampling_params import SamplingParams

# tiny models on a shared 2-core machine: more threads only add contention
torch.set_num_threads(1)

MAX_TOKENS = 12


class StepCollector(EngineObserver):
    enabled = True

    def __init__(self):
        self.steps, self.requests = [], []

    def on_step(self, record):
        self.steps.append(record)

    def on_request_finished(self, record):
        self.requests.append(record)


def make_prompts(n, seed, lo=3, hi=40, shared_prefix=()):
    rng = random.Random(seed)
    return [list(shared_prefix) + [rng.randrange(6, 500) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


_HF: dict = {}


def hf_greedy(model_dir, prompts, max_new_tokens=MAX_TOKENS):
    """transformers' greedy `generate` on the left-padded batch, each row cut after its first EOS."""
    model = _HF.get(model_dir)
    if model is None:
        model = _HF[model_dir] = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos = set(model.generation_config.eos_token_id or [])
    pad = model.generation_config.pad_token_id or 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad)
    result = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        result.append(row[:end])
    return result


def run_engine(engine, prompts, arrivals=None, max_tokens=MAX_TOKENS):
    """Greedy-generate; `arrivals[i]` is the step at which prompt i is added (default: all at 0)."""
    arrivals = arrivals or [0] * len(prompts)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    results, step = {}, 0
    while len(results) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                engine.add_request(str(i), prompts[i], params, stream=False)
        for out in engine.step():
            if out.finished:
                results[int(out.request_id)] = out.token_ids
        step += 1
        assert step < 10_000
    assert engine.kv_cache.num_used_blocks == 0, "blocks leaked"
    return [results[i] for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_batch_of_different_lengths(tiny_model_factory, arch):
    model = tiny_model_factory(arch)
    prompts = make_prompts(6, seed=1)
    engine = LLMEngine(model, block_size=4, num_kv_blocks=256)
    assert run_engine(engine, prompts) == hf_greedy(model, prompts)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_requests_arriving_while_others_are_mid_flight(tiny_model_factory, prefix_caching):
    model = tiny_model_factory("llama")
    system = make_prompts(1, seed=9, lo=20, hi=20)[0]  # a shared "system prompt"
    prompts = make_prompts(6, seed=2, lo=2, hi=15, shared_prefix=system)
    observer = StepCollector()
    engine = LLMEngine(model, observer, block_size=4, num_kv_blocks=256, enable_prefix_caching=prefix_caching)
    got = run_engine(engine, prompts, arrivals=[0, 0, 3, 5, 5, 9])
    assert got == hf_greedy(model, prompts)
    hits = sum(r.prefix_hit_tokens for r in observer.steps)
    assert (hits > 0) == prefix_caching
    assert {s.phase for s in observer.steps} >= {"prefill", "decode", "mixed"}


@pytest.mark.parametrize("arch, chunked", [("qwen2", True), ("llama", False)])
def test_a_small_token_budget(tiny_model_factory, arch, chunked):
    model = tiny_model_factory(arch)
    prompts = make_prompts(5, seed=3, lo=10, hi=30)
    observer = StepCollector()
    engine = LLMEngine(model, observer, block_size=4, num_kv_blocks=256, max_num_batched_tokens=32,
                       enable_chunked_prefill=chunked)
    assert run_engine(engine, prompts) == hf_greedy(model, prompts)
    assert max(r.num_tokens for r in observer.steps) <= 32
    split = any(r.num_prefill_seqs and r.num_generated_tokens < r.num_seqs and r.num_decode_seqs == 0
                for r in observer.steps)
    assert split == chunked  # with chunked prefill some prompt really was split


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_across_a_preemption(tiny_model_factory, arch):
    model = tiny_model_factory(arch)
    prompts = make_prompts(4, seed=4, lo=8, hi=14)
    observer = StepCollector()
    # 12 blocks of 4 = 48 tokens; the four requests need up to 4 * 26
    engine = LLMEngine(model, observer, block_size=4, num_kv_blocks=12)
    assert run_engine(engine, prompts) == hf_greedy(model, prompts)
    assert engine.scheduler.total_preemptions > 0
    assert sum(r.num_preempted for r in observer.steps) == engine.scheduler.total_preemptions
    assert sum(r.preemptions for r in observer.requests) == engine.scheduler.total_preemptions
