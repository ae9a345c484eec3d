"""The offline API end to end: generate / chat / score, sampling controls, logprobs vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams

# tiny models on a shared 2-core machine: more threads only add contention
torch.set_num_threads(1)

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, block_size=4, num_kv_blocks=512)


@pytest.fixture(scope="module")
def hf_model(tiny_llama):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_llama).eval()


def test_generate_returns_outputs_in_prompt_order_with_their_text(llm):
    prompts = ["The quick brown fox", "What is 12 + 35?", [0, 17, 42, 99]]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [llm.tokenizer.encode(prompts[0]),
                                                  llm.tokenizer.encode(prompts[1]), prompts[2]]
    for o in outs:
        assert o.finished and o.finish_reason == "length" and len(o.token_ids) == 16
        assert o.text == llm.tokenizer.decode(o.token_ids)
        assert o.metrics.first_token_time >= o.metrics.arrival_time > 0
        assert o.metrics.e2e_seconds >= o.metrics.ttft_seconds >= 0
    single = llm.generate("The quick brown fox", GREEDY, use_tqdm=False)
    assert single[0].token_ids == outs[0].token_ids


def test_same_seed_same_output_regardless_of_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["Sort the numbers"], seeded, use_tqdm=False)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    crowd = llm.generate(["Reverse the string", "Sort the numbers", "Latency"], [other, seeded, other],
                         use_tqdm=False)[1].token_ids
    assert alone == crowd
    different = llm.generate(["Sort the numbers"], SamplingParams(temperature=1.0, top_p=0.9, seed=7,
                                                                  max_tokens=12, ignore_eos=True),
                             use_tqdm=False)[0].token_ids
    assert different != alone


def test_top_k_one_is_greedy(llm):
    prompts = ["The key alpha", "def add(a, b):"]
    greedy = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    top1 = SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, top1, use_tqdm=False)] == greedy


def test_stop_strings_end_the_text_before_them(llm):
    full = llm.generate("Inference engineers", GREEDY, use_tqdm=False)[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 2]
    assert stop.strip(), full.text
    out = llm.generate("Inference engineers", SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                                            stop=[stop]), use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[:full.text.index(stop)]
    assert out.token_ids == full.token_ids[:len(out.token_ids)] and len(out.token_ids) < 16


def test_stop_token_ids_end_generation_at_their_first_occurrence(llm):
    full = llm.generate("Unicode", GREEDY, use_tqdm=False)[0]
    stop_id = full.token_ids[3]
    first = full.token_ids.index(stop_id)
    out = llm.generate("Unicode", SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_id]),
                       use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:first + 1]
    assert out.text == llm.tokenizer.decode(full.token_ids[:first])  # the stop token's text is not output


def test_logprobs_match_transformers_log_softmax(llm, hf_model):
    prompt = llm.tokenizer.encode("What is 12 + 35?")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3),
                       use_tqdm=False)[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + out.token_ids])).logits[0]
    ref = torch.log_softmax(logits.float(), -1)[len(prompt) - 1:-1]
    for pos, lp in enumerate(out.logprobs):
        assert lp.token_id == out.token_ids[pos]
        assert lp.logprob == pytest.approx(float(ref[pos, lp.token_id]), abs=1e-4)
        top = ref[pos].topk(3)
        assert list(lp.top) == top.indices.tolist()
        assert list(lp.top.values()) == pytest.approx(top.values.tolist(), abs=1e-4)


def test_score_is_teacher_forced_and_matches_transformers(llm, hf_model):
    prompt = llm.tokenizer.encode("The quick brown fox")
    continuations = [llm.tokenizer.encode(" jumps over the lazy dog.", add_special_tokens=False),
                     [5, 300, 7]]
    scores = llm.score([prompt, prompt], continuations)
    for cont, got in zip(continuations, scores):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + cont])).logits[0]
        ref = torch.log_softmax(logits.float(), -1)[len(prompt) - 1:-1]
        assert got == pytest.approx(ref[torch.arange(len(cont)), torch.tensor(cont)].tolist(), abs=1e-4)
    assert llm.score(prompt, continuations[1]) == pytest.approx(scores[1], abs=1e-6)


def test_prompt_logprobs_survive_chunked_prefill(tiny_llama, hf_model):
    llm = LLM(tiny_llama, block_size=4, num_kv_blocks=64, max_num_batched_tokens=8)
    prompt = list(range(10, 40))
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1),
                       use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), -1)
    expected = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
    assert [lp.logprob for lp in out.prompt_logprobs[1:]] == pytest.approx(expected, abs=1e-4)


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "What is 12 + 35?"}]
    chat = llm.chat([messages], GREEDY, use_tqdm=False)[0]
    assert chat.prompt_token_ids == llm.tokenizer.apply_chat_template(messages)
    assert chat.token_ids == llm.generate([chat.prompt_token_ids], GREEDY, use_tqdm=False)[0].token_ids


@pytest.mark.parametrize("prompt, match", [
    ([1] * 5000, "context"),
    ([0, 5, 100000], "out of the vocabulary"),
    ([], "a prompt is|empty"),
    (3.5, "a prompt is"),
])
def test_bad_requests_get_a_clear_error_and_the_engine_keeps_serving(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate(["still serving"], GREEDY, use_tqdm=False)[0].token_ids) == 16


def test_a_prompt_longer_than_the_pool_is_rejected(tiny_llama):
    llm = LLM(tiny_llama, block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match="KV cache"):
        llm.generate([list(range(10, 30))], GREEDY, use_tqdm=False)
    # a sequence that outgrows the pool ends with "length" instead of hanging
    out = llm.generate([list(range(10, 14))], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.prompt_token_ids) + len(out.token_ids) == 17
