"""Compiled decode steps built off the request path: a replica serves eager from its first request and
switches to the compiled step when it is built.

A compiled decode step's first call traces it (dynamo), lowers it (AOTAutograd, inductor) and builds its
C++: seconds with a warm persistent cache (engine/core/compile_cache.py), minutes on an empty one. Made on
the request path, the first decode of each shape waited for that. Here a thread makes those first calls
at start, on decodes of its own, while the engine serves eager steps; the runner takes the compiled path
once the build's last act has marked it ready (ModelRunner.compiled_ready), between two steps.

What makes that safe to run beside the engine's own steps:
- the thread's decodes write and read a pool of their own: tensors of the engine pool's shapes (the graph
  takes the pool as static-shaped inputs, so its shapes must match) made by `torch.empty`, whose pages the
  OS backs only where written: the few slots these decodes touch, not another pool's worth of memory;
- their attention plans come from a backend instance of their own (its memo and block-list buffers are
  not the engine's); the plan is a step input, so the graphs serve the engine's backend as they are;
- dynamo's frame hook is per thread: the engine's eager steps on the same module are not traced, and
  nothing in the model is mutated by a trace (parameters are graph inputs, read);
- the engine's thread calls the compiled functions only after that, so no function is ever traced in
  two threads at once. A decode shape the warm-up did not meet still compiles on the request path.

The decodes are the shapes a compiled step's guards tell apart: batch 1 (dynamo specializes a size of 1),
a batch of equal lengths, and one of unequal lengths (a length mask where attention gathers); each with
lengths that coincide with no other size in the step, so no size is taken for another (duck sizing).
Multi-step decode's sub-step function (`_argmax_step`) is warmed the same way when the engine may use it
(a fixed K > 1, or "auto", the default, which takes K > 1 once a step is measured fast).

The thread runs at a lower CPU priority (Linux: `nice` is per thread; the compiler processes it starts
inherit it) so that on a small machine the requests being served eagerly keep the cores. It still holds
the GIL while it traces: eager steps run slower until the build is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Callable

import torch

from engine.core.attention.base import AttentionBackend, AttentionMetadata
from engine.core.heap_trim import release_free_heap
from engine.core.omp_pool import free_this_threads_pool

log = logging.getLogger(__name__)

# (context lengths, in tokens after the step) of the warm-up decodes: see the module's docstring
WARMUP_BATCHES = ([11], [13, 13], [13, 9])
NICE = 10  # added to the warm-up thread's CPU priority
TIMED_CALLS = 3  # batch-1 calls timed once the graphs are built (the fastest is returned)


def scratch_pool(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Tensors of the pool's shapes, distinct per layer (dynamo guards on aliasing between inputs), backed
    by memory only where written."""
    return [(torch.empty_like(k), torch.empty_like(v)) for k, v in kv_caches]


