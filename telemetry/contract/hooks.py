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

from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord

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
        """The scheduler ran the first chunk of the request's prompt (the metrics observe queue time here)."""

    def on_first_token(self, request_id: str, when: float) -> None:
        """The first output token of a request was sampled (the metrics observe TTFT here)."""

    def on_step(self, record: StepRecord) -> None:
        """One scheduler step finished."""

    def on_request_finished(self, record: RequestRecord) -> None:
        """A request finished or was aborted (the record is final)."""

    def on_tokenization(self, cache_hit: bool) -> None:
        """A prompt went through the tokenization cache."""

    def close(self) -> None:
        """The engine is shutting down: flush."""


NOOP_OBSERVER = EngineObserver()


def replay_request(observer: EngineObserver, record: RequestRecord) -> None:
    """Call the request hooks a finished record implies, in the engine's order (arrival, scheduled,
    first token, finished), for sources that see a request only once it has ended: an adapter for
    another engine's finished-request stats, a recording proxy, tests."""
    observer.on_request_arrival(record.request_id, record.arrival_time, record.prompt_tokens, record.workload,
                                {"trace_id": record.trace_id} if record.trace_id else None)
    if record.scheduled_time:
        observer.on_request_scheduled(record.request_id, record.scheduled_time)
    if record.first_token_time:
        observer.on_first_token(record.request_id, record.first_token_time)
    observer.on_request_finished(record)

# every hook a wrapper forwards
HOOK_NAMES = tuple(name for name in vars(EngineObserver) if name.startswith("on_")) + ("close",)


def noop_hook(*args, **kwargs) -> None:
    """A hook nobody listens to."""


def overrides(observer: EngineObserver, name: str) -> bool:
    """Does `observer` do anything in hook `name` (the base class's hooks do nothing)?"""
    hook = getattr(observer, name)
    return hook is not noop_hook and getattr(hook, "__func__", hook) is not getattr(EngineObserver, name)


class MultiObserver(EngineObserver):
    """Fans every hook out to several observers (e.g. recorder + metrics + tracing).

    The hooks are built once, here, over the parts that override them (they run every
    step on the engine thread): the parts are fixed at construction.
    """

    def __init__(self, observers: list[EngineObserver]):
        self.observers = [o for o in observers if o.enabled]
        self.enabled = bool(self.observers)
        for name in HOOK_NAMES:  # instance attributes: they shadow the class's no-op hooks
            setattr(self, name, self._fan_out(name))

    def _fan_out(self, name: str):
        calls = tuple(getattr(o, name) for o in self.observers if overrides(o, name))
        if not calls:
            return noop_hook
        if len(calls) == 1:
            return calls[0]

        def fan_out(*args, **kwargs):
            for call in calls:
                call(*args, **kwargs)

        return fan_out


def guarded(observer: EngineObserver | None) -> EngineObserver:
    """The observer as the engine holds it: one that guards its own hooks (`guards_hooks`: an
    ObserverGuard, telemetry's GuardedFanOut) as it is, since a second guard would only add a call
    to every hook of every step; any other wrapped in an ObserverGuard."""
    observer = observer or NOOP_OBSERVER
    return observer if getattr(observer, "guards_hooks", False) else ObserverGuard(observer)


class ObserverGuard(EngineObserver):
    """Wraps an observer so that an exception in a hook never reaches the engine.

    Failures are logged once per hook and counted in `failures`. The guarded hooks
    are built once (instance attributes), not per call: the engine calls them every step.
    """

    guards_hooks = True

    def __init__(self, inner: EngineObserver):
        self.inner = inner
        self.enabled = inner.enabled
        self.failures = 0
        self._logged: set[str] = set()
        for name in HOOK_NAMES:
            setattr(self, name, self._guarded(name) if overrides(inner, name) else noop_hook)

    def _guarded(self, name: str):
        hook = getattr(self.inner, name)

        def guarded(*args, **kwargs):
            try:
                hook(*args, **kwargs)
            except Exception:  # never let telemetry break the engine
                self.failures += 1
                if name not in self._logged:
                    self._logged.add(name)
                    log.exception("observer hook %s failed (further failures counted only)", name)

        return guarded
