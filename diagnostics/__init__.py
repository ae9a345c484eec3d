"""Diagnostics: read the store for a scope, return findings with evidence, record them.

Every diagnostic is a module with `run(store, request: DiagnosticRequest) -> list[Finding]`;
`DIAGNOSTICS` names them as the CLI does. `run_all(store)` runs every one over the last day and
writes the findings; `run(names, store, request)` runs some.
"""

from __future__ import annotations

import logging
import time

from diagnostics import (
    agreement,
    availability,
    drift,
    identity,
    identity_events,
    overhead,
    probe,
    quality,
    regression,
    replicas,
    rescore,
    speculative,
    steps,
    tokenizer,
)
from diagnostics.findings import Finding, resolved, worst_first, write_findings
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

log = logging.getLogger(__name__)

# name (as `infersight diagnose NAME` says it, each module's DIAGNOSTIC) -> its module, in the order they run
DIAGNOSTICS = {m.DIAGNOSTIC: m for m in (regression, replicas, tokenizer, identity, drift,
                                         probe, quality, rescore, agreement,
                                         speculative, overhead, steps,
                                         availability)}
DEFAULT_WINDOW = "24h"


def run(names, store, request: DiagnosticRequest, *, write: bool = True, now: float | None = None,
        errors: list | None = None) -> list[Finding]:
    """Run the named diagnostics; with `write`, store their findings and resolve earlier ones that
    are gone. A diagnostic that fails is logged (and appended to `errors`); the others still run."""
    findings: list[Finding] = []
    now = time.time() if now is None else now
    changes = None  # replicas' identity changes across restarts, read once: every finding on them cites theirs
    for name in names:
        try:
            found = DIAGNOSTICS[name].run(store, request)
        except Exception as e:  # noqa: BLE001 - one broken diagnostic must not hide the others' findings
            log.exception("diagnostic %s failed", name)
            if errors is not None:
                errors.append((name, e))
            continue
        changes = _identity_changes(store, request) if changes is None else changes
        identity_events.cite(found, changes)
        if write:
            # resolve against the scope the findings were keyed with (the candidate's, where one is given)
            keyed = {f.scope.key(): f.scope for f in found} or {request.scope.key(): request.scope}
            for s in keyed.values():
                found += resolved(store, name, s, found)
            write_findings(store, found, now)
        findings += found
    return worst_first(findings)


def _identity_changes(store, request: DiagnosticRequest) -> dict:
    try:
        return identity_events.events(store, request.scope)
    except Exception:  # noqa: BLE001 - the findings stand without their citation
        log.exception("reading the replicas' identity changes failed")
        return {}


def run_all(store, request: DiagnosticRequest | None = None, write: bool = True, **kwargs) -> list[Finding]:
    """Every diagnostic over `request` (default: the last day); findings stored unless write=False."""
    from telemetry.store import open_store

    store = open_store(store)
    request = request or DiagnosticRequest(Scope.window(since=DEFAULT_WINDOW))
    return run(DIAGNOSTICS, store, request, write=write, **kwargs)
