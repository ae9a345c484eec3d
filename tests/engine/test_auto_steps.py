"""num_scheduler_steps "auto" (the default, engine/core/multi_step.py AutoSteps): K per schedule from the
measured decode step time, clamp(floor(STEP_BUDGET_S / t), 1, K_MAX). Step times are injected (a fake clock
on what the engine measured), so the rule is tested, not the machine's speed."""

from __future__ import annotations

import pytest

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.multi_step import K_MAX, STEP_BUDGET_S, WINDOW, AutoSteps
from engine.core.sampling_params import SamplingParams

PROMPTS = [[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30], [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]]
KW = dict(block_size=4, num_kv_blocks=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def test_auto_is_the_default():
    assert EngineConfig(model="m").num_scheduler_steps is None


def test_k_is_the_budget_over_the_measured_sub_step_time():
    auto = AutoSteps()
    assert auto.k_for(1) == 1  # not measured yet: one step, which measures it
    auto.observe(1, 1, STEP_BUDGET_S / 100)  # a fast step: as many as K_MAX
    assert auto.k_for(1) == K_MAX
    assert auto.k_for(4) == 1  # another size class is measured on its own
    auto.observe(4, 1, STEP_BUDGET_S / 3)
    assert auto.k_for(4) == 3 and auto.k_for(5) == 3 and auto.k_for(8) == 1
    slow = AutoSteps()
    slow.observe(1, 1, 6 * STEP_BUDGET_S)  # a slow step (a 135M model's ~25 ms): one
    assert slow.k_for(1) == 1
    # K sub-steps measured together count per sub-step
    multi = AutoSteps()
    multi.observe(1, 8, STEP_BUDGET_S)
    assert multi.k_for(1) == 8


def test_t_is_the_fastest_recent_step():
    auto = AutoSteps()
    auto.observe(1, 1, STEP_BUDGET_S / 4.5)
    for _ in range(WINDOW - 1):  # steps stretched by a loaded host: the fastest recent one decides
        auto.observe(1, 1, 3 * STEP_BUDGET_S)
    assert auto.k_for(1) == 4
    auto.observe(1, 1, 3 * STEP_BUDGET_S)  # every recent step slow now (longer contexts, say): one step
    assert auto.k_for(1) == 1
    auto.observe(1, 1, STEP_BUDGET_S / 10)  # the compiled path became ready: faster at once
    assert auto.k_for(1) == 10


def _fake_clock(engine, sub_step_seconds: float) -> None:
    """Every step the engine measures took `sub_step_seconds` per sub-step."""
    observe = engine.scheduler.observe_step
    engine.scheduler.observe_step = lambda batch, seconds: observe(batch, sub_step_seconds * batch.num_steps)


def _schedules(engine, prompts, params) -> list[int]:
    """num_steps of every schedule that ran decodes only, all requests run to their end."""
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i] if isinstance(params, list) else params, stream=False)
    schedule, steps = engine.scheduler.schedule, []

    def spy():
        batch = schedule()
        if batch.seqs and batch.num_decode_seqs == len(batch.seqs):
            steps.append(batch.num_steps)
        return batch

    engine.scheduler.schedule = spy
    while engine.has_unfinished():
        engine.step()
    return steps


def test_a_fast_step_takes_k_steps_a_slow_one_takes_one(tiny_llama):
    fast = LLMEngine(tiny_llama, **KW)
    _fake_clock(fast, STEP_BUDGET_S / 8)
    steps = _schedules(fast, PROMPTS, GREEDY)
    assert steps[0] == 1 and max(steps) == 8  # the first decode step measures; then the budget's 8
    slow = LLMEngine(tiny_llama, **KW)
    _fake_clock(slow, 2 * STEP_BUDGET_S)
    assert set(_schedules(slow, PROMPTS, GREEDY)) == {1}


def test_auto_gives_the_one_step_tokens(tiny_llama):
    fast = LLMEngine(tiny_llama, **KW)
    _fake_clock(fast, STEP_BUDGET_S / K_MAX)
    one = LLMEngine(tiny_llama, num_scheduler_steps=1, **KW)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (40, 13, 27)]
    outs = {}
    for engine in (fast, one):
        for i, p in enumerate(PROMPTS):
            engine.add_request(str(i), p, params[i], stream=False)
        done = {}
        while engine.has_unfinished():
            done.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
        outs[engine is fast] = done
    assert outs[True] == outs[False]
    fast.kv_cache.check_invariants()


@pytest.mark.parametrize("fixed", [1, 3])
def test_an_explicit_k_is_kept_whatever_the_step_time(tiny_llama, fixed):
    engine = LLMEngine(tiny_llama, num_scheduler_steps=fixed, **KW)
    _fake_clock(engine, STEP_BUDGET_S / 100)
    assert max(_schedules(engine, PROMPTS, GREEDY)) == fixed


def test_sampled_requests_take_one_step_under_auto(tiny_llama):
    engine = LLMEngine(tiny_llama, seed=0, **KW)
    _fake_clock(engine, STEP_BUDGET_S / 100)
    sampled = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True)  # as long as the greedy ones
    assert set(_schedules(engine, PROMPTS, [GREEDY, sampled, GREEDY])) == {1}


def test_auto_is_off_beside_speculation(tiny_llama):
    engine = LLMEngine(tiny_llama, speculative_mode="ngram", **KW)
    assert engine.scheduler.num_scheduler_steps == 1
    assert not engine.runner.background  # (eager in tests) and no multi-step path for the runner to build


def test_the_cli_takes_auto_or_a_number():
    import argparse

    from engine.serving.server.engine_args import add_engine_arguments, check_engine_option, engine_overrides

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert "num_scheduler_steps" not in engine_overrides(parser.parse_args(["--num-scheduler-steps", "auto"]))
    assert engine_overrides(parser.parse_args(["--num-scheduler-steps", "8"]))["num_scheduler_steps"] == 8
    check_engine_option("num-scheduler-steps", "auto")  # a fleet's TOML may say it too
    with pytest.raises(ValueError):
        check_engine_option("num-scheduler-steps", "eight")
