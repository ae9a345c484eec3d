"""KV cache: utilization, prefix hit rate, evictions and preemptions over time, per replica."""

from __future__ import annotations

import streamlit as st

from dashboards import charts, data, queries, widgets

st.title("KV cache")
window = widgets.window_or_stop()
selected = widgets.pick_replicas("kv_replicas")
params = {**window.params, "replicas": selected}

summary = data.query(queries.KV_SUMMARY, **params)
if summary.empty:
    widgets.no_data("steps")
    st.stop()
st.subheader(f"Per replica ({window.label})")
widgets.table(widgets.rounded(summary, 4), key="kv_summary")

timeline = data.query(queries.KV_TIMELINE, **params, bucket_ms=window.bucket_ms)
timeline["prefix_hit_rate"] = timeline["prefix_hit_tokens"] / timeline["prefix_query_tokens"].where(
    timeline["prefix_query_tokens"] > 0)
left, right = st.columns(2)
left.plotly_chart(charts.lines(timeline, "t", "utilization", color="replica_id", y_range=[0, 1.05],
                               title="Utilization (blocks used / total, mean per bucket)"), key="kv_utilization")
right.plotly_chart(charts.lines(timeline, "t", "prefix_hit_rate", color="replica_id", y_range=[0, 1.05],
                                title="Prefix cache hit rate (tokens)"), key="kv_hit_rate")
left.plotly_chart(charts.bars(timeline, "t", "evictions", color="replica_id", title="Evictions (cached blocks reused)"),
                  key="kv_evictions")
right.plotly_chart(charts.bars(timeline, "t", "preemptions", color="replica_id", title="Preemptions"),
                   key="kv_preemptions")
widgets.query_timings()