def warmup_decode(lengths: list[int], block_size: int, num_blocks: int, device: torch.device):
    """input ids, positions and attention metadata of one decode step of len(lengths) sequences, each one
    new token at the end of its context, in blocks of its own (block ids wrap inside a small pool)."""
    tables, slots, block = [], [], 0
    for n in lengths:
        need = -(-n // block_size)
        table = [(block + i) % num_blocks for i in range(need)]
        block += need
        tables.append(table)
        slots.append(table[(n - 1) // block_size] * block_size + (n - 1) % block_size)
    metadata = AttentionMetadata(query_lens=[1] * len(lengths), context_lens=list(lengths), block_tables=tables,
                                 slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                                 block_size=block_size)
    ids = torch.tensor([7] * len(lengths), dtype=torch.long, device=device)
    positions = torch.tensor([n - 1 for n in lengths], dtype=torch.long, device=device)
    return ids, positions, metadata


class BuildStopped(Exception):
    """Raised inside the build thread when the interpreter shuts down (`BackgroundCompile.stop`)."""


class BackgroundCompile:
    """Runs `build` (the compiled functions' first calls, ending with the runner marking them ready) in a thread.
    A build that raises leaves the engine eager (`error`, logged): serving never depends on the compiler.

    A process that ends while the build runs stops it first (`stop`, run by the interpreter's shutdown before
    it joins threads): a daemon thread would be killed inside the compiler's C++ frames at finalization, and
    the process abort ("terminate called ... exception not rethrown", SIGABRT) instead of exiting."""

    def __init__(self, build: Callable[[], None], memory: Callable[[], str] | None = None):
        """`memory`: the process's memory line (process_memory.py), logged once the build is done: the start
        summary's line is read before the compiler is imported, and the build is what compile costs."""
        self.error: BaseException | None = None
        self._memory = memory
        self.seconds: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(build,), name="compile-decode")
        threading._register_atexit(self.stop)  # noqa: SLF001 - concurrent.futures' hook: before threads are joined
        self._thread.start()

    def stop(self) -> None:
        """End the build at its next Python instruction (an exception raised in its thread): the process is
        exiting, and its graphs would not be used. A call into C (a compiler process it waits for) ends first."""
        if not self._done.is_set() and self._thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread.ident),
                                                       ctypes.py_object(BuildStopped))

    def _run(self, build: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
            except (AttributeError, OSError):  # not Linux, or not allowed: same priority
                pass
            build()
            self.seconds = time.perf_counter() - start
            release_free_heap()  # what tracing and lowering freed, still resident in this thread's arena
            log.info("compiled decode steps ready after %.1f s; decode steps take them from now on", self.seconds)
            if self._memory is not None:
                log.info("after the compiled decode steps' build: %s", self._memory())
        except BuildStopped as e:
            self.error = e
        except BaseException as e:  # noqa: BLE001 - any failure of the compiler leaves the engine eager
            self.error = e
            if isinstance(e.__cause__ or e.__context__, BuildStopped):  # dynamo wraps what its frames raise
                return
            log.warning("compiling decode steps failed; decode steps stay eager: %r", e)
        finally:
            # the build's torch work made this thread an OpenMP pool; left idle beside the engine's, it makes
            # libgomp throttle its spin-wait and every short parallel region of a step pays a wake-up
            free_this_threads_pool()
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the build to end (ready or failed); True if it ended."""
        return self._done.wait(timeout)


def warm_up(step: Callable, kv_caches, backend: AttentionBackend, block_size: int, device: torch.device,
            inductor: bool, eager_first: Callable | None = None) -> float:
    """Call a compiled decode function (`step(ids, positions, metadata, kv_caches, backend)`) on each
    warm-up batch, over a scratch pool and `backend` (a fresh instance, set up here as the runner set up
    the engine's: see the module's docstring). `eager_first`: the same function uncompiled, run once
    before the first trace, so that what the model makes lazily on its first forward (the rope's
    per-device table, marked static for dynamo) exists and is marked when the trace meets it, as on the
    request path, where a prefill always ran first (traced, it is made unmarked, and the engine's own
    first forward then marks it: a guard fails and the first real decode recompiles).

    Returns the fastest of TIMED_CALLS more batch-1 calls, its graph built: the least a decode step's forward
    takes (the runner's multi-step choice)."""
    pool = scratch_pool(kv_caches)
    for k, v in pool:
        torch._dynamo.mark_static(k)
        torch._dynamo.mark_static(v)
    backend.for_compiled_decode(pool[0][0], inductor)
    num_blocks = kv_caches[0][0].shape[0]

    def call(fn, lengths) -> float:  # each call its own plan: an eager forward caches views in the plan it reads
        ids, positions, metadata = warmup_decode(lengths, block_size, num_blocks, device)
        backend.prepare(metadata)
        backend.activate(metadata)
        with torch.inference_mode():
            start = time.perf_counter()
            fn(ids, positions, metadata, pool, backend)
            return time.perf_counter() - start

    if eager_first is not None:
        call(eager_first, WARMUP_BATCHES[0])
    for lengths in WARMUP_BATCHES:
        call(step, lengths)
    return min(call(step, WARMUP_BATCHES[0]) for _ in range(TIMED_CALLS))
