"""What the fault matrix asks of a finding beyond naming the faulty replica: that it says the right key
with both values (`rope_theta 100000.0 vs 10000.0 in config.json`, `max_num_seqs went 16 → 2`) and cites
the right mechanism (diagnostics.mechanisms' name under evidence "mechanisms"), and how one case reads in
the confusion table.
"""

from __future__ import annotations

import json
import re

CHANGE_KIND = "identity_changed"  # an event in time: an info finding that names the change is a catch
# `KEY A vs B`, `KEY (where) went A → B`; a dotted prefix (rope_parameters.rope_theta) is the same key
_SAID = r"{key}(?: \([^)]*\))?(?: went)? (\S+?),? (?:vs|→) (\S+?)(?:[,;)]|\s|$)"

_PER_REPLICA = """
SELECT replica_id, count() AS n FROM requests
WHERE arrival_time >= toDateTime64({since:Float64}, 6, 'UTC')
GROUP BY replica_id ORDER BY n DESC LIMIT 1
"""


def _same(said: str, value) -> bool:
    said = said.strip("'\"")
    if isinstance(value, (list, dict)):
        try:
            return json.loads(said) == value
        except ValueError:
            return said == json.dumps(value)
    try:
        return float(said) == float(value)
    except (TypeError, ValueError):
        return said == str(value)


def said_with_values(text: str, key: str, one, other) -> bool:
    """Does `text` name `key` with both values (either order)?"""
    for m in re.finditer(_SAID.format(key=re.escape(key)), text):
        a, b = m.group(1), m.group(2)
        if (_same(a, one) and _same(b, other)) or (_same(a, other) and _same(b, one)):
            return True
    return False


def _on(finding, replica: str) -> bool:
    return replica in finding.subject.split(" vs ")


def key_named(findings: list, replica: str, key: str, one, other) -> bool:
    """A finding on `replica` (above info, or its identity change) says `key` with both values."""
    return any(said_with_values(f.summary, key, one, other) for f in findings
               if _on(f, replica) and (f.severity != "info" or f.kind == CHANGE_KIND))


def mechanism_cited(findings: list, replica: str, mechanism: str | tuple[str, ...]) -> bool | None:
    """A finding on `replica` that looked for causes (evidence "mechanisms") cites `mechanism` (or one of
    several: a cache too small shows as KV pressure before it preempts ten requests); None where no finding on
    it looked (nothing lagged: a difference in identity needs no mechanism)."""
    wanted = {mechanism} if isinstance(mechanism, str) else set(mechanism)
    looked = [f for f in findings if _on(f, replica) and f.severity != "info" and "mechanisms" in f.evidence]
    if not looked:
        return None
    return any(m.get("mechanism") in wanted for f in looked for m in f.evidence["mechanisms"])


def most_requests_per_replica(store, since: float) -> int:
    rows = store.query_arrow(_PER_REPLICA, {"since": since}).to_pylist()
    return int(rows[0]["n"]) if rows else 0


def cell(outcome, fault) -> str:
    """One case of the confusion table: the verdict, then the requests it took (and the most one replica got)."""
    if outcome.skipped:
        return "not run (no cgroup)"
    blamed = "false-blame: " + ", ".join(sorted({f"{k} on {s}" for k, s, _, _ in outcome.false_positives})) \
        if outcome.false_positives else ""
    traffic = f"{outcome.requests} req, ≤{outcome.per_replica}/replica"
    if fault is None or fault.clean:
        verdict = blamed or ("symmetric: " + ", ".join(sorted({k for k, *_ in outcome.symmetric}))
                             if outcome.symmetric else "quiet")
        return f"{verdict} ({traffic})"
    if outcome.caught_after is None:
        verdict = "symmetric" if outcome.symmetric else "missed"
    else:
        verdict = "caught"
        if outcome.key_named is not None:
            verdict += " +key" if outcome.key_named else " -key"
        if outcome.mechanism_cited is not None:
            verdict += " +mech" if outcome.mechanism_cited else " -mech"
        verdict += f" after {outcome.caught_after}"
    return verdict + (f"; {blamed}" if blamed else "") + f" ({traffic})"
