"""One view per family of finding kinds, so a person reads the evidence instead of a JSON tree.

`render(kind, evidence, row)` picks the view by `dashboards.evidence.family`:
- lagging (lagging_replica, slow_steps): the effect per metric with its interval (evidence numbers),
  the replica's latency distribution against its peers' from the store (the finding's window and
  replicas), and the identity fields it differs in;
- tokens (tokenizer / drift / probe / batch / chat template kinds): the two token sequences side by
  side, the first divergent position highlighted, and both decoded strings;
- regression (regression, improvement, change points): the series with the change point marked, or
  the strata's ratios with their intervals;
- anything else, including kinds added after this file: a table of the evidence's numbers.
Every view ends with how it was tested (the evidence's prose) and the raw JSON behind an expander.
"""

from __future__ import annotations

import html
import json

import pandas as pd
import streamlit as st

from dashboards import charts, data, queries, widgets
from dashboards import evidence as ev
from dashboards.tokens import visible
from engine.core.tokenization import Tokenizer

SEVERITY_COLOR = {"critical": "red", "warning": "orange", "info": "blue"}
LATENCY_METRICS = ("queue", "prefill", "ttft", "tpot", "itl", "e2e")


TITLE_CHARS = 80  # a heading that fits one line of the page


def title(kind: str, subject: str) -> str:
    """A finding's one-line heading: its kind in words and its subject, shortened to TITLE_CHARS."""
    text = f"{kind.replace('_', ' ')} · {' '.join(str(subject).split())}"
    return text if len(text) <= TITLE_CHARS else text[:TITLE_CHARS - 1].rstrip() + "…"


def severity_badge(severity: str) -> str:
    """Streamlit's own coloured badge markdown (no emoji: those render as boxes without an emoji font)."""
    return f":{SEVERITY_COLOR.get(severity, 'gray')}-badge[{severity.upper()}]"


def render(kind: str, evidence: dict, row: pd.Series, key: str) -> str:
    """Draw the finding's view; returns the family used (the page and the tests read it)."""
    family = ev.family(kind, evidence)
    views = {ev.LAGGING: lagging, ev.TOKENS: tokens, ev.REGRESSION: regression, ev.TABLE: numbers_table}
    st.markdown(f'<div data-testid="finding-view" data-family="{family}"></div>', unsafe_allow_html=True)
    if evidence.get("status") == ev.INSUFFICIENT:
        st.info(f"Insufficient data: {evidence.get('reason', 'see the evidence')}")
    views[family](evidence, row, key)
    how(evidence)
    with st.expander("Raw evidence (JSON)", expanded=False):
        st.json(evidence, expanded=1)
    return family


# -- shared pieces ------------------------------------------------------------------------------

def how(evidence: dict) -> None:
    """How it was tested and what was controlled for, as sentences."""
    for field, text in ev.prose(evidence):
        st.caption(f"**{field.replace('_', ' ')}**: {text}")


def numbers_table(evidence: dict, row=None, key: str = "fd") -> None:
    rows = ev.numbers(evidence)
    if rows:
        st.markdown("**Evidence**")
        widgets.table(pd.DataFrame(rows, columns=["field", "value"]), key=f"{key}_numbers")
    for name, recs in ev.records(evidence):
        if name in ("examples", "identity_differences"):
            continue  # the token and identity views show these their own way
        st.markdown(f"**{name.replace('_', ' ')}**")
        widgets.table(pd.DataFrame(recs), key=f"{key}_rec_{name}")
    differences(evidence, key)


def differences(evidence: dict, key: str) -> None:
    """The identity fields the replica differs in from its peers (diagnostics.replicas.identity_differences)."""
    diffs = evidence.get("identity_differences")
    if diffs is None:
        return
    st.markdown("**How this replica differs from its peers**")
    if not diffs:
        st.caption("No identity difference recorded: look at the host (neighbours, load, throttling).")
        return
    rows = []
    for d in diffs:
        peers = d.get("peers", d.get("pin", d.get("reference")))
        if isinstance(peers, dict):  # {value: how many peers have it}
            peers = ", ".join(f"{v} ({n})" for v, n in peers.items())
        rows.append({"field": d.get("field"), "this replica": ev.shown(d.get("replica")), "peers": ev.shown(peers)})
    widgets.table(pd.DataFrame(rows), key=f"{key}_identity")


# -- lagging replica / slow steps ---------------------------------------------------------------

def _effects(evidence: dict) -> pd.DataFrame:
    """One row per metric (lagging_replica) or step-time target (slow_steps): ratio, interval and the bar
    its interval had to clear (the diagnostic's own, from the evidence: each slow_steps gap has its own)."""
    rows = []
    for name, m in (evidence.get("metrics") or {}).items():
        lo, hi = (m.get("ratio_ci") or [None, None])[:2]
        test = m.get("test_vs_peers") or {}
        rows.append({"metric": name, "ratio to peers": m.get("ratio_to_peers"), "ci low": lo, "ci high": hi,
                     "bar": m.get("bar"), "Holm p": m.get("holm_p"), "requests compared": test.get("n_subject"),
                     "strata": test.get("strata")})
    for name, t in (evidence.get("targets") or {}).items():
        lo, hi = (t.get("ci") or [None, None])[:2]
        rows.append({"metric": f"{name} time", "ratio to peers": t.get("ratio"), "ci low": lo, "ci high": hi,
                     "bar": t.get("bar"), "Holm p": t.get("p_holm"), "observed s": t.get("observed_seconds"),
                     "predicted s": t.get("predicted_seconds")})
    return pd.DataFrame(rows)


