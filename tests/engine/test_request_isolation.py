"""One request's failure inside the engine ends that request alone.

Healthy greedy requests run beside one request that fails mid-generation in each place a request's own
state can fail: the batched sampler (a parameter the sampler's int64 tensors cannot hold), a logits
processor (a logit_bias token past the logits), the grammar (a token its grammar refuses), prompt logprobs,
and the detokenizer (stop strings and streamed text). The failures are made by putting a request's state
where validation would have refused it (after validation ran), so the engine's real code paths raise: the
failing request ends with finish reason "error", the error text and its record say why, its KV blocks go
back, and every healthy request gives exactly the tokens it gives alone.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.core.engine import LLMEngine
from engine.core.model_refs import REFERENCE_MODEL
from engine.core.sampling_params import SamplingParams
from telemetry.contract.hooks import EngineObserver

torch.set_num_threads(1)  # a small model on a shared 2-core machine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# greedy requests, and a seeded sampled one (its tokens depend only on its seed and its logits, never on the
# batch: a failing row beside it must not change them either)
HEALTHY = [("The capital of France is", GREEDY), ("1 2 3 4", GREEDY),
           ("Once upon a time", SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True))]


class FinishedRecords(EngineObserver):
    enabled = True

    def __init__(self):
        self.records = {}

    def on_request_finished(self, record):
        self.records[record.request_id] = record


def _engine(observer=None, **config) -> LLMEngine:
    return LLMEngine(REFERENCE_MODEL, observer, num_kv_blocks=64, block_size=16, max_num_seqs=8, **config)


def _run(engine: LLMEngine, inject=None, after_steps: int = 1) -> dict:
    """Every request to the end; `inject(engine)` after `after_steps` steps. Final outputs by request id."""
    finals, steps = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        steps += 1
        if inject is not None and steps == after_steps:
            inject(engine)
    return finals


SPECULATIVE = {"none": {}, "ngram": {"speculative_mode": "ngram", "num_speculative_tokens": 2}}


@pytest.fixture(scope="module")
def alone():
    """`alone(speculative)`: each healthy request's tokens when it runs by itself on that engine (a seeded
    request's tokens depend on the speculative mode: rejection sampling draws differently)."""
    cache = {}

    def tokens(speculative: str = "none") -> list[list[int]]:
        if speculative not in cache:
            engine = _engine(**SPECULATIVE[speculative])
            cache[speculative] = []
            for i, (prompt, params) in enumerate(HEALTHY):
                engine.add_request(f"alone-{i}", prompt, params)
                cache[speculative].append(_run(engine)[f"alone-{i}"].token_ids)
        return cache[speculative]
    return tokens


def _corrupt(field: str, value):
    def inject(engine):  # on the request's own copy (the case's params serve every run)
        seq = engine.requests["bad"]
        seq.sampling_params = copy.copy(seq.sampling_params)
        setattr(seq.sampling_params, field, value)
    return inject


def _foreign_grammar(engine):
    """The request's grammar swapped for one that refuses what it generated (a JSON object, not an integer)."""
    integer = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    engine.requests["bad"].grammar = engine.structured_output.grammar_for(integer)


def _failing_decode(engine):
    detok = engine.requests["bad"].detokenizer

    def decode(ids):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "the tokenizer failed on this request")
    detok.decode = decode


def _bad(**params) -> SamplingParams:
    return SamplingParams(max_tokens=12, ignore_eos=True, **params)


# (the bad request's params, how it goes wrong, after how many steps, words of its error)
CASES = {
    "sampler: top_k past int64": (_bad(temperature=0.8, seed=1), _corrupt("top_k", 2**64), 1, "Overflow"),
    "logits processor: logit_bias past the vocabulary": (_bad(temperature=0.0), _corrupt("logit_bias", {10**6: 5.0}),
                                                         1, "IndexError"),
    "grammar: a token it refuses": (_bad(temperature=0.0, response_format={"type": "json_object"}),
                                    _foreign_grammar, 2, "not allowed by the request's grammar"),
    "prompt logprobs: more than the vocabulary": (_bad(temperature=0.0, prompt_logprobs=1),
                                                  _corrupt("prompt_logprobs", 10**6), 0, "out of range"),
    "detokenizer and stop strings": (_bad(temperature=0.0, stop=["zzz"]), _failing_decode, 2, "UnicodeDecodeError"),
}


# n-gram speculation drafts for the bad request (its prompt repeats): its failure is in draft verification
@pytest.mark.parametrize("case, speculative", [(case, "none") for case in CASES]
                         + [("sampler: top_k past int64", "ngram")])
def test_a_failing_request_ends_alone_and_the_others_keep_their_tokens(alone, case, speculative):
    bad_params, inject, after_steps, words = CASES[case]
    observer = FinishedRecords()
    engine = _engine(observer, **SPECULATIVE[speculative])
    for i, (prompt, params) in enumerate(HEALTHY):
        engine.add_request(f"ok-{i}", prompt, params)
    engine.add_request("bad", "1 2 1 2 1 2 1 2 1 2", bad_params)
    if after_steps == 0:
        inject(engine)
    finals = _run(engine, inject, after_steps)

    bad = finals["bad"]
    assert bad.finish_reason == "error" and words in bad.error, (bad.finish_reason, bad.error)
    record = observer.records["bad"]
    assert record.finish_reason == "error" and record.error == bad.error
    for i, tokens in enumerate(alone(speculative)):
        out = finals[f"ok-{i}"]
        assert (out.finish_reason, out.error) == ("length", None)
        assert out.token_ids == tokens, f"healthy request {i} changed beside the failing one"
        assert observer.records[f"ok-{i}"].finish_reason == "length"
    assert engine.kv_cache.num_used_blocks == 0 and not engine.requests and not engine.has_unfinished()
    # and the engine goes on serving
    engine.add_request("after", *HEALTHY[0])
    assert _run(engine)["after"].token_ids == alone(speculative)[0]


def test_a_batch_failure_no_row_causes_alone_fails_the_batch_once(monkeypatch):
    """Rows that all fail alone too (a fault of the step, not of a request) all end with the error."""
    engine = _engine()
    for i, (prompt, params) in enumerate(HEALTHY):
        engine.add_request(f"ok-{i}", prompt, params)
    calls = []

    def broken(self, logits, seqs):
        calls.append(len(seqs))
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(type(engine.sampler), "_sample_batch", broken)
    finals = _run(engine)
    assert {o.finish_reason for o in finals.values()} == {"error"}
    assert all("the device is gone" in o.error for o in finals.values())
    assert calls == [3, 1, 1, 1]  # the batch, then each row once
    assert engine.kv_cache.num_used_blocks == 0
