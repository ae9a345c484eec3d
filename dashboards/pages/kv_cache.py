"""KV cache: utilization, prefix hit rate, evictions and preemptions over time, per replica."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from dashboards import data, queries, widgets

st.title("KV cache")
window = widgets.window()
if window is None:
    widgets.no_data("requests")
    st.stop()
selected = widgets.pick_replicas("kv_replicas")
params = {**window.params, "replicas": selected}

summary = data.query(queries.KV_SUMMARY, **params)
if summary.empty:
    widgets.no_data("steps")
    st.stop()
st.subheader(f"Per replica ({window.label})")
st.dataframe(widgets.rounded(summary, 4), hide_index=True, key="kv_summary")

timeline = data.query(queries.KV_TIMELINE, **params, bucket_ms=window.bucket_ms)
timeline["prefix_hit_rate"] = timeline["prefix_hit_tokens"] / timeline["prefix_query_tokens"].where(
    timeline["prefix_query_tokens"] > 0)
labels = {"t": "time (UTC)"}
left, right = st.columns(2)
left.plotly_chart(px.line(timeline, x="t", y="utilization", color="replica_id", labels=labels,
                          title="Utilization (blocks used / total, mean per bucket)", range_y=[0, 1.05]),
                  key="kv_utilization")
right.plotly_chart(px.line(timeline, x="t", y="prefix_hit_rate", color="replica_id", labels=labels,
                           title="Prefix cache hit rate (tokens)", range_y=[0, 1.05]), key="kv_hit_rate")
left.plotly_chart(px.bar(timeline, x="t", y="evictions", color="replica_id", labels=labels,
                         title="Evictions (cached blocks reused)"), key="kv_evictions")
right.plotly_chart(px.bar(timeline, x="t", y="preemptions", color="replica_id", labels=labels,
                          title="Preemptions"), key="kv_preemptions")
widgets.query_timings()
