"""Multi-step decode (EngineConfig.num_scheduler_steps, engine/core/multi_step.py): K decode steps per schedule
give exactly the tokens and raw logprobs of one step per schedule, stop where one step would, keep the
KV pool and the prefix cache consistent, and report one StepRecord per sub-step; the scheduler takes
K steps only where that cannot change what a request gets."""

from __future__ import annotations

import pytest
import torch

from engine.core.engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from telemetry.contract.hooks import EngineObserver

PROMPTS = [[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30], [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]]
KW = dict(block_size=4, num_kv_blocks=64)


class Steps(EngineObserver):
    enabled = True

    def __init__(self):
        self.records, self.requests = [], []

    def on_step(self, record) -> None:
        self.records.append(record)

    def on_request_finished(self, record) -> None:
        self.requests.append(record)


def _run(engine, prompts, params) -> dict[str, object]:
    """Each request's final output, the engine stepped until all have finished."""
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i] if isinstance(params, list) else params, stream=False)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return done


def _sub_steps(engine) -> list[int]:
    """Spy: the number of sub-steps of every multi-step batch the runner runs."""
    seen, forward_steps = [], engine.runner.forward_steps

    def spy(steps):
        seen.append(len(steps))
        return forward_steps(steps)

    engine.runner.forward_steps = spy
    return seen


@pytest.mark.parametrize("compile_decode", [False, True], ids=["eager", "compiled"])
def test_k_steps_give_the_one_step_tokens_and_logprobs(tiny_llama, monkeypatch, compile_decode):
    import torch._dynamo
    from torch._dynamo.utils import counters

    import engine.core.model_runner as model_runner

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")  # dynamo's graph; inductor is torch's to test
    torch._dynamo.reset()
    counters.clear()
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True)  # 13: not a multiple of 4
    one = _run(LLMEngine(tiny_llama, **KW), PROMPTS, params)
    stepped = LLMEngine(tiny_llama, num_scheduler_steps=4, compile_decode=compile_decode, **KW)
    seen = _sub_steps(stepped)
    many = _run(stepped, PROMPTS, params)
    assert seen and set(seen) == {4}  # K steps were taken, and only K
    for rid, out in one.items():
        assert many[rid].token_ids == out.token_ids
        assert many[rid].finish_reason == out.finish_reason == "length"
    if compile_decode:  # a sub-step (forward, logits, argmax, logprob) is one graph, its inputs the buffers
        assert stepped.runner._compiled_argmax is not None  # that prepare_steps made: no recompile per sub-step
        # and the sub-steps after the first called that graph directly (engine/core/compiled_replay.py)
        assert stepped.runner._compiled_argmax.replays > 0
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    stepped.kv_cache.check_invariants()
    assert stepped.kv_cache.num_used_blocks == 0
    torch._dynamo.reset()


def test_a_batch_takes_the_fewest_tokens_left_then_k_again(tiny_llama):
    """A request near its end shortens the batch's steps to what it has left instead of sending the whole
    batch one step at a time: 12, 5, 12 left take 4, one step (1 left), 4, then 3."""
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (13, 6, 13)]
    one = _run(LLMEngine(tiny_llama, **KW), PROMPTS, params)
    stepped = LLMEngine(tiny_llama, num_scheduler_steps=4, **KW)
    seen = _sub_steps(stepped)
    many = _run(stepped, PROMPTS, params)
    assert seen == [4, 1, 4, 3]  # the one step too runs the stepped path: one compiled function for all
    for rid, out in one.items():
        assert many[rid].token_ids == out.token_ids and many[rid].finish_reason == "length"
    stepped.kv_cache.check_invariants()
    assert stepped.kv_cache.num_used_blocks == 0


def test_raw_logprobs_and_records_per_sub_step(tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True)
    obs_one, obs_many = Steps(), Steps()
    _run(LLMEngine(tiny_llama, observer=obs_one, **KW), PROMPTS, params)
    stepped = LLMEngine(tiny_llama, observer=obs_many, num_scheduler_steps=3, **KW)
    seen = _sub_steps(stepped)
    _run(stepped, PROMPTS, params)
    assert seen
    one = {r.request_id: r for r in obs_one.requests}
    for r in obs_many.requests:
        assert list(r.output_token_ids) == list(one[r.request_id].output_token_ids)
        assert len(r.output_logprobs) == len(r.output_token_ids) == 11
        assert list(r.output_logprobs) == pytest.approx(list(one[r.request_id].output_logprobs), abs=1e-5)
    # one record per forward: as many generated tokens, ids in order, decode records as one step's
    records = obs_many.records
    assert sum(r.num_generated_tokens for r in records) == sum(r.num_generated_tokens for r in obs_one.records)
    assert [r.step_id for r in records] == list(range(len(records)))
    assert len(records) == len(obs_one.records)  # the same forwards, in fewer schedules
    decode = [r for r in records if r.phase == "decode"]
    assert all(r.num_decode_tokens == r.num_seqs and r.forward_seconds > 0 for r in decode)
    starts = [r.start_time for r in records]
    assert starts == sorted(starts)
    # a sub-step reads one more cached position than the one before
    first = [r for r in decode if r.schedule_seconds > 0]
    follow = {r.step_id: r for r in decode}
    assert any(follow.get(r.step_id + 1) and follow[r.step_id + 1].num_context_tokens == r.num_context_tokens
               + r.num_seqs for r in first)


