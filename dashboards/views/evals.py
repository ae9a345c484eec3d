"""Evals: runs, the gate's verdict for a candidate against a baseline, per-item drift with a token diff."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, data, gate_verdict, queries, widgets
from dashboards.tokendiff import diff_html
from dashboards.tokens import visible
from evals.stats import first_divergence, wilson_interval

st.title("Evals")
runs = data.query(queries.EVAL_RUNS)
if runs.empty:
    widgets.no_data("eval runs")
    st.info("Run one with `infersight eval run ...`.")
    st.stop()
widgets.table(widgets.rounded(runs, 4), key="ev_runs")

suites = sorted(runs["suite"].unique())
suite = st.selectbox("Suite", suites, key="ev_suite")
in_suite = runs[runs["suite"] == suite]
labels = {r.run_id: f"{r.run_id} · {r.model_name} · {r.quantization} · {r.speculative_mode} · acc {r.accuracy:.3f}"
          for r in in_suite.itertuples()}
ids = in_suite["run_id"].tolist()
if len(ids) < 2:
    # one run: what it measured, per task with 95% Wilson intervals; comparing needs a second run
    only = ids[0]
    st.subheader(f"Accuracy by task: {labels[only]}")
    tasks = data.query(queries.EVAL_TASK_ACCURACY, base=only, candidate=only)
    if not tasks.empty:
        bounds = [wilson_interval(round(a * n), int(n)) for a, n in zip(tasks["accuracy"], tasks["items"])]
        tasks["ci_low"], tasks["ci_high"] = [b[0] for b in bounds], [b[1] for b in bounds]
        st.plotly_chart(charts.intervals(tasks["task"], tasks["accuracy"], tasks["ci_low"], tasks["ci_high"],
                                         title="Accuracy by task (95% Wilson interval)", x_title="accuracy"),
                        key="ev_single_tasks")
        widgets.table(widgets.rounded(tasks.drop(columns=["run_id"]), 4), key="ev_single_table")
    st.info("One run of this suite: a second run (another config) is needed to compare.")
    st.stop()
c1, c2 = st.columns(2)
# runs are newest first: the older run is the natural baseline
base = c1.selectbox("Baseline run", ids, index=1, key="ev_base", format_func=labels.get)
candidate = c2.selectbox("Candidate run", ids, index=0, key="ev_candidate", format_func=labels.get)
if base == candidate:
    st.warning("Baseline and candidate are the same run.")
    st.stop()

acc = in_suite.set_index("run_id")["accuracy"]
cols = st.columns(3)
cols[0].metric("Baseline accuracy", f"{acc[base]:.3f}")
cols[1].metric("Candidate accuracy", f"{acc[candidate]:.3f}", delta=f"{acc[candidate] - acc[base]:+.3f}")

verdict = gate_verdict.cached(base, candidate)
if verdict.available:
    cols[2].metric("Gate", "pass" if verdict.passed else "FAIL")
    (st.success if verdict.passed else st.error)(f"Gate {verdict.headline}")
    widgets.table(pd.DataFrame(verdict.checks), key="ev_gate_checks")
    for note in verdict.notes:
        st.caption(note)
else:
    cols[2].metric("Gate", "n/a")
    st.info(verdict.headline)

tasks = data.query(queries.EVAL_TASK_ACCURACY, base=base, candidate=candidate)
if not tasks.empty:
    tasks["run"] = tasks["run_id"].map({base: "baseline", candidate: "candidate"})
    st.plotly_chart(charts.bars(tasks, "task", "accuracy", color="run", x_title="task", barmode="group", height=300,
                                title="Accuracy by task"), key="ev_tasks")

st.subheader("Per-item drift")
drift = data.query(queries.EVAL_ITEM_DRIFT, base=base, candidate=candidate)
changed = drift[(drift["delta"] != 0) | drift["output_changed"].astype(bool)]
st.caption(f"{len(changed)} of {len(drift)} items changed score or output")
only_changed = st.toggle("Only changed items", value=True, key="ev_only_changed")
shown = changed if only_changed and not changed.empty else drift
widgets.table(shown, key="ev_drift")
if shown.empty:
    st.stop()

item_id = st.selectbox("Item", shown["item_id"].tolist(), key="ev_item")
pair = data.query(queries.EVAL_ITEM_PAIR, base=base, candidate=candidate, item_id=item_id).set_index("run_id")
if base not in pair.index or candidate not in pair.index:
    st.warning("This item is missing from one of the runs.")
    st.stop()
b, c = pair.loc[base], pair.loc[candidate]
model = in_suite.set_index("run_id").loc[base, "model_name"]
decoder = widgets.decoder_for(model)
st.markdown(f"**Reference**: `{visible(b['reference'])}` · scores: baseline {b['score']} → candidate {c['score']}")
a_ids, c_ids = [int(x) for x in b["output_token_ids"]], [int(x) for x in c["output_token_ids"]]
where = first_divergence(a_ids, c_ids)
st.markdown("Outputs are identical." if where is None else
            f"Outputs first diverge at output token **{where}**: baseline id "
            f"`{a_ids[where] if where < len(a_ids) else 'end'}`, candidate id "
            f"`{c_ids[where] if where < len(c_ids) else 'end'}`.")
st.markdown("**Token-level diff** (red: baseline only, green: candidate only)")
st.markdown(f'<div data-testid="token-diff">{diff_html(a_ids, c_ids, decoder)}</div>', unsafe_allow_html=True)
left, right = st.columns(2)
left.markdown("Baseline output")
left.code(visible(b["output_text"]), language=None)
right.markdown("Candidate output")
right.code(visible(c["output_text"]), language=None)
widgets.query_timings()
