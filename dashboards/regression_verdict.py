"""The Compare page's bridge to the regression diagnostic (`diagnostics.regression.compare_groups`).

A diagnostic failure becomes a note on the page instead of a verdict: the side-by-side numbers
still show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import streamlit as st

from diagnostics.regression import compare_groups


@dataclass
class Verdict:
    available: bool
    headline: str
    regressed: bool = False
    table: list[dict] | None = None
    details: dict = field(default_factory=dict)


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
    try:
        result = compare_groups(store, baseline_replicas=baseline_replicas,
                                candidate_replicas=candidate_replicas, start=start, end=end)
    except Exception as e:  # a diagnostic failure must not take the page down
        return Verdict(False, f"The regression diagnostic failed: {e}")
    # plain data only (the verdict is cached): the table's rows and the evidence as JSON-able values
    return Verdict(True, getattr(result, "summary", str(result)),
                   regressed=bool(getattr(result, "regressed", False)),
                   table=[dict(row) for row in (getattr(result, "table", None) or [])] or None,
                   details=json.loads(json.dumps(getattr(result, "evidence", {}) or {}, default=str)))
