"""Changes in time: a replica whose identity changed across a restart (the same replica id started again
with other weights, tokenizer, template, version or config keys) is an event, with its time and the keys
that changed, before and after.

A difference between replicas (diagnostics.identity) says what is different now; an event says when
it began and from what. `events` reads every start of the scope's replicas up to the window's end (a
change before the window still explains it: the replica runs under it since); `in_window` picks those inside
the window, and `findings` makes one `identity_changed` info finding per such event; `cite` appends the
replica's latest event to the other diagnostics' findings on it ("since 05:01:10, when max_num_seqs went
16 → 2", `Event.since`), and puts it in their evidence, so a person reading a lagging or drift finding sees
the change that preceded it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from diagnostics import config_keys
from diagnostics.findings import Finding
from diagnostics.scope import Scope, replicas_in
from telemetry.contract.derived import replica_filter_sql

DIAGNOSTIC = "identity"
KIND = "identity_changed"
COLUMNS = ("weights_hash", "tokenizer_hash", "chat_template_hash", "engine_version", "model_name")
MAX_SAID = 3

_STARTS = f"""
SELECT replica_id, start_time, {", ".join(COLUMNS)}, config_json
FROM replicas
WHERE start_time < toDateTime64({{end:Float64}}, 6, 'UTC') AND {replica_filter_sql()}
  AND has({{ids:Array(String)}}, replica_id)
ORDER BY replica_id, start_time
"""


@dataclass(frozen=True)
class Event:
    replica_id: str
    time: float  # the start that brought the change (epoch seconds)
    previous_start: float
    changes: tuple[dict, ...]  # {key, before, after}, most specific first

    def said(self) -> str:
        """`max_num_seqs went 16 → 2` (the first few changes)."""
        parts = [f"{_name(c['key'])} went {_value(c['before'])} → {_value(c['after'])}"
                 for c in self.changes[:MAX_SAID]]
        more = len(self.changes) - MAX_SAID
        return ", ".join(parts) + (f" and {more} more" if more > 0 else "")

    def since(self) -> str:
        """`since 05:01:10 UTC, when max_num_seqs went 16 → 2`: how a finding on the replica cites it."""
        return f"since {self.clock()} UTC, when {self.said()}"

    def clock(self) -> str:
        from datetime import datetime, timezone

        return datetime.fromtimestamp(self.time, timezone.utc).strftime("%H:%M:%S")

    def describe(self) -> dict:
        return {"replica": self.replica_id, "time": self.time, "previous_start": self.previous_start,
                "changes": list(self.changes)}


def _name(key: str) -> str:
    name, place = config_keys.where(key)
    return f"{name} ({place})" if place else name


def _value(v) -> str:
    return "unset" if v is None else v if isinstance(v, str) else json.dumps(v, default=str)


def _seconds(t) -> float:
    return t.timestamp() if hasattr(t, "timestamp") else float(t)


def changes(before: dict, after: dict) -> list[dict]:
    """The identity keys that differ between two starts' rows: columns, then config keys most specific first;
    a file's digest only where none of its keys differ."""
    out = [{"key": c, "before": before.get(c) or None, "after": after.get(c) or None}
           for c in COLUMNS if (before.get(c) or None) != (after.get(c) or None)]
    a, b = config_keys.behaviour(before.get("config_json")), config_keys.behaviour(after.get("config_json"))
    keys = [k for k in sorted(set(a) | set(b), key=config_keys.rank) if a.get(k) != b.get(k)]
    if any(not k.endswith((".sha256", ".bytes")) for k in keys):
        keys = [k for k in keys if not k.endswith((".sha256", ".bytes"))]
    return out + [{"key": k, "before": a.get(k), "after": b.get(k)} for k in keys]


def events(store, scope: Scope) -> dict[str, list[Event]]:
    """replica -> its identity changes across restarts (oldest first), up to the scope's end."""
    ids = sorted({r["replica_id"] for r in replicas_in(store, scope)})
    if not ids:
        return {}
    rows = store.query_arrow(_STARTS, {**scope.parameters(), "ids": ids}).to_pylist()
    out: dict[str, list[Event]] = {}
    for before, after in zip(rows, rows[1:]):
        if before["replica_id"] != after["replica_id"]:
            continue
        changed = changes(before, after)
        if changed:
            out.setdefault(after["replica_id"], []).append(
                Event(after["replica_id"], _seconds(after["start_time"]), _seconds(before["start_time"]),
                      tuple(changed)))
    return out


def in_window(evs: list[Event], scope: Scope) -> list[Event]:
    """The changes that happened inside the scope's window (oldest first, as `events` lists them)."""
    start, end = scope.bounds()
    return [e for e in evs if start <= e.time < end]


def findings(scope: Scope, found: dict[str, list[Event]]) -> list[Finding]:
    """One info finding per change inside the window."""
    out = []
    for rid, evs in sorted(found.items()):
        for e in in_window(evs, scope):
            out.append(Finding(KIND, "info", rid, f"{rid} restarted at {e.clock()} UTC with another identity: "
                                                  f"{e.said()}", DIAGNOSTIC, scope, e.describe()))
    return out


def cite(findings_: list[Finding], found: dict[str, list[Event]]) -> None:
    """Append to each finding on a replica (or a pair naming it) the replica's latest change, in place; a finding
    that cites its replica's changes itself (evidence `identity_events`: availability's over-time rule) is left
    as it is."""
    for f in findings_:
        if f.kind == KIND or "identity_events" in f.evidence:
            continue
        named = [rid for rid in found if rid == f.subject or rid in f.subject.split(" vs ")]
        cited = [found[rid][-1] for rid in named]
        if not cited:
            continue
        f.evidence["identity_events"] = [e.describe() for e in cited]
        f.summary += "".join(f"; {e.replica_id} {e.since()}" for e in cited)
