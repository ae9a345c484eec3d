"""The engine's observer interface: how telemetry plugs into the engine.

The engine calls these hooks at its boundaries. The default is a no-op, and
the engine checks `observer.enabled` before building anything it would only
build for an observer, so measuring costs next to nothing when no one listens.

Hooks run on the engine thread, inside the step: implementations must return
quickly and must never raise (the engine guards each call anyway and counts
failures; see `ObserverGuard`).
"""

from __future__ import annotations

import logging

from telemetry.records import ReplicaRecord, RequestRecord, StepRecord

log = logging.getLogger(__name__)


class EngineObserver:
    """Base class and no-op default. Subclass and override what you need."""

    enabled: bool = False

    def on_replica_start(self, record: ReplicaRecord) -> None:
        """Once, when the engine has loaded its model and knows its identity."""

    def on_request_arrival(self, request_id: str, arrival_time: float, prompt_tokens: int,
                           workload: str, trace_context: dict | None) -> None:
        """A request entered the waiting queue. `trace_context` carries e.g. a W3C traceparent."""

    def on_request_scheduled(self, request_id: str, when: float) -> None:
        """The scheduler ran the first chunk of the request's prompt."""

    def on_first_token(self, request_id: str, when: float) -> None:
        """The first output token of a request was sampled."""

    def on_step(self, record: StepRecord) -> None:
        """One scheduler step finished."""

    def on_request_finished(self, record: RequestRecord) -> None:
        """A request finished or was aborted (the record is final)."""

    def on_tokenization(self, cache_hit: bool) -> None:
        """A prompt went through the tokenization cache."""

    def close(self) -> None:
        """The engine is shutting down: flush."""


NOOP_OBSERVER = EngineObserver()


class MultiObserver(EngineObserver):
    """Fans every hook out to several observers (e.g. recorder + metrics + tracing)."""

    def __init__(self, observers: list[EngineObserver]):
        self.observers = [o for o in observers if o.enabled]
        self.enabled = bool(self.observers)

    def __getattribute__(self, name):
        if name.startswith("on_") or name == "close":
            observers = object.__getattribute__(self, "observers")

            def fan_out(*args, **kwargs):
                for observer in observers:
                    getattr(observer, name)(*args, **kwargs)

            return fan_out
        return object.__getattribute__(self, name)


class ObserverGuard(EngineObserver):
    """Wraps an observer so that an exception in a hook never reaches the engine.

    Failures are logged once per hook and counted in `failures`.
    """

    def __init__(self, inner: EngineObserver):
        self.inner = inner
        self.enabled = inner.enabled
        self.failures = 0
        self._logged: set[str] = set()

    def __getattribute__(self, name):
        if name.startswith("on_") or name == "close":
            inner = object.__getattribute__(self, "inner")
            hook = getattr(inner, name)
            guard = self

            def guarded(*args, **kwargs):
                try:
                    hook(*args, **kwargs)
                except Exception:  # never let telemetry break the engine
                    guard.failures += 1
                    if name not in guard._logged:
                        guard._logged.add(name)
                        log.exception("observer hook %s failed (further failures counted only)", name)

            return guarded
        return object.__getattribute__(self, name)
