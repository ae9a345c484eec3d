"""GuardedFanOut: a MultiObserver whose hooks are built once, each guarded per part.

`MultiObserver(ObserverGuard(p) for p in parts)` would guard each part with a
closure call of its own; here each hook is one prebuilt function over only the
parts that override it (the hooks run on the engine thread, every step), and an
exception in one part is logged once, counted, and does not stop the others.
"""

from __future__ import annotations

import logging

from telemetry.contract.hooks import HOOK_NAMES, EngineObserver, MultiObserver, noop_hook, overrides

log = logging.getLogger(__name__)

HOOKS = HOOK_NAMES


class GuardedFanOut(MultiObserver):
    guards_hooks = True  # the engine holds it unwrapped (contract.hooks.guarded)

    def __init__(self, parts: list[EngineObserver]):
        self.failures = 0
        self._logged: set[tuple[str, str]] = set()
        super().__init__(parts)  # keeps the enabled ones in self.observers, builds the hooks

    def _fan_out(self, name: str):
        calls = tuple(getattr(part, name) for part in self.observers if overrides(part, name))
        if not calls:
            return noop_hook
        if len(calls) == 1:  # the usual case for most hooks: one part listens
            call = calls[0]

            def hook(*args, **kwargs):
                try:
                    call(*args, **kwargs)
                except Exception:  # telemetry never breaks the engine
                    self._failed(call, name)

            return hook

        def hook(*args, **kwargs):
            for call in calls:
                try:
                    call(*args, **kwargs)
                except Exception:  # telemetry never breaks the engine, nor the other parts
                    self._failed(call, name)

        return hook

    def _failed(self, call, name: str) -> None:
        self.failures += 1
        key = (type(getattr(call, "__self__", call)).__name__, name)
        if key not in self._logged:
            self._logged.add(key)
            log.exception("%s.%s failed (further failures counted only)", *key)
