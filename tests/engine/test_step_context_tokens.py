"""steps.num_context_tokens: the tokens a step's attention reads, the sum of its sequences' context lengths."""

from __future__ import annotations

import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from telemetry.contract.hooks import EngineObserver

torch.set_num_threads(1)  # tiny models on a shared 2-core machine


class Steps(EngineObserver):
    enabled = True

    def __init__(self):
        self.steps = []

    def on_step(self, record):
        self.steps.append(record)


def _run(engine, prompts, params):
    """Drive the engine; per step, the sequences' lengths as the scheduler handed them over (computed + this
    step's new tokens) and their full lengths then (prompt + outputs so far)."""
    expected, full = [], []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        expected.append(sum(s.num_computed_tokens + n for s, n in zip(batch.seqs, batch.num_new_tokens)))
        full.append(sum(len(s.token_ids) for s in batch.seqs))
        return batch

    engine.scheduler.schedule = recording_schedule
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    while engine.has_unfinished():
        engine.step()
    return expected, full


def test_each_step_records_the_sum_of_its_sequences_lengths(tiny_llama):
    observer = Steps()
    # one step per schedule: `_run` records per schedule, and a multi-step schedule has a StepRecord per
    # sub-step (their context lengths: test_multi_step)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=64,
                                    max_num_batched_tokens=64, num_scheduler_steps=1), observer)
    prompts = [list(range(10, 15)), list(range(20, 40))]  # 5 and 20 tokens, one prefill step
    expected, full = _run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    got = [s.num_context_tokens for s in observer.steps]
    assert got == expected == full  # no chunking: every step reads each sequence's whole length
    assert got[0] == 25 and observer.steps[0].phase == "prefill"
    # decode steps: each sequence one token longer than the step before
    assert got[1:4] == [27, 29, 31]


def test_a_chunked_prefill_reads_only_the_computed_part_and_its_chunk(tiny_llama):
    observer = Steps()
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=64,
                                    max_num_batched_tokens=8), observer)
    expected, full = _run(engine, [list(range(10, 30))], SamplingParams(temperature=0.0, max_tokens=2,
                                                                       ignore_eos=True))
    got = [s.num_context_tokens for s in observer.steps]
    assert got == expected
    assert got[:3] == [8, 16, 20] and full[:3] == [20, 20, 20]  # chunks of 8: attention reads 8, 16, then 20