def lagging(evidence: dict, row: pd.Series, key: str) -> None:
    rid = evidence.get("replica") or row["subject"]
    peers = list(evidence.get("peers") or [])
    st.markdown(f"**{rid} against its peers** {', '.join(peers) or '(none named)'} · unit compared: "
                f"{evidence.get('unit', '-')}")
    effects = _effects(evidence)
    if not effects.empty:
        complete = effects.dropna(subset=["ratio to peers"])
        st.plotly_chart(charts.intervals(complete["metric"], complete["ratio to peers"],
                                         complete["ci low"].fillna(complete["ratio to peers"]),
                                         complete["ci high"].fillna(complete["ratio to peers"]),
                                         title=f"{rid}: ratio to its peers (95% interval; 1 = as fast as "
                                               "them; | the bar the interval must clear)",
                                         x_title="ratio", reference=1.0, bars=complete["bar"]),
                        key=f"{key}_effects")
        effects["Holm p"] = effects["Holm p"].map(ev.shown)  # p-values keep their exponent, not rounded to 0
        widgets.table(widgets.rounded(effects, 4), key=f"{key}_effects_table")
    if evidence.get("metrics"):
        _distribution(evidence, row, rid, peers, key)
    shape = evidence.get("mean_shape")
    if shape:
        st.markdown("**Mean batch shape (the model compares like with like)**")
        widgets.table(pd.DataFrame(shape).reset_index(names="feature"), key=f"{key}_shape")
    differences(evidence, key)
    if evidence.get("requests"):
        st.caption("requests per replica: " + ", ".join(f"{r} {n}" for r, n in evidence["requests"].items()))


def _distribution(evidence: dict, row: pd.Series, rid: str, peers: list[str], key: str) -> None:
    """The worst metric's distribution per replica in the finding's window, from the store."""
    metrics = evidence["metrics"]
    worst = max(metrics, key=lambda m: metrics[m].get("ratio_to_peers") or 0)
    metric = worst.removesuffix("_p90")  # a tail finding (ttft_p90, queue_p90): the whole distribution shows its tail
    if metric not in LATENCY_METRICS:
        return
    start, end = widgets.epoch(row["window_start"]), widgets.epoch(row["window_end"])
    dist = data.query(queries.FINDING_LATENCY_DISTRIBUTION, start=start, end=end, replicas=[rid, *peers],
                      metric=metric)
    if dist.empty:
        st.caption("No requests of these replicas in the finding's window are left in the store.")
        return
    levels = list(queries.DISTRIBUTION_LEVELS)
    curves = {f"{r.replica_id} ({r.requests})": (list(r.q), levels) for r in dist.itertuples()}
    highlight = next((name for name in curves if name.startswith(f"{rid} ")), "")
    named = metric if metric == worst else f"{metric} (the finding: {worst})"
    st.plotly_chart(charts.distributions(curves, highlight, title=f"{named}: {rid} (thick) against its peers, "
                                         f"all requests of the window (not stratified)"), key=f"{key}_dist")


# -- tokens -------------------------------------------------------------------------------------

def _cells(ids: list[int], at: int | None, decoder: Tokenizer | None) -> str:
    """Each token in its box (its string when a tokenizer is at hand, else its ID), the first divergent
    one highlighted and the rest after it greyed."""
    labels = [visible(p) for p in decoder.pieces(ids)] if decoder is not None else [str(i) for i in ids]
    out = []
    for pos, (tid, label) in enumerate(zip(ids, labels)):
        style = "border:1px solid #ccc;border-radius:3px;padding:0 3px;margin:1px;display:inline-block;"
        style += "font-family:monospace;"
        if at is not None and pos == at:
            style += "background:#fc6;border-color:#c60;font-weight:bold;"
        elif at is not None and pos > at:
            style += "color:#777;"
        cls = ' data-testid="first-divergent-token"' if at is not None and pos == at else ""
        out.append(f'<span title="position {pos}, id {tid}" style="{style}"{cls}>{html.escape(label)}</span>')
    if at is not None and at >= len(ids):
        out.append('<span data-testid="first-divergent-token" style="background:#fc6;padding:0 3px;'
                   'font-family:monospace;">(ends here)</span>')
    return "".join(out)


