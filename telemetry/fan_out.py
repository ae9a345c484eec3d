"""GuardedFanOut: a MultiObserver whose hooks are built once, each guarded per part.

`MultiObserver(ObserverGuard(p) for p in parts)` builds two closures per part on
every hook call and calls the base class's no-op hooks too; on the engine thread,
every step, that was several times the cost of the metrics themselves. Here each
hook is a prebuilt function over only the parts that override it, and an
exception in one part is logged once, counted, and does not stop the others.
"""

from __future__ import annotations

import logging

from engine.observer import EngineObserver, MultiObserver

log = logging.getLogger(__name__)

HOOKS = tuple(name for name in vars(EngineObserver) if name.startswith("on_")) + ("close",)


class GuardedFanOut(MultiObserver):
    def __init__(self, parts: list[EngineObserver]):
        super().__init__(parts)  # keeps the enabled ones in self.observers
        self.failures = 0
        self._logged: set[tuple[str, str]] = set()
        self._hooks = {name: self._build(name) for name in HOOKS}

    def __getattribute__(self, name):
        if name.startswith("on_") or name == "close":
            return object.__getattribute__(self, "_hooks")[name]
        return object.__getattribute__(self, name)

    def _build(self, name: str):
        base = getattr(EngineObserver, name)
        calls = tuple(getattr(part, name) for part in object.__getattribute__(self, "observers")
                      if getattr(type(part), name, base) is not base)

        def hook(*args, **kwargs):
            for call in calls:
                try:
                    call(*args, **kwargs)
                except Exception:  # telemetry never breaks the engine, nor the other parts
                    self._failed(call, name)

        return hook

    def _failed(self, call, name: str) -> None:
        self.failures += 1
        key = (type(call.__self__).__name__, name)
        if key not in self._logged:
            self._logged.add(key)
            log.exception("%s.%s failed (further failures counted only)", *key)
