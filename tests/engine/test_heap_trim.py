"""engine/core/heap_trim.py: free pages inside glibc's heap go back to the OS at the engine's start and at the
end of the compiled decode steps' build, so the replica's RSS is what it holds."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from engine.core.heap_trim import release_free_heap
from engine.core.process_memory import process_rss

CHUNK, CHUNKS = 16 * 1024, 12_000  # 16 KiB blocks (below malloc's mmap threshold: from the heap), ~190 MiB


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc


@pytest.mark.skipif(ctypes.util.find_library("c") is None or not hasattr(_libc(), "malloc_trim"),
                    reason="glibc's malloc_trim")
def test_the_free_middle_of_the_heap_is_returned_to_the_os():
    """Blocks freed below one still held stay resident (free() only returns the heap's top); the trim gives
    their pages back."""
    libc = _libc()
    blocks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
    for b in blocks:
        libc.memset(b, 1, CHUNK)  # touched: resident
    held = libc.malloc(CHUNK)  # above them all: the heap's top cannot shrink past it
    libc.memset(held, 1, CHUNK)
    try:
        for b in blocks:
            libc.free(b)
        before = process_rss()[0]
        assert release_free_heap()
        after = process_rss()[0]
        assert before - after > CHUNK * CHUNKS // 2, (before >> 20, after >> 20)
    finally:
        libc.free(held)


def test_the_engine_trims_after_loading_and_the_build_after_building(tiny_llama, monkeypatch):
    import engine.core.compile_warmup as compile_warmup
    import engine.core.engine as engine_module
    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine

    calls = []
    monkeypatch.setattr(engine_module, "release_free_heap", lambda: calls.append("start"))
    monkeypatch.setattr(compile_warmup, "release_free_heap", lambda: calls.append("build"))
    monkeypatch.setattr(model_runner, "BACKGROUND_COMPILE", True)
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")
    engine = LLMEngine(tiny_llama, compile_decode=True, block_size=4, num_kv_blocks=64)
    assert engine.runner.wait_compiled(timeout=600), engine.runner.background.error
    assert calls == ["start", "build"]