def _side_decoders(evidence: dict, row: pd.Series, pairs) -> dict[str, Tokenizer | None]:
    """Each side's tokenizer: the configured one (--model / --tokenizer), else the one the replica the side
    names recorded ("r2", or the evidence's "replica" for the side called "replica")."""
    model = evidence.get("model_name") or evidence.get("model") or ""
    configured = widgets.decoder_for(model)
    names = {name for pair in pairs for name in pair.names}
    if configured is not None or not names:
        return {name: configured for name in names}
    known = set(widgets.replica_ids())
    at = widgets.epoch(row["window_end"])
    out = {}
    for name in names:
        rid = name if name in known else evidence.get(name)
        out[name] = widgets.replica_decoder(rid, model, at)[0] if isinstance(rid, str) and rid in known else None
    return out


def tokens(evidence: dict, row: pd.Series, key: str) -> None:
    pairs = ev.token_pairs(evidence)
    decoders = _side_decoders(evidence, row, pairs)
    decoder = next((d for d in decoders.values() if d is not None), None)
    if decoder is None:
        st.caption("No tokenizer for this model's replicas (none configured with `--model` / `--tokenizer`, "
                   "none found where their `replicas` rows say): showing token IDs.")
    if not pairs:
        st.caption("The evidence carries no pair of token sequences.")
    for n, pair in enumerate(pairs[:5]):
        at = pair.first_divergence
        a, b = pair.names
        where = "identical" if at is None else f"first divergent position **{at}**"
        context = " · ".join(f"{k} `{ev.shown(v)}`" for k, v in pair.context.items())
        st.markdown(f"**{pair.path}**: {a} against {b}, {where}" + (f" · {context}" if context else ""))
        left, right = st.columns(2)
        for col, name, ids, text in ((left, a, pair.ids[0], pair.texts[0]), (right, b, pair.ids[1], pair.texts[1])):
            side = decoders.get(name)  # its own replica's tokenizer (or the configured one)
            col.markdown(f"{name}: {len(ids)} tokens")
            col.markdown(f'<div data-testid="token-row">{_cells(ids, at, side)}</div>',
                         unsafe_allow_html=True)
            if side is not None:
                text = side.decode(ids, skip_special_tokens=False)
            col.code(visible(text) if text is not None else " ".join(map(str, ids)), language=None)
    rest = ev.single_token_lists(evidence)  # a prompt's IDs, an example's out-of-vocabulary IDs ...
    if rest:
        with st.expander(f"Other token IDs in the evidence ({len(rest)})"):
            for path, ids in rest[:10]:
                st.markdown(f"`{path}`: {', '.join(map(str, ids[:64]))}" + (" ..." if len(ids) > 64 else ""))
                if decoder is not None:
                    st.code(visible(decoder.decode(ids, skip_special_tokens=False)), language=None)
    numbers_table({k: v for k, v in evidence.items()
                   if k not in ("examples", "compared_texts") and not k.endswith("_token_ids")}, row, key)
    if evidence.get("template_diff"):
        st.markdown("**Chat template diff**")
        st.code("\n".join(evidence["template_diff"]), language="diff")


# -- regressions and change points --------------------------------------------------------------

def regression(evidence: dict, row: pd.Series, key: str) -> None:
    levels = evidence.get("levels")
    if levels:
        series = pd.DataFrame(levels)
        series["t"] = pd.to_datetime(series["t"], unit="s", utc=True)
        change = evidence.get("change_at")
        change_at = pd.Timestamp(change, unit="s", tz="UTC").isoformat() if change is not None else None
        metric = evidence.get("metric", "latency")
        st.plotly_chart(charts.series_with_change(series, "t", "relative_median", change_at,
                                                  title=f"{metric}: median relative to its stratum's median, per "
                                                        f"bucket of {ev.shown(evidence.get('bucket_seconds'))} s",
                                                  y_title="relative median"), key=f"{key}_series")
    strata = evidence.get("strata")
    if strata:
        frame = pd.DataFrame(strata)
        ci = frame["ratio_ci"] if "ratio_ci" in frame else pd.Series([None] * len(frame))
        lows = [c[0] if isinstance(c, list) and c else r for c, r in zip(ci, frame.get("ratio"))]
        highs = [c[1] if isinstance(c, list) and len(c) > 1 else r for c, r in zip(ci, frame.get("ratio"))]
        plotted = frame.assign(lo=lows, hi=highs).dropna(subset=["ratio"])
        st.plotly_chart(charts.intervals(plotted["stratum"], plotted["ratio"], plotted["lo"], plotted["hi"],
                                         title=f"{evidence.get('metric_label', evidence.get('metric', ''))}: candidate "
                                               f"/ baseline median per stratum (95% interval where bootstrapped)",
                                         x_title="ratio of medians", reference=1.0), key=f"{key}_strata")
    comparison = evidence.get("comparison") or evidence.get("worst_stratum")
    if comparison:
        st.markdown("**Before against after**" if levels else "**Headline stratum**")
        widgets.table(pd.DataFrame(ev.numbers(comparison), columns=["field", "value"]), key=f"{key}_comparison")
    rest = {k: v for k, v in evidence.items() if k not in ("levels", "strata", "comparison", "worst_stratum")}
    numbers_table(rest, row, key)


def raw_json(text: str) -> dict:
    """The stored evidence, {} when unreadable (the page then shows the text in an expander)."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {"value": value}
