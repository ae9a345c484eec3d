"""Findings: what the diagnostics concluded, each drawn by the view of its kind (dashboards.finding_views).

`?finding=<id>` in the URL opens that finding (links from alerts and reports)."""

from __future__ import annotations

import re

import streamlit as st

from dashboards import data, finding_views, queries, widgets

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
    col.metric(severity, int(counts.get(severity, 0)))
widgets.table(found, key="fd_table", column_config={"summary": st.column_config.TextColumn(width="large")})

by_id = found.set_index("finding_id")
labels = {f: f"{r.severity.upper()} · {r.kind}: {r.summary}" for f, r in by_id.iterrows()}
wanted = st.query_params.get("finding")
index = list(labels).index(wanted) if wanted in labels else 0
finding_id = st.selectbox("Finding", list(labels), index=index, key="fd_selected", format_func=labels.get)
row = by_id.loc[finding_id]
# a one-line heading (what and where); the summary, often a long sentence with its numbers, below it
st.subheader(finding_views.title(row["kind"], row["subject"]))
st.markdown(row["summary"])
st.markdown(f"{finding_views.severity_badge(row['severity'])} kind `{row['kind']}` · subject `{row['subject']}` · "
            f"diagnostic `{row['diagnostic'] or '-'}`")
st.caption(f"window {row['window_start']} to {row['window_end']} · first seen {row['first_seen_at']} · "
           f"last seen {row['last_seen_at']}")
evidence_raw = data.query(queries.FINDING_EVIDENCE, finding_id=finding_id).loc[0, "evidence_json"]
evidence = finding_views.raw_json(evidence_raw)
if not evidence:
    st.caption("This finding carries no evidence.")
    if (evidence_raw or "").strip() not in ("", "{}"):
        with st.expander("Stored evidence (not JSON)"):
            st.code(evidence_raw, language=None)
else:
    finding_views.render(row["kind"], evidence, row, key="fd_" + re.sub(r"\W", "_", finding_id))
widgets.query_timings()
