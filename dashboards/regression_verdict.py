"""The Compare page's bridge to the regression diagnostic (`diagnostics.regression`).

The diagnostic is imported lazily: a build without it still shows the side-by-side
numbers, with a clear note instead of a verdict.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field

import streamlit as st


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


@st.cache_data(ttl=300, show_spinner="Running the regression diagnostic ...")
def cached(dimension: str, baseline: str, candidate: str, baseline_replicas: tuple[str, ...],
           candidate_replicas: tuple[str, ...], start: float, end: float) -> Verdict:
    """The verdict on the dashboard's store, cached: the data of a past window does not change."""
    from dashboards import data

    return run(data.store(), dimension=dimension, baseline=baseline, candidate=candidate,
               baseline_replicas=list(baseline_replicas), candidate_replicas=list(candidate_replicas),
               start=start, end=end)


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
    # plain data only (the verdict is cached): the table's rows and the evidence as JSON-able values
    return Verdict(True, getattr(result, "summary", str(result)),
                   regressed=bool(getattr(result, "regressed", False)),
                   table=[dict(row) for row in (getattr(result, "table", None) or [])] or None,
                   details=json.loads(json.dumps(getattr(result, "evidence", {}) or {}, default=str)))
