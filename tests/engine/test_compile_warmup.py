"""compile_decode's graphs built off the request path (engine/core/compile_warmup.py): the engine serves eager
steps while a thread compiles, takes the compiled step once it is built, and the graphs that thread built are
the ones the engine's own decodes use (no compile on the request path afterwards). Traced with dynamo's
"eager" backend, or a backend of the test's: inductor's build is torch's to test."""

from __future__ import annotations

import threading

import pytest

from engine.core.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
# batch 1, equal lengths, unequal lengths, a larger batch: the decode shapes the warm-up stands for
BATCHES = [[[5, 9, 17]], [[4, 6, 8], [3, 5, 7]], [[5, 9, 17, 3, 11, 8, 2], [7, 7, 1, 30], [2, 4]],
           [list(range(3, 3 + n)) for n in range(2, 12)]]


@pytest.fixture
def background(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    import engine.core.model_runner as model_runner

    monkeypatch.setattr(model_runner, "BACKGROUND_COMPILE", True)
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    counters.clear()
    yield model_runner
    torch._dynamo.reset()


def _generate(engine, prompts, params=PARAMS) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{engine.step_id}-{i}", p, params, stream=False)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    return [done[k] for k in sorted(done, key=lambda k: int(k.rsplit("-", 1)[1]))]


def _compiled_calls(engine) -> list[int]:
    """Spy: the batch size of every decode step that ran the compiled function."""
    seen, decode = [], engine.runner._decode_forward

    def spy(input_ids, positions, metadata):
        seen.append(len(input_ids))
        return decode(input_ids, positions, metadata)

    engine.runner._decode_forward = spy
    return seen


@pytest.mark.parametrize("steps", [1, 4, None], ids=["one-step", "multi-step", "auto"])
def test_the_built_graphs_serve_every_decode_shape_without_a_compile_on_the_request_path(tiny_llama, background,
                                                                                        monkeypatch, steps):
    from torch._dynamo.utils import counters

    from engine.core.engine import LLMEngine

    monkeypatch.setattr(background, "STEP_BUDGET_S", 3600.0)  # auto: a step always fits (a loaded host's may not)

    kw = dict(block_size=4, num_kv_blocks=64)
    compiled = LLMEngine(tiny_llama, compile_decode=True, num_scheduler_steps=steps, **kw)
    assert compiled.runner.wait_compiled(timeout=600), compiled.runner.background.error
    built = dict(counters["stats"])
    assert built["unique_graphs"] >= 1
    seen = _compiled_calls(compiled)
    eager = LLMEngine(tiny_llama, compile_decode=False, **kw)
    for prompts in BATCHES:
        assert _generate(compiled, prompts) == _generate(eager, prompts)
    if steps == 1:
        assert {1, 2, 3, 10} <= set(seen)  # decode steps of each batch took the compiled path
    else:  # auto too: it may take K > 1 as soon as a step is measured, so the build made the multi-step graph
        assert compiled.runner._compiled_argmax is not None
    assert dict(counters["stats"]) == built  # nothing traced on the request path
    assert not counters["graph_break"], dict(counters["graph_break"])
    compiled.kv_cache.check_invariants()


@pytest.mark.parametrize("budget_s, built", [(3600.0, True), (0.0, False)], ids=["step-fits", "step-too-slow"])
def test_auto_multi_step_builds_its_sub_step_graphs_only_where_a_compiled_step_fits_their_budget(
        tiny_llama, background, monkeypatch, budget_s, built):
    """Auto K is floor(budget / step seconds): where the compiled batch-1 step alone takes longer than the
    budget, K is 1 for every batch and the sub-step graphs are not built (half a 135M restart's build). A
    multi-step batch that comes anyway takes the eager sub-step: no compile on the request path, same tokens.
    A fixed K builds them whatever the step takes."""
    from torch._dynamo.utils import counters

    from engine.core.engine import LLMEngine

    monkeypatch.setattr(background, "STEP_BUDGET_S", budget_s)
    kw = dict(block_size=4, num_kv_blocks=64)
    auto = LLMEngine(tiny_llama, compile_decode=True, **kw)
    assert auto.runner.wait_compiled(timeout=600), auto.runner.background.error
    assert (auto.runner._compiled_argmax is not None, auto.runner.argmax_skipped) == (built, not built)
    graphs = dict(counters["stats"])
    auto.scheduler.num_scheduler_steps = 4  # a multi-step batch, whatever auto K would say
    eager = LLMEngine(tiny_llama, compile_decode=False, **kw)
    assert _generate(auto, BATCHES[1]) == _generate(eager, BATCHES[1])
    assert dict(counters["stats"]) == graphs  # nothing traced on the request path
    fixed = LLMEngine(tiny_llama, compile_decode=True, num_scheduler_steps=4, **kw)
    assert fixed.runner.wait_compiled(timeout=600), fixed.runner.background.error
    assert fixed.runner._compiled_argmax is not None and not fixed.runner.argmax_skipped


def test_requests_are_served_eager_while_the_graphs_build(tiny_llama, background):
    """The build is held until the engine has served whole requests: they are not kept waiting for it."""
    from engine.core.engine import LLMEngine

    release, traced = threading.Event(), []

    def held_backend(gm, example_inputs):  # dynamo's "eager" backend, once the test lets the build go on
        assert release.wait(timeout=600)
        traced.append(gm)
        return gm.forward

    background.COMPILE_BACKEND = held_backend
    kw = dict(block_size=4, num_kv_blocks=64)
    # one step per schedule: the spy watches the one-step compiled function (auto multi-step's fast steps would
    # go through the multi-step one, built and checked in the test above)
    compiled = LLMEngine(tiny_llama, compile_decode=True, num_scheduler_steps=1, **kw)
    seen = _compiled_calls(compiled)
    eager = LLMEngine(tiny_llama, compile_decode=False, **kw)
    prompts = BATCHES[2]
    try:
        assert _generate(compiled, prompts) == _generate(eager, prompts)
        assert not compiled.runner.compiled_ready and not seen and not traced  # served while the build waited
        assert (compiled.runner.compile_state, eager.runner.compile_state) == ("building", "off")
    finally:
        release.set()
    assert compiled.runner.wait_compiled(timeout=600)
    assert compiled.runner.compile_state == "ready"
    assert _generate(compiled, prompts) == _generate(eager, prompts)
    assert seen and traced


def test_a_build_that_fails_leaves_the_engine_eager(tiny_llama, background):
    from engine.core.engine import LLMEngine

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    background.COMPILE_BACKEND = broken_backend
    kw = dict(block_size=4, num_kv_blocks=64)
    compiled = LLMEngine(tiny_llama, compile_decode=True, **kw)
    assert not compiled.runner.wait_compiled(timeout=600)
    assert "no compiler here" in repr(compiled.runner.background.error)
    assert compiled.runner.compile_state == "failed"
    seen = _compiled_calls(compiled)
    eager = LLMEngine(tiny_llama, compile_decode=False, **kw)
    assert _generate(compiled, BATCHES[2]) == _generate(eager, BATCHES[2])
    assert not seen


def test_the_scratch_pool_is_released_and_the_memory_logged_once_the_build_is_done(tiny_llama, background,
                                                                                 monkeypatch, caplog):
    """The build's decodes write a pool of the engine pool's shapes: nothing may keep it (a graph, a guard, the
    runner) once the graphs are built, or a replica holds a second KV pool's pages it touched. The build's end
    logs the process's memory line, what compile cost."""
    import gc
    import logging
    import weakref

    import engine.core.compile_warmup as compile_warmup
    from engine.core.engine import LLMEngine

    pools, make = [], compile_warmup.scratch_pool

    def kept_track_of(kv_caches):
        pool = make(kv_caches)
        pools.extend(weakref.ref(t) for pair in pool for t in pair)
        return pool

    monkeypatch.setattr(compile_warmup, "scratch_pool", kept_track_of)
    caplog.set_level(logging.INFO, logger=compile_warmup.__name__)
    kw = dict(block_size=4, num_kv_blocks=64)
    compiled = LLMEngine(tiny_llama, compile_decode=True, **kw)
    assert compiled.runner.wait_compiled(timeout=600), compiled.runner.background.error
    eager = LLMEngine(tiny_llama, compile_decode=False, **kw)
    assert _generate(compiled, BATCHES[1]) == _generate(eager, BATCHES[1])  # the built graphs serve
    gc.collect()
    assert pools and all(ref() is None for ref in pools)
    lines = [r.getMessage() for r in caplog.records if "after the compiled decode steps' build" in r.getMessage()]
    assert len(lines) == 1 and "memory: RSS " in lines[0] and "+ KV pool " in lines[0], lines


def test_compile_decode_is_on_for_the_torch_backend_on_a_cpu_unless_turned_off(monkeypatch):
    from engine.core.attention import compile_decode_for, with_block_size
    from engine.core.config import COMPILE_DECODE_ENV, EngineConfig

    monkeypatch.delenv(COMPILE_DECODE_ENV, raising=False)
    config = EngineConfig(model="m")
    assert config.compile_decode is None  # left open, decided at start
    assert compile_decode_for(config) is True
    assert with_block_size(config, 256).compile_decode is True  # the engine runs (and records) the decision
    assert compile_decode_for(EngineConfig(model="m", device="cuda")) is False  # measured on CPUs only
    assert compile_decode_for(EngineConfig(model="m", compile_decode=False)) is False
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv(COMPILE_DECODE_ENV, off)
        assert EngineConfig(model="m").compile_decode is False
        assert EngineConfig(model="m", compile_decode=True).compile_decode is True


EXITS_DURING_THE_BUILD = """
import sys, time
import engine.core.model_runner as model_runner
from engine.core.engine import LLMEngine

def endless_backend(gm, example_inputs):  # a build that would never end by itself
    print("building", flush=True)
    while True:
        time.sleep(0.05)

model_runner.COMPILE_BACKEND = endless_backend
engine = LLMEngine(sys.argv[1], compile_decode=True, block_size=4, num_kv_blocks=64)
time.sleep(float(sys.argv[2]))
print("exiting", engine.runner.compiled_ready, flush=True)
"""


def test_a_process_that_ends_during_the_build_exits_cleanly(tiny_llama):
    """The build is stopped at shutdown: a daemon thread killed inside the compiler aborted the process
    (SIGABRT), and a thread joined as it was would have kept it alive until the build ended (never, here)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("INFERSIGHT_COMPILE_DECODE", None)
    done = subprocess.run([sys.executable, "-c", EXITS_DURING_THE_BUILD, str(tiny_llama), "5"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exiting False" in done.stdout, done.stdout


def test_health_says_while_the_build_runs_and_a_fleet_waits_for_it_to_end(tiny_llama, background):
    """/health's compiled_decode walks building -> ready, and processes.wait_compiled (what `fleet up` waits on
    before its traffic starts) returns only once the build has ended, or says it still builds at its deadline."""
    import httpx

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.processes import wait_compiled
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    release = threading.Event()

    def held_backend(gm, example_inputs):
        assert release.wait(timeout=600)
        return gm.forward

    background.COMPILE_BACKEND = held_backend
    config = EngineConfig(model=str(tiny_llama), max_model_len=64, num_kv_blocks=64, block_size=4,
                          compile_decode=True)
    engine = AsyncLLM(config)
    try:
        with BackgroundServer(build_app(ServedModel.from_engine(engine, created=0))) as server:
            assert httpx.get(server.url + "/health").json()["compiled_decode"] == "building"
            assert wait_compiled(server.url, timeout=0.5)[0] == "building"
            release.set()
            state, _ = wait_compiled(server.url, timeout=600)
            assert state == "ready"
            assert httpx.get(server.url + "/health").json()["compiled_decode"] == "ready"
    finally:
        release.set()
