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
