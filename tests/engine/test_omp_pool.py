"""A thread that loaded the model frees its OpenMP pool when another thread will step the engine
(engine/core/omp_pool.py): the idle pool's threads are gone, torch still computes, and AsyncLLM does it in
the thread that builds it."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import engine.core.async_engine as async_engine
from engine.core.omp_pool import free_this_threads_pool


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_freeing_the_pool_ends_its_threads_and_torch_still_computes(two_threads):
    x = torch.ones(1 << 22)
    result: dict = {}

    def in_a_fresh_thread():  # a thread of its own: its pool is this test's alone
        x.sum()  # a parallel region: the pool is made
        result["with pool"] = _threads()
        result["freed"] = free_this_threads_pool()
        result["without pool"] = _threads()
        result["sum after"] = float(x.sum())  # made again where needed

    worker = threading.Thread(target=in_a_fresh_thread)
    worker.start()
    worker.join()
    assert result["freed"] is True
    assert result["without pool"] < result["with pool"]
    assert result["sum after"] == float(1 << 22)


def test_asyncllm_frees_the_building_threads_pool(tiny_llama, monkeypatch):
    freed_in: list = []
    monkeypatch.setattr(async_engine, "free_this_threads_pool", lambda: freed_in.append(threading.current_thread()))
    async_engine.AsyncLLM(tiny_llama, block_size=4, num_kv_blocks=32)
    assert freed_in == [threading.current_thread()]


def test_the_compile_build_frees_its_own_threads_pool_when_it_ends(tiny_llama, monkeypatch):
    """The background build's torch work gives its thread a pool; left idle beside the engine's, it slowed
    every short parallel region of a step (reference model, batch 1, compiled: ~1,300 -> ~1,950 tok/s with it
    freed, `python -m engine.benchmarks.compiled_call`)."""
    import engine.core.compile_warmup as compile_warmup
    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")  # dynamo's graph, no inductor build
    monkeypatch.setattr(model_runner, "BACKGROUND_COMPILE", True)
    freed_in: list = []
    monkeypatch.setattr(compile_warmup, "free_this_threads_pool", lambda: freed_in.append(threading.current_thread()))
    engine = LLMEngine(tiny_llama, compile_decode=True, block_size=4, num_kv_blocks=64)
    assert engine.runner.wait_compiled(timeout=600), engine.runner.background.error
    assert [t.name for t in freed_in] == ["compile-decode"]
