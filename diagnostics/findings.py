"""Findings: what a diagnostic concluded, with the evidence a person acts on, and how they are stored.

A finding's id is a hash of (kind, subject, scope key), so running a diagnostic again over the
same scope writes the same id with a later `last_seen`: the `findings` table (ReplacingMergeTree
on last_seen, partitioned by first_seen) keeps one row per finding, and `first_seen` is carried
over from the stored version so the row stays in its partition. A finding that an earlier run
raised (above info) and this run no longer sees is written once more as info, "resolved".

Alert rules key on the kind of an active finding, so outcomes that must not alert carry a kind of
their own (insufficient_data, resolved, quality_unchanged ...) while keeping the id of the finding
they stand for (`id_kind`): the latest version of that id then no longer has the alerting kind.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np

from diagnostics.scope import Scope
from telemetry.contract.records import FindingRecord

SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
INSUFFICIENT = "insufficient_data"


@dataclass
class Finding:
    kind: str  # "regression" | "lagging_replica" | "tokenizer_divergence" | ...
    severity: str  # info | warning | critical
    subject: str  # what it is about: a replica id, "candidate vs baseline", a tokenizer hash ...
    summary: str  # the one line a person reads first
    diagnostic: str  # which diagnostic produced it
    scope: Scope
    evidence: dict = field(default_factory=dict)  # numbers, tests, replicas, token IDs, divergence
    id_kind: str = ""  # the kind the id is made from, when `kind` is an info-level stand-in for it
    fixed_id: str = ""  # an id taken over from a stored finding (a resolution)

    def __post_init__(self):
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def finding_id(self) -> str:
        if self.fixed_id:
            return self.fixed_id
        key = "\x1f".join((self.id_kind or self.kind, self.subject, self.scope.key()))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def insufficient(self) -> bool:
        return self.evidence.get("status") == INSUFFICIENT

    def above(self, severity: str) -> bool:
        return SEVERITY_RANK[self.severity] > SEVERITY_RANK[severity]

    def evidence_json(self) -> str:
        body = {**self.evidence, "scope": self.scope.describe(), "scope_key": self.scope.key()}
        return json.dumps(jsonable(body), sort_keys=True, allow_nan=False)

    def to_record(self, now: float, first_seen: float | None = None) -> FindingRecord:
        start, end = self.scope.bounds(now)
        return FindingRecord(finding_id=self.finding_id, kind=self.kind, severity=self.severity,
                             subject=self.subject, summary=self.summary, window_start=start, window_end=end,
                             evidence_json=self.evidence_json(), first_seen=first_seen or now, last_seen=now,
                             diagnostic=self.diagnostic)


def insufficient(kind: str, subject: str, diagnostic: str, scope: Scope, what: str, **numbers) -> Finding:
    """An explicit "cannot decide": too few samples for the test, never a guess (it stands in for
    a finding of `kind` about `subject`, and replaces an earlier one)."""
    return Finding(INSUFFICIENT, "info", subject, f"insufficient data: {what}", diagnostic, scope,
                   {"status": INSUFFICIENT, "for_kind": kind, "reason": what, **numbers}, id_kind=kind)


def jsonable(value):
    """Evidence as plain JSON: numpy scalars/arrays to Python, NaN/inf to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def worst_first(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], f.diagnostic, f.kind, f.subject))


# -- storing -------------------------------------------------------------------------------------

_STORED = """
SELECT finding_id, min(first_seen) AS first_seen
FROM findings
WHERE has({ids:Array(String)}, finding_id)
GROUP BY finding_id
"""

# findings an earlier run of this diagnostic raised over this same scope, still above info
_OPEN = """
SELECT finding_id, argMax(kind, last_seen) AS kind, argMax(severity, last_seen) AS severity,
       argMax(subject, last_seen) AS subject, argMax(summary, last_seen) AS summary,
       argMax(evidence_json, last_seen) AS evidence_json, min(first_seen) AS first_seen
FROM findings
WHERE diagnostic = {diagnostic:String}
GROUP BY finding_id
HAVING severity != 'info' AND JSONExtractString(evidence_json, 'scope_key') = {scope_key:String}
"""


def _epoch(ts) -> float:
    return ts.timestamp() if hasattr(ts, "timestamp") else float(ts)


def stored_first_seen(store, ids: list[str]) -> dict[str, float]:
    if not ids:
        return {}
    rows = store.query_arrow(_STORED, {"ids": ids}).to_pylist()
    return {r["finding_id"]: _epoch(r["first_seen"]) for r in rows}


def resolved(store, diagnostic: str, scope: Scope, current: list[Finding]) -> list[Finding]:
    """Earlier findings of `diagnostic` over `scope` (above info) that `current` no longer contains."""
    seen = {f.finding_id for f in current}
    out = []
    for row in store.query_arrow(_OPEN, {"diagnostic": diagnostic, "scope_key": scope.key()}).to_pylist():
        if row["finding_id"] in seen:
            continue
        evidence = json.loads(row["evidence_json"] or "{}")
        evidence.pop("scope", None)
        evidence.pop("scope_key", None)
        out.append(Finding("resolved", "info", row["subject"], f"resolved: {row['summary']}", diagnostic, scope,
                           {"status": "resolved", "was": {"kind": row["kind"], "severity": row["severity"],
                                                          "evidence": evidence}},
                           fixed_id=row["finding_id"]))
    return out


def write_findings(store, findings: list[Finding], now: float | None = None) -> int:
    """Insert (or update) findings; returns the rows written."""
    if not findings:
        return 0
    now = time.time() if now is None else now
    unique = {f.finding_id: f for f in findings}  # the last one for an id wins
    first = stored_first_seen(store, list(unique))
    records = [f.to_record(now, first.get(fid)) for fid, f in unique.items()]
    return store.insert_records("findings", records)


# -- printing ------------------------------------------------------------------------------------

def format_table(findings: list[Finding], width: int | None = None) -> str:
    """Findings worst first, one row each. Summaries are never cut: with `width` (a terminal's columns)
    a long one wraps onto continuation lines under the SUMMARY column (at least 40 characters wide, so a
    narrow terminal still reads); without, each stays on its row (for pipes, files, `--wide`)."""
    import textwrap

    if not findings:
        return "no findings"
    rows = [("SEVERITY", "DIAGNOSTIC", "KIND", "SUBJECT", "SUMMARY")]
    rows += [(f.severity, f.diagnostic, f.kind, f.subject, f.summary) for f in worst_first(findings)]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        head = "  ".join(c.ljust(w) for c, w in zip(r[:4], widths))
        if width is None:
            lines.append(f"{head}  {r[4]}")
            continue
        room = max(40, width - len(head) - 2)
        wrapped = textwrap.wrap(r[4], room, break_long_words=True, break_on_hyphens=False) or [""]
        lines.append(f"{head}  {wrapped[0]}")
        lines += [" " * (len(head) + 2) + more for more in wrapped[1:]]
    return "\n".join(lines)
