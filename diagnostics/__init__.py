"""Diagnostics: read the store for a scope, return findings with evidence, record them.

`run_all(store)` runs every diagnostic over the last day and writes the findings; `run(names, ...)`
runs some. Each diagnostic module exposes `run(store, scope, ...) -> list[Finding]`.
"""

from __future__ import annotations

import importlib
import logging
import time

from diagnostics.findings import Finding, resolved, worst_first, write_findings
from diagnostics.scope import Scope

log = logging.getLogger(__name__)

DIAGNOSTICS = ("regression", "replicas", "tokenizer", "drift", "speculative", "overhead")
DEFAULT_WINDOW = "24h"


def _run_one(name: str, store, scope: Scope, baseline: Scope | None, candidate: Scope | None,
             model_dirs: dict) -> list[Finding]:
    module = importlib.import_module(f"diagnostics.{name}")
    if name in ("regression", "speculative"):
        return module.run(store, scope, baseline, candidate)
    if name == "drift":
        return module.run(store, scope, baseline, candidate, model_dirs)
    if name == "tokenizer":
        return module.run(store, scope, model_dirs)
    return module.run(store, scope)


def run(names, store, scope: Scope, *, baseline: Scope | None = None, candidate: Scope | None = None,
        model_dirs: dict | None = None, write: bool = True, now: float | None = None,
        errors: list | None = None) -> list[Finding]:
    """Run the named diagnostics; with `write`, store their findings and resolve earlier ones that
    are gone. A diagnostic that fails is logged (and appended to `errors`); the others still run."""
    findings: list[Finding] = []
    now = time.time() if now is None else now
    for name in names:
        try:
            found = _run_one(name, store, scope, baseline, candidate, dict(model_dirs or {}))
        except Exception as e:  # noqa: BLE001 - one broken diagnostic must not hide the others' findings
            log.exception("diagnostic %s failed", name)
            if errors is not None:
                errors.append((name, e))
            continue
        if write:
            # resolve against the scope the findings were keyed with (the candidate's, where one is given)
            keyed = {f.scope.key(): f.scope for f in found} or {scope.key(): scope}
            for s in keyed.values():
                found += resolved(store, name, s, found)
            write_findings(store, found, now)
        findings += found
    return worst_first(findings)


def run_all(store, scope: Scope | None = None, write: bool = True, **kwargs) -> list[Finding]:
    """Every diagnostic over `scope` (default: the last day); findings stored unless write=False."""
    from telemetry.store import open_store

    store = open_store(store)
    scope = scope or Scope.window(since=DEFAULT_WINDOW)
    return run(DIAGNOSTICS, store, scope, write=write, **kwargs)
