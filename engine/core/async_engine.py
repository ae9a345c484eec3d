"""The streaming API: the engine loop on a background thread, asyncio callers.

    engine = AsyncLLM(config)            # or AsyncLLM("model/dir", max_num_seqs=32)
    engine.start()
    async for out in engine.generate(prompt, params, request_id="r1"):
        print(out.new_text, end="")      # increments: new_token_ids / new_text
    await engine.abort("r1")
    await engine.shutdown()              # lets running requests finish, then stops

The forward pass runs on its own thread so the event loop (an HTTP server)
stays responsive. Callers validate and tokenize on their side
(`LLMEngine.make_sequence`, so bad input raises ValueError right in
`generate`; a `Prompt` comes tokenized already), then hand the sequence
over through a queue; the loop thread adds it, steps, and posts each output
to the caller's asyncio queue. A caller that stops iterating (client went
away) aborts its request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.omp_pool import free_this_threads_pool
from telemetry.contract.hooks import EngineObserver
from engine.core.outputs import RequestOutput
from engine.core.prompt import Prompt
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop crashed; requests in flight were failed with this error."""


@dataclass(frozen=True)
class AddRequest:
    """To the loop thread: queue this sequence (made and checked on the caller's side)."""

    seq: Sequence


@dataclass(frozen=True)
class AbortRequest:
    """To the loop thread: stop this request wherever it is."""

    request_id: str


class _Stream:
    """One request's outputs, posted from the loop thread into the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            pass


class AsyncLLM:
    def __init__(self, config: EngineConfig | str | Path, observer: EngineObserver | None = None,
                 **config_overrides):
        self.engine = LLMEngine(config, observer, **config_overrides)
        # this thread loaded the model and the engine thread steps it: its idle OpenMP pool would slow
        # every step's parallel regions (engine/core/omp_pool.py)
        free_this_threads_pool()
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self._inbox: queue.SimpleQueue[AddRequest | AbortRequest] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._draining = False
        self.error: BaseException | None = None

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="infersight-engine", daemon=True)
            self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting requests; let those in flight finish (`drain`) or abort them; stop the loop."""
        self._draining = True
        if not drain:
            for request_id in list(self._streams):
                self._send(AbortRequest(request_id))
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)
        self.engine.close()

    # --- requests --------------------------------------------------------------------

    async def generate(self, prompt: str | list[int] | Prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, workload: str = "", trace_context: dict | None = None,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Yield this request's outputs as they come (the last one has `finished=True`).

        `prompt`: a text, token IDs, or a `Prompt` (engine.core.prompt) its caller already tokenized and
        checked (the server's admission): the engine does not encode or check it again."""
        if self.error is not None:
            raise EngineDeadError(f"the engine loop died: {self.error!r}")
        if self._draining:
            raise RuntimeError("the engine is shutting down and accepts no new requests")
        self.start()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seq = self.engine.make_sequence(request_id, prompt, sampling_params, arrival_time, workload,
                                        trace_context, stream=True)
        stream = _Stream(asyncio.get_running_loop())
        self._streams[request_id] = stream
        self._send(AddRequest(seq))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the caller stopped listening (or was cancelled): free the slot
                self._send(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    def _send(self, message: AddRequest | AbortRequest) -> None:
        self._inbox.put(message)
        self._wake.set()

    # --- the loop thread ---------------------------------------------------------------

    def _loop(self) -> None:
        engine = self.engine
        try:
            while True:
                self._drain_inbox()
                if engine.has_unfinished():
                    for out in engine.step():
                        self._deliver(out)
                    continue
                if self._stopping and self._inbox.empty():
                    return
                self._wake.wait()
                self._wake.clear()
        except BaseException as e:  # noqa: BLE001 - fail every waiting caller, loudly
            log.exception("the engine loop died")
            self.error = e
            dead = EngineDeadError(f"the engine loop died: {e!r}")
            for stream in list(self._streams.values()):
                stream.put(dead)
            self._streams.clear()

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, AddRequest):
                self._add(message.seq)
            else:
                out = self.engine.abort(message.request_id)
                if out is not None:
                    self._deliver(out)

    def _add(self, seq: Sequence) -> None:
        try:
            self.engine.add_sequence(seq)
        except ValueError as e:
            stream = self._streams.pop(seq.request_id, None)
            if stream is not None:
                stream.put(e)

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if out.finished:
            self._streams.pop(out.request_id, None)
        if stream is not None:
            stream.put(out)
