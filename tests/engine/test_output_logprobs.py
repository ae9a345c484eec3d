"""Every request's output_logprobs: the raw log-softmax of each sampled token, asked or not, through the store.

Recomputed with transformers on the tiny random model: logits of prompt + output in one forward,
log_softmax, the value at each output token. Sampled (temperature, top-k, top-p), greedy and
speculative (n-gram) requests; written by the Recorder into a real embedded store and read back.
"""

from __future__ import annotations

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.sampler import sampled_logprobs
from engine.core.sampling_params import SamplingParams
from telemetry.recorder import Recorder

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def hf_model(tiny_llama):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama)).eval()


def expected_logprobs(hf_model, prompt: list[int], output: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt + output])).logits[0].float()
    lps = torch.log_softmax(logits, dim=-1)
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return lps[rows, torch.tensor(output)].tolist()


def test_sampled_logprobs_is_log_softmax_gather():
    logits = torch.randn(5, 97) * 4
    tokens = torch.randint(0, 97, (5,))
    want = torch.log_softmax(logits, -1)[torch.arange(5), tokens]
    assert torch.allclose(sampled_logprobs(logits, tokens), want, atol=1e-5)


PARAMS = {
    "sampled": SamplingParams(temperature=0.9, top_k=20, top_p=0.9, max_tokens=12, ignore_eos=True, seed=5),
    "greedy": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    "asked": SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, logprobs=2),
}


@pytest.mark.parametrize("spec", [{}, {"speculative_mode": "ngram", "num_speculative_tokens": 3}],
                         ids=["plain", "ngram"])
def test_engine_records_raw_logprobs_of_every_output_token(tiny_llama, hf_model, store, spec):
    replica = f"lp-{'spec' if spec else 'plain'}"
    recorder = Recorder(store, replica, flush_interval=0.05)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=256, replica_id=replica,
                                    **spec), recorder)
    # a repetitive prompt so that n-gram drafts get proposed (and partly accepted)
    prompts = {"sampled": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], "greedy": [9, 10, 11, 9, 10, 11, 9, 10],
               "asked": list(range(20, 34))}
    for name, prompt in prompts.items():
        engine.add_request(name, prompt, PARAMS[name])
    outs = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    recorder.close()
    rows = store.query_df("SELECT request_id, prompt_token_ids, output_token_ids, output_logprobs, output_tokens "
                          "FROM requests WHERE replica_id = {r:String}", {"r": replica})
    assert sorted(rows.request_id) == sorted(prompts)
    for row in rows.itertuples():
        output = [int(t) for t in row.output_token_ids]
        assert output == outs[row.request_id].token_ids
        assert len(row.output_logprobs) == len(output) == row.output_tokens
        want = expected_logprobs(hf_model, prompts[row.request_id], output)
        assert list(row.output_logprobs) == pytest.approx(want, abs=2e-4)
    # the asked-for logprobs are the same numbers
    asked = [lp.logprob for lp in outs["asked"].logprobs]
    assert list(rows.set_index("request_id").loc["asked", "output_logprobs"]) == pytest.approx(asked, abs=1e-5)
    if spec:  # drafts were accepted, so the speculative path gave logprobs to several tokens per step
        assert sum(o.metrics.spec_accepted for o in outs.values()) > 0
