"""Probe rounds on an interval, until told to stop (the scheduled prober).

Rounds start every `interval` seconds, start to start; a round that takes longer is followed at
once (never two at a time, so the prober's share of a replica stays what one round takes).
SIGTERM or SIGINT ends it cleanly: a round under way is cancelled (its requests are dropped by the
client; what the replicas already answered is recorded as usual) and the loop returns. A round
that fails as a whole (an error outside any one request) is reported and the next one runs.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import httpx

from engine.traffic.probe.results import ProbeRound
from engine.traffic.probe.runner import probe_round


def _print_error(e: Exception) -> None:
    print(f"probe round failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


async def probe_every(interval: float, urls_now: Callable[[], list[str]], report: Callable[[ProbeRound], None],
                      stop: asyncio.Event | None = None, max_rounds: int | None = None,
                      on_error: Callable[[Exception], None] = _print_error,
                      after: Callable[[], Awaitable[None]] | None = None, **round_options) -> int:
    """Run rounds until `stop` is set (or a signal, or `max_rounds`); returns the rounds run.
    `after()` (the rescore round, engine/traffic/probe/rescore.py) runs after each probe round, in the same slot.
    `urls_now()` is asked before each round (a fleet's replicas can change); a ValueError from it
    (the fleet is gone) ends the loop by propagating."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    rounds = 0
    stopping = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            start = time.monotonic()
            current = asyncio.create_task(probe_round(urls_now(), **round_options))
            await asyncio.wait({current, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not current.done():
                current.cancel()
                await asyncio.gather(current, return_exceptions=True)
                break
            try:
                report(current.result())
                if after is not None:
                    await after()
            except (RuntimeError, OSError, httpx.HTTPError) as e:
                on_error(e)
            rounds += 1
            if max_rounds is not None and rounds >= max_rounds:
                break
            try:
                await asyncio.wait_for(asyncio.shield(stopping), max(0.0, interval - (time.monotonic() - start)))
            except TimeoutError:
                pass
    finally:
        stopping.cancel()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return rounds
