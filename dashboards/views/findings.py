"""Findings: what the diagnostics concluded, with their evidence (numbers, tests, token IDs)."""

from __future__ import annotations

import json

import streamlit as st

from dashboards import data, queries, widgets
from dashboards.tokens import token_frame, visible

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}

st.title("Findings")
kinds = data.query(queries.FINDING_KINDS)
all_kinds = sorted(kinds.loc[0, "kinds"]) if not kinds.empty else []
all_severities = sorted(kinds.loc[0, "severities"]) if not kinds.empty else []
c1, c2 = st.columns(2)
chosen_kinds = c1.multiselect("Kinds (none = all)", all_kinds, key="fd_kinds")
chosen_severities = c2.multiselect("Severities (none = all)", all_severities, key="fd_severities")
found = data.query(queries.FINDINGS, kinds=chosen_kinds, severities=chosen_severities)
if found.empty:
    widgets.no_data("findings")
    st.stop()
counts = found["severity"].value_counts()
cols = st.columns(3)
for col, severity in zip(cols, ("critical", "warning", "info")):
    col.metric(f"{SEVERITY_ICON[severity]} {severity}", int(counts.get(severity, 0)))
st.dataframe(found, hide_index=True, key="fd_table")

by_id = found.set_index("finding_id")
labels = {f: f"{r.kind}: {r.summary}" for f, r in by_id.iterrows()}
finding_id = st.selectbox("Finding", list(labels), key="fd_selected", format_func=labels.get)
row = by_id.loc[finding_id]
st.subheader(f"{SEVERITY_ICON.get(row['severity'], '')} {row['summary']}")
st.caption(f"kind `{row['kind']}` · subject `{row['subject']}` · diagnostic `{row['diagnostic'] or '-'}` · "
           f"window {row['window_start']} → {row['window_end']} · first seen {row['first_seen_at']} · "
           f"last seen {row['last_seen_at']}")
evidence_raw = data.query(queries.FINDING_EVIDENCE, finding_id=finding_id).loc[0, "evidence_json"]
try:
    evidence = json.loads(evidence_raw or "{}")
except json.JSONDecodeError:
    st.code(evidence_raw)
    evidence = {}


def token_lists(obj, path=""):
    """(path, ids) for every list of ints in the evidence whose key says it holds token IDs."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from token_lists(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        if obj and all(isinstance(x, int) for x in obj) and ("token" in path or "ids" in path):
            yield path, obj
        else:
            for i, v in enumerate(obj):
                yield from token_lists(v, f"{path}[{i}]")


if evidence:
    st.json(evidence, expanded=2)
    lists = list(token_lists(evidence))
    if lists:
        st.markdown("**Token IDs in the evidence**")
        model = evidence.get("model_name") or evidence.get("model") or ""
        decoder = widgets.decoder_for(model)
        for path, ids in lists:
            st.markdown(f"`{path}`")
            if decoder is not None:
                st.code(visible(decoder.decode(ids, skip_special_tokens=False)), language=None)
            st.dataframe(token_frame(ids, decoder).T, key=f"fd_tokens_{path}")
widgets.query_timings()
