"""Compare: two replicas, versions or configs side by side, with the regression diagnostic's verdict."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import data, queries, regression_verdict, widgets

DIMENSIONS = {"replica": "replica_id", "engine version": "engine_version", "config": "config_hash",
              "quantization": "quantization", "speculative mode": "speculative_mode"}

st.title("Compare")
window = widgets.window()
groups = data.query(queries.REPLICA_GROUPS)
if window is None or groups.empty:
    widgets.no_data("requests")
    st.stop()

dimension = st.radio("Compare by", list(DIMENSIONS), horizontal=True, key="cmp_dimension")
column = DIMENSIONS[dimension]
values = sorted(groups[column].astype(str).unique())
if len(values) < 2:
    st.info(f"Only one {dimension} in the store ({values[0] if values else '-'}): nothing to compare.")
    st.stop()
c1, c2 = st.columns(2)
a = c1.selectbox("A (baseline)", values, index=0, key="cmp_a")
b = c2.selectbox("B (candidate)", values, index=1, key="cmp_b")
if a == b:
    st.warning("A and B are the same.")
    st.stop()
a_ids = groups.loc[groups[column].astype(str) == a, "replica_id"].tolist()
b_ids = groups.loc[groups[column].astype(str) == b, "replica_id"].tolist()
c1.caption("replicas: " + ", ".join(a_ids))
c2.caption("replicas: " + ", ".join(b_ids))

st.subheader("Identity")
identity = groups[groups["replica_id"].isin(a_ids + b_ids)].copy()
identity.insert(0, "side", identity["replica_id"].map(lambda r: "A" if r in a_ids else "B"))
widgets.table(identity, key="cmp_identity")

st.subheader(f"Latency ({window.label})")
summary = data.query(queries.COMPARE_SUMMARY, **window.params, a=a_ids, b=b_ids)
if summary.empty:
    widgets.no_data("requests")
else:
    for col in ("ttft", "itl", "e2e", "queue"):
        summary = widgets.expand_quantiles(summary, col)
    table = summary.set_index("side").T
    if {"A", "B"} <= set(table.columns):
        table["B / A"] = (table["B"].astype(float) / table["A"].astype(float).where(table["A"] != 0)).round(3)
    widgets.table(widgets.rounded(table.astype(float), 4), key="cmp_summary", hide_index=False)
    st.caption("itl: per gap between consecutive output tokens. The regression verdict below compares each "
               "request's mean ITL instead: the request is its unit of resampling.")

curves = data.query(queries.COMPARE_TTFT_CURVE, **window.params, a=a_ids, b=b_ids)
if not curves.empty:
    fig = go.Figure()
    for _, row in curves.iterrows():
        fig.add_trace(go.Scatter(x=[q / 100 for q in range(1, 100)], y=list(row["q"]), mode="lines",
                                 name=f"{row['side']}: {a if row['side'] == 'A' else b}"))
    fig.update_layout(xaxis_title="quantile", yaxis_title="TTFT (s)", height=350)
    st.plotly_chart(fig, key="cmp_ttft_curve")

st.subheader("Regression verdict")
verdict = regression_verdict.cached(column, a, b, tuple(a_ids), tuple(b_ids), window.start, window.end)
if verdict.available:
    (st.error if verdict.regressed else st.success)(verdict.headline)
    if verdict.table is not None:
        widgets.table(pd.DataFrame(verdict.table), key="cmp_verdict")
    if verdict.details:
        with st.expander("Evidence"):
            st.json(verdict.details)
else:
    st.info(verdict.headline)
widgets.query_timings()
