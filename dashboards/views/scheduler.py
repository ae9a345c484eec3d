"""Scheduler: the step timeline of one replica: batch size, tokens, host against forward time, queues."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, data, queries, widgets

st.title("Scheduler")
window = widgets.window_or_stop()
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
st.plotly_chart(charts.shares(parts["part"], parts["share"], title="Share of step time"), key="sched_split")

timeline = data.query(queries.STEP_TIMELINE, **params, bucket_ms=window.bucket_ms)
if timeline.empty:
    widgets.no_data("steps")
    st.stop()
st.subheader("Step timeline")
st.plotly_chart(charts.stacked_area(timeline, "t", ["forward_time", "host_time"], title="Host time against forward time",
                                   y_title="seconds per bucket"), key="sched_host_forward")
tokens = timeline.melt(id_vars="t", value_vars=["prefill_tokens", "decode_tokens"], var_name="tokens", value_name="count")
st.plotly_chart(charts.bars(tokens, "t", "count", color="tokens", title="Tokens per bucket"), key="sched_tokens")
left, right = st.columns(2)
left.plotly_chart(charts.lines(timeline, "t", ["batch_size", "max_batch_size"], title="Batch size (sequences)"),
                  key="sched_batch")
right.plotly_chart(charts.lines(timeline, "t", ["waiting", "running", "max_waiting"], title="Queue lengths"),
                   key="sched_queues")

st.subheader("Latest steps")
widgets.table(widgets.rounded(data.query(queries.RECENT_STEPS, **params), 6), key="sched_recent")
widgets.query_timings()
