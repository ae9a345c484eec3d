"""Fleet: every replica's identity and placement, its health, and its latency over time."""

from __future__ import annotations

import streamlit as st

from dashboards import charts, data, queries, widgets
from telemetry.contract.derived import QUANTILE_NAMES

st.title("Fleet")
window = widgets.window()
replicas = widgets.replicas_frame()

st.subheader("Replicas: identity and placement")
if replicas.empty:
    widgets.no_data("replicas")
else:
    view = replicas.copy()
    for col in ("cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes"):
        view[col] = view[col].map(lambda v: ",".join(str(x) for x in v))
    # hashes that differ between replicas of one model are config or tokenizer drift
    for col in ("config_hash", "tokenizer_hash", "chat_template_hash", "weights_hash"):
        view[f"{col} drift"] = view.groupby("model_name")[col].transform("nunique") > 1
    widgets.table(view.drop(columns=["labels_json"]), key="fleet_replicas")
    mismatched = view.loc[view["numa_mismatch"].astype(bool), "replica_id"].tolist()
    if mismatched:
        st.warning(f"NUMA mismatch (CPUs, memory or GPU on different nodes): {', '.join(mismatched)}")

if window is None:
    widgets.no_data("requests")
    st.stop()

selected = widgets.pick_replicas("fleet_replicas_filter")
params = {**window.params, "replicas": selected}

st.subheader(f"Health ({window.label})")
health = data.query(queries.REPLICA_HEALTH, **params)
if health.empty:
    widgets.no_data("requests")
else:
    for col in ("ttft", "itl", "e2e"):
        health = widgets.expand_quantiles(health, col)
    findings = data.query(queries.OPEN_FINDINGS_BY_SUBJECT)
    open_findings = dict(zip(findings["subject"], findings["findings"])) if not findings.empty else {}
    health["findings"] = health["replica_id"].map(lambda r: int(open_findings.get(r, 0)))
    # availability: the share of each outcome (every request received is a row, refused ones too)
    for outcome in ("answered", "rejected", "shed", "failed"):
        health[f"{outcome} %"] = (100 * health[outcome] / health["requests"]).round(2)
    health.insert(1, "worst finding", health["replica_id"].map(widgets.worst_severity(findings, health["replica_id"])))
    health["idle for (s)"] = (window.end - health["last_finish"].map(widgets.epoch)).clip(lower=0).round(1)
    cols = st.columns(4)
    cols[0].metric("Replicas", len(replicas))
    cols[1].metric("Requests", f"{int(health['requests'].sum()):,}")
    worst = health.sort_values("ttft_p99", ascending=False).iloc[0]
    cols[2].metric("Worst TTFT p99", f"{worst['ttft_p99']:.3f} s", help=f"replica {worst['replica_id']}")
    unanswered = int(health["requests"].sum() - health["answered"].sum())
    cols[3].metric("Not answered", f"{unanswered:,}", help="rejected, shed, failed, timed out or aborted; "
                   "`infersight diagnose availability` compares the replicas' rates like for like")
    widgets.mark_replicas_with_findings(health)
    widgets.table(widgets.rounded(health, 4), key="fleet_health")
    st.caption("itl: per gap between consecutive output tokens of the window's requests (as Prometheus' "
               "inter-token-latency histogram counts them); ttft over requests that produced a token; e2e over "
               "those the engine had. answered / rejected (400, 401, 409, 413) / shed (429, 503) / failed (5xx, "
               "engine errors): shares of every request the replica received.")

st.subheader("Latency percentiles per replica over time")
series = data.query(queries.LATENCY_OVER_TIME, **params, bucket_ms=window.bucket_ms)
if series.empty:
    widgets.no_data("requests")
else:
    for col in ("ttft", "itl", "e2e"):
        series = widgets.expand_quantiles(series, col)
    # ITL per gap between consecutive output tokens: Grafana's and the demo report's ITL quantiles too
    columns = {"TTFT": "ttft", "ITL (per token gap)": "itl", "end-to-end": "e2e"}
    metric = st.radio("Latency", list(columns), horizontal=True, key="fleet_metric")
    column = columns[metric]
    quantile = st.radio("Percentile", list(QUANTILE_NAMES), index=len(QUANTILE_NAMES) - 1, horizontal=True,
                        key="fleet_quantile")
    st.plotly_chart(charts.lines(series, "t", f"{column}_{quantile}", color="replica_id",
                                 y_title=f"{metric} {quantile} (s)", markers=len(series) < 60),
                    key="fleet_latency_chart")
    st.plotly_chart(charts.bars(series, "t", "requests", color="replica_id", title="Requests per bucket"),
                    key="fleet_requests_chart")

widgets.query_timings()
