"""Requests: search and filter; one request's tokens beside their strings, timing, and steps."""

from __future__ import annotations

import json

import streamlit as st

from dashboards import charts, data, queries, widgets
from dashboards.tokens import token_frame, visible

st.title("Requests")
window = widgets.window_or_stop()

options = data.query(queries.WORKLOADS_AND_REASONS, **window.params)
workloads = sorted(options.loc[0, "workloads"]) if not options.empty else []
reasons = sorted(options.loc[0, "reasons"]) if not options.empty else []

with st.form("request_filters"):
    c1, c2, c3 = st.columns(3)
    replicas = c1.multiselect("Replicas (none = all)", widgets.replica_ids(), key="rq_replicas")
    chosen_workloads = c2.multiselect("Workloads", workloads, key="rq_workloads")
    chosen_reasons = c3.multiselect("Finish reasons", reasons, key="rq_reasons")
    c4, c5, c6, c7 = st.columns(4)
    min_ttft = c4.number_input("Min TTFT (s)", min_value=0.0, value=0.0, step=0.1, key="rq_min_ttft")
    min_e2e = c5.number_input("Min end-to-end (s)", min_value=0.0, value=0.0, step=0.1, key="rq_min_e2e")
    order = c6.selectbox("Sort", list(queries.SEARCH_REQUESTS), key="rq_order")
    limit = c7.number_input("Rows", min_value=10, max_value=5000, value=200, step=50, key="rq_limit")
    search = st.text_input("Request ID prefix or trace ID", key="rq_search").strip()
    st.form_submit_button("Search")

found = data.query(queries.SEARCH_REQUESTS[order], **window.params, replicas=replicas,
                   workloads=chosen_workloads, reasons=chosen_reasons, min_ttft=float(min_ttft),
                   min_e2e=float(min_e2e), search=search, limit=int(limit))
st.caption(f"{len(found)} requests ({order})")
widgets.table(widgets.rounded(found, 4), key="rq_results")
if found.empty:
    widgets.query_timings()
    st.stop()

st.divider()
request_id = st.selectbox("Request", found["request_id"].tolist(), key="rq_selected")
detail = data.query(queries.REQUEST_DETAIL, request_id=request_id)
if detail.empty:
    st.warning(f"request {request_id!r} not found")
    st.stop()
r = detail.iloc[0]
st.subheader(f"Request `{r['request_id']}` on {r['replica_id']}")
cols = st.columns(6)
cols[0].metric("TTFT", widgets.seconds(r["ttft_seconds"]))
cols[1].metric("End-to-end", f"{r['e2e_seconds']:.3f} s")
cols[2].metric("Queue", widgets.seconds(r["queue_seconds"]))
cols[3].metric("Prompt tokens", int(r["prompt_tokens"]), help=f"{int(r['cached_tokens'])} from the prefix cache")
cols[4].metric("Output tokens", int(r["output_tokens"]))
# a refused request (telemetry/contract/outcomes.py): its status and error code say how it ended
cols[5].metric("Finish", r["error_code"] or r["finish_reason"], help=(f"HTTP {int(r['http_status'])}: "
               if r["http_status"] else "") + (r["error"] or "") or None)
st.caption(f"workload `{r['workload'] or '-'}` · trace `{r['trace_id'] or '-'}` · preemptions "
           f"{int(r['preemptions'])} · speculative {int(r['spec_accepted'])}/{int(r['spec_proposed'])} accepted · "
           f"arrived {r['arrival_time']}")
engine = data.query(queries.ENGINE_TIMING, request_id=request_id)
if not engine.empty:  # a proxy wrote the row; the engine behind it (vLLM's plugin) its own timing
    e = engine.iloc[0]
    st.markdown(f"**As the engine measured it** (engine request `{e['engine_request_id']}`)")
    cols = st.columns(5)
    cols[0].metric("Engine queue", f"{e['queue_seconds']:.3f} s")
    cols[1].metric("Engine prefill", f"{e['prefill_seconds']:.3f} s")
    cols[2].metric("Engine TTFT", f"{e['ttft_seconds']:.3f} s",
                   help=f"{widgets.seconds(e['before_engine_seconds'])} of the TTFT above passed before the engine got it")
    cols[3].metric("Engine end-to-end", f"{e['e2e_seconds']:.3f} s")
    cols[4].metric("Cached prompt tokens", int(e["cached_tokens"]), help=f"{int(e['preemptions'])} preemptions")
with st.expander("Sampling parameters"):
    try:
        st.json(json.loads(r["sampling_params_json"] or "{}"))
    except json.JSONDecodeError:
        st.code(r["sampling_params_json"])

model = r["model_name"]
decoder, why_not = widgets.replica_decoder(r["replica_id"], model, widgets.epoch(r["arrival_time"]))
if decoder is None:
    st.info(f"No tokenizer for replica `{r['replica_id']}` (model `{model}`): {why_not}; showing token IDs "
            "only; point the dashboard at the tokenizer with --model DIR or --tokenizer MODEL=DIR.")


def token_panel(title: str, side: str, token_times=None):
    """The decoded text (or the stored text, without a tokenizer) above one row per token."""
    st.markdown(f"**{title}**")
    if decoder is not None:
        st.code(visible(decoder.decode(r[f"{side}_token_ids"], skip_special_tokens=False)), language=None)
    elif r[f"{side}_text"]:
        st.code(visible(r[f"{side}_text"]), language=None)
    frame = token_frame(r[f"{side}_token_ids"], decoder, token_times)
    widgets.table(frame, key=f"rq_{side}_tokens")
    return frame


left, right = st.columns(2)
with left:
    token_panel("Prompt", "prompt")
with right:
    tokens = token_panel("Output", "output", r["token_times"])

if "gap (ms)" in tokens and len(tokens) > 1:
    st.markdown("**Per-token timing**")
    st.plotly_chart(charts.bars(tokens, "position", "gap (ms)", x_title="output token",
                                title="Gap before each output token"), key="rq_token_timing")

st.markdown("**Steps it took part in** (its replica's steps that started during its lifetime)")
steps = data.query(queries.REQUEST_STEPS, request_id=request_id)
if steps.empty:
    widgets.no_data("steps")
else:
    widgets.table(widgets.rounded(steps, 6), key="rq_steps")
widgets.query_timings()
