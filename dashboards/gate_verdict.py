"""The Evals page's bridge to the eval gate (`evals.gate`), imported lazily.

Without it the page still shows both runs' scores and the per-item drift, with a note
instead of the gate's pass / fail.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass
class GateVerdict:
    available: bool
    headline: str
    passed: bool = True
    details: dict = field(default_factory=dict)


def run(store, *, baseline_run: str, candidate_run: str) -> GateVerdict:
    try:
        module = importlib.import_module("evals.gate")
    except ModuleNotFoundError as e:
        if e.name not in ("evals.gate", "evals"):
            raise
        return GateVerdict(False, "The eval gate (evals/gate.py) is not part of this build: "
                                  "no pass / fail verdict, the drift below is descriptive only.")
    evaluate = getattr(module, "gate_runs", None)
    if evaluate is None:
        return GateVerdict(False, "evals.gate has no `gate_runs`: no verdict shown.")
    try:
        result = evaluate(store, baseline_run=baseline_run, candidate_run=candidate_run)
    except Exception as e:  # the page keeps working when the gate cannot decide
        return GateVerdict(False, f"The eval gate failed: {e}")
    return GateVerdict(True, getattr(result, "summary", str(result)), passed=bool(getattr(result, "passed", True)),
                       details=getattr(result, "evidence", {}) or {})
