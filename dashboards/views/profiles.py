"""Profiles: py-spy samples of a replica as a flame graph (folded stacks), and where time goes by group."""

from __future__ import annotations

import streamlit as st

from dashboards import charts, data, flamegraph, queries, widgets

st.title("Profiles")
selected = widgets.pick_replicas("pf_replicas")
profiles = data.query(queries.PROFILES, replicas=selected)
if profiles.empty:
    widgets.no_data("profiles")
    st.info("Record one with `infersight profile --replica URL --seconds 10`.")
    st.stop()
widgets.table(widgets.rounded(profiles, 3), key="pf_list")
labels = {r.profile_id: f"{r.profile_id} ({r.replica_id}, {int(r.samples)} samples)" for r in profiles.itertuples()}
profile_id = st.selectbox("Profile", list(labels), key="pf_selected", format_func=labels.get)

groups = data.query(queries.PROFILE_GROUPS, profile_id=profile_id)
if not groups.empty:
    groups["share"] = (groups["samples"] / groups["samples"].sum()).round(4)
    st.plotly_chart(charts.shares(groups["group"], groups["share"],
                                  title="Samples by group (scheduler, forward, sampling, telemetry ...)"),
                    key="pf_groups")
stacks = data.query(queries.PROFILE_STACKS, profile_id=profile_id)
st.subheader("Flame graph")
st.caption(f"{len(stacks)} distinct stacks, {int(stacks['samples'].sum()):,} samples; click a frame to zoom.")
st.plotly_chart(flamegraph.figure(zip(stacks["stack"], stacks["samples"])), key="pf_flame")
with st.expander("Hottest stacks"):
    widgets.table(stacks.head(50), key="pf_stacks")
widgets.query_timings()
