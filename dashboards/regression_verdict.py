"""The Compare page's bridge to the regression diagnostic (`diagnostics.regression`).

The diagnostic is imported lazily: a build without it still shows the side-by-side
numbers, with a clear note instead of a verdict.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass
class Verdict:
    available: bool
    headline: str
    regressed: bool = False
    table: list[dict] | None = None
    details: dict = field(default_factory=dict)


def _module():
    try:
        return importlib.import_module("diagnostics.regression")
    except ModuleNotFoundError as e:
        if e.name not in ("diagnostics.regression", "diagnostics"):
            raise
        return None


def run(store, *, dimension: str, baseline: str, candidate: str, baseline_replicas: list[str],
        candidate_replicas: list[str], start: float, end: float) -> Verdict:
    module = _module()
    if module is None:
        return Verdict(False, "The regression diagnostic (diagnostics/regression.py) is not part of this "
                              "build: the numbers above are descriptive only, without a statistical verdict.")
    compare = getattr(module, "compare_groups", None)
    if compare is None:
        return Verdict(False, "diagnostics.regression has no `compare_groups`: no verdict shown.")
    try:
        result = compare(store, baseline_replicas=baseline_replicas, candidate_replicas=candidate_replicas,
                         start=start, end=end)
    except Exception as e:  # a diagnostic failure must not take the page down
        return Verdict(False, f"The regression diagnostic failed: {e}")
    return Verdict(True, getattr(result, "summary", str(result)),
                   regressed=bool(getattr(result, "regressed", False)),
                   table=getattr(result, "table", None), details=getattr(result, "evidence", {}) or {})
