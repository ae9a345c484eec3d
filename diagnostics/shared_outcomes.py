"""A check's outcome that every replica of a model shares is the model's (its tokenizer, its template),
not a replica fault: one fleet-level info on the model instead of a warning on each replica.

The tokenizer diagnostic's property checks (a Unicode corpus that does not round-trip, a double BOS
that only the prober's own special-token probe produces) give the same outcome on every replica that
loads the same tokenizer files: a real SentencePiece tokenizer fails some round trips by design. A
warning on each of them blames every healthy replica for the product they all serve. So, per model
and kind, the findings are compared by a signature (the outcome itself: the failing corpus strings,
"probes only"); where one signature is held by every replica checked, or by a strict majority of them,
those replicas' findings fold into one info (`<kind>_fleet_wide`, subject `model=<name>`), and a
replica whose outcome differs (another signature, or none where the others have one) keeps its own.
A finding whose signature is None (e.g. a double BOS in client traffic) is never folded.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from diagnostics.findings import Finding

FLEET_SUFFIX = "_fleet_wide"


def fold(findings: list[Finding], checked: dict[str, list[str]],
         signatures: dict[str, Callable[[Finding], object]]) -> list[Finding]:
    """`checked`: model -> the replicas each check ran on; `signatures`: kind -> its outcome's signature
    (None: never folded). Findings of other kinds pass through."""
    model_of = {rid: model for model, rids in checked.items() for rid in rids}
    by_key: dict[tuple[str, str], list[Finding]] = {}
    out = []
    for f in findings:
        if f.kind in signatures and f.subject in model_of:
            by_key.setdefault((f.kind, model_of[f.subject]), []).append(f)
        else:
            out.append(f)
    for (kind, model), group in sorted(by_key.items()):
        signed = {f.subject: signatures[kind](f) for f in group}
        counts = Counter(s for s in signed.values() if s is not None)
        common, held = counts.most_common(1)[0] if counts else (None, 0)
        replicas = checked[model]
        if common is None or not (held == len(replicas) or held > len(replicas) / 2):
            out += group
            continue
        shared = sorted(r for r, s in signed.items() if s == common)
        out += [f for f in group if f.subject not in shared]
        out.append(_fleet_finding(kind, model, [f for f in group if f.subject in shared], replicas))
    return out


def _fleet_finding(kind: str, model: str, shared: list[Finding], replicas: list[str]) -> Finding:
    first = shared[0]
    every = len(shared) == len(replicas)
    who = (f"every replica of {model} ({', '.join(sorted(f.subject for f in shared))})" if every else
           f"{len(shared)} of the {len(replicas)} replicas of {model} "
           f"({', '.join(sorted(f.subject for f in shared))})")
    summary = (f"{who} share this outcome, so it is the model's (its tokenizer or template), not a replica "
               f"fault: " + first.summary.split(": ", 1)[-1])
    evidence = {"model_name": model, "kind": kind, "replicas": sorted(f.subject for f in shared),
                "replicas_checked": sorted(replicas), "every_replica": every,
                "per_replica": {f.subject: f.evidence for f in shared},
                "rule": "the same outcome on every replica checked, or on a strict majority of them: one "
                        "fleet-level info on the model; replicas whose outcome differs keep their own finding"}
    return Finding(kind + FLEET_SUFFIX, "info", f"model={model}", summary, first.diagnostic, first.scope, evidence)
