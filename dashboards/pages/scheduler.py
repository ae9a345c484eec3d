"""Scheduler: the step timeline of one replica: batch size, tokens, host against forward time, queues."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboards import data, queries, widgets

st.title("Scheduler")
window = widgets.window()
if window is None:
    widgets.no_data("requests")
    st.stop()
with_steps = data.query(queries.STEP_REPLICAS, **window.params)
replica = widgets.pick_replica("sched_replica", with_steps["replica_id"].tolist())
if replica is None:
    widgets.no_data("steps")
    st.stop()
params = {**window.params, "replica": replica}

split = data.query(queries.STEP_TIME_SPLIT, **params).iloc[0]
total = float(split["total"]) or 1.0
cols = st.columns(5)
cols[0].metric("Steps", f"{int(split['steps']):,}")
cols[1].metric("Host overhead", f"{1 - float(split['forward']) / total:.1%}",
               help="Share of step time outside the forward pass: the GPU waits on the host for this long.")
cols[2].metric("Prefill steps", f"{int(split['prefill_steps']):,}")
cols[3].metric("Decode steps", f"{int(split['decode_steps']):,}")
cols[4].metric("Mixed steps", f"{int(split['mixed_steps']):,}")
parts = pd.DataFrame({"part": ["schedule", "prepare", "forward", "sample", "postprocess", "telemetry"]})
parts["seconds"] = [float(split[p]) for p in parts["part"]]
parts["share"] = (parts["seconds"] / total).round(4)
st.plotly_chart(px.bar(parts, x="share", y="part", orientation="h", text="share", height=260,
                       labels={"share": "share of step time"}), key="sched_split")

timeline = data.query(queries.STEP_TIMELINE, **params, bucket_ms=window.bucket_ms)
if timeline.empty:
    widgets.no_data("steps")
    st.stop()
st.subheader("Step timeline")
times = timeline.melt(id_vars="t", value_vars=["forward_time", "host_time"], var_name="time", value_name="seconds")
st.plotly_chart(px.area(times, x="t", y="seconds", color="time", labels={"t": "time (UTC)"},
                        title="Host time against forward time"), key="sched_host_forward")
tokens = timeline.melt(id_vars="t", value_vars=["prefill_tokens", "decode_tokens"], var_name="tokens", value_name="count")
st.plotly_chart(px.bar(tokens, x="t", y="count", color="tokens", labels={"t": "time (UTC)"},
                       title="Tokens per bucket"), key="sched_tokens")
left, right = st.columns(2)
left.plotly_chart(px.line(timeline, x="t", y=["batch_size", "max_batch_size"], labels={"t": "time (UTC)"},
                          title="Batch size (sequences)"), key="sched_batch")
right.plotly_chart(px.line(timeline, x="t", y=["waiting", "running", "max_waiting"], labels={"t": "time (UTC)"},
                           title="Queue lengths"), key="sched_queues")

st.subheader("Latest steps")
st.dataframe(widgets.rounded(data.query(queries.RECENT_STEPS, **params), 6), hide_index=True, key="sched_recent")
widgets.query_timings()