def test_a_stop_inside_the_k_steps_ends_the_request_where_one_step_would(tiny_llama):
    base = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    reference = _run(LLMEngine(tiny_llama, **KW), PROMPTS[:1], base)["0"].token_ids
    stop_at = next(i for i in range(2, 12) if i % 4 != 3 and reference[i] not in reference[:i])  # inside a K of 4
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop_token_ids=[reference[stop_at]])
    stepped = LLMEngine(tiny_llama, num_scheduler_steps=4, **KW)
    seen = _sub_steps(stepped)
    out = _run(stepped, PROMPTS[:1], params)["0"]
    assert seen
    assert out.token_ids == reference[:stop_at + 1] and out.finish_reason == "stop"
    stepped.kv_cache.check_invariants()
    assert stepped.kv_cache.num_used_blocks == 0


def test_blocks_filled_by_k_steps_serve_the_prefix_cache(tiny_llama):
    """The blocks written by sub-steps are registered with their tokens (a block's hash is checked
    against its tokens), so a prompt that repeats a generated text hits them."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    stepped = LLMEngine(tiny_llama, num_scheduler_steps=4, **KW)
    first = _run(stepped, PROMPTS[:1], params)["0"]
    stepped.kv_cache.check_invariants()
    again = LLMEngine(tiny_llama, **KW)
    expected = _run(again, [PROMPTS[0] + first.token_ids], SamplingParams(temperature=0.0, max_tokens=4))["0"]
    out = _run(stepped, [PROMPTS[0] + first.token_ids], SamplingParams(temperature=0.0, max_tokens=4))["0"]
    assert out.metrics.cached_tokens >= 16  # 4 of the blocks the K steps filled
    assert out.token_ids == expected.token_ids


def _scheduled(engine, prompts, params):
    """Prefill every request, then schedule once: the batch the scheduler makes of the decodes."""
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i] if isinstance(params, list) else params)
    engine.step()
    return engine.scheduler.schedule()


def test_the_scheduler_takes_k_steps_only_where_nothing_changes(tiny_llama):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    assert _scheduled(LLMEngine(tiny_llama, num_scheduler_steps=4, **KW), PROMPTS, greedy).num_steps == 4
    # a sampled request's noise is the sampler's, a penalty's logits are the host's: one step
    for other in (SamplingParams(temperature=0.8, max_tokens=20), SamplingParams(temperature=0.0, max_tokens=20,
                                                                                 repetition_penalty=1.3),
                  SamplingParams(temperature=0.0, max_tokens=20, logprobs=2)):
        batch = _scheduled(LLMEngine(tiny_llama, num_scheduler_steps=4, **KW), PROMPTS, [greedy, greedy, other])
        assert batch.num_steps == 1 and batch.num_decode_seqs == 3
    # fewer tokens left than K: as many steps as the fewest left (nothing is computed past max_tokens)
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)  # 3 left after the prefill
    assert _scheduled(LLMEngine(tiny_llama, num_scheduler_steps=4, **KW), PROMPTS, short).num_steps == 3
    assert _scheduled(LLMEngine(tiny_llama, num_scheduler_steps=4, **KW), PROMPTS,
                      [greedy, short, greedy]).num_steps == 3
    last = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)  # 1 left: one step
    assert _scheduled(LLMEngine(tiny_llama, num_scheduler_steps=4, **KW), PROMPTS, last).num_steps == 1
    # a request waiting for a sequence slot: one step, so that it is admitted as soon as one frees
    engine = LLMEngine(tiny_llama, num_scheduler_steps=4, max_num_seqs=2, **KW)
    batch = _scheduled(engine, PROMPTS, greedy)
    assert engine.scheduler.num_waiting == 1 and batch.num_steps == 1


def test_k_steps_never_take_blocks_that_are_not_free(tiny_llama):
    """Lookahead slots come from free blocks only: a pool that holds one step's slots but not K's runs one
    step, and preempts nobody."""
    engine = LLMEngine(tiny_llama, num_scheduler_steps=8, block_size=4, num_kv_blocks=6)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, p in enumerate([[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30, 2, 2, 2]]):  # 2 blocks each
        engine.add_request(str(i), p, params)
    engine.step()  # the prefills: 4 of 6 blocks used, 2 free; 8 more tokens each would need 4
    batch = engine.scheduler.schedule()
    assert batch.num_steps == 1 and not batch.preempted
    engine.kv_cache.check_invariants()


def test_multi_step_and_speculation_exclude_each_other(tiny_llama):
    with pytest.raises(ValueError, match="exclude each other"):
        LLMEngine(tiny_llama, num_scheduler_steps=4, speculative_mode="ngram", **KW)
    with pytest.raises(ValueError, match="num_scheduler_steps must be >= 1"):
        LLMEngine(tiny_llama, num_scheduler_steps=0, **KW)


def test_stepped_outputs_stream_k_tokens_at_a_time(tiny_llama):
    stepped = LLMEngine(tiny_llama, num_scheduler_steps=4, **KW)
    stepped.add_request("s", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))
    sizes = []
    while stepped.has_unfinished():
        sizes += [len(o.new_token_ids) for o in stepped.step() if o.request_id == "s"]
    assert sum(sizes) == 9 and 4 in sizes
    assert torch.tensor(sizes).max().item() == 4
