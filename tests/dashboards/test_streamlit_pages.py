"""Every page of the Streamlit dashboard, run by streamlit's AppTest on a seeded store, shows the
seeded values (tables, metrics, charts, decoded tokens)."""

from __future__ import annotations

import base64
import importlib.util
import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data, settings
from dashboards.promql import HERE as DASHBOARDS_DIR

APP = str(DASHBOARDS_DIR / "app.py")


@pytest.fixture
def app(seeded, tokenizer_dir, monkeypatch):
    store, _ = seeded
    monkeypatch.setenv(settings.TOKENIZERS_ENV, json.dumps({"*": str(tokenizer_dir)}))
    data.use_store(store)
    yield lambda page=None: open_page(page)
    data.use_store(None)


def open_page(page: str | None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    if page is not None:
        at.switch_page(f"views/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# each page's tables, told apart by columns only they have (AppTest keeps no dataframe keys)
TABLES = {
    "fleet_replicas": ["replica_id", "cpu_affinity", "config_hash drift"],
    "fleet_health": ["replica_id", "ttft_p50", "answered %", "rejected %", "shed %", "failed %"],
    "rq_results": ["request_id", "e2e_seconds", "workload"],
    "rq_prompt_tokens": ["position", "id"],
    "rq_output_tokens": ["position", "id", "gap (ms)"],
    "rq_steps": ["step_id", "host_seconds", "kv_blocks_used"],
    "cmp_identity": ["side", "replica_id", "engine_version"],
    "cmp_summary": ["A", "B"],
    "sched_recent": ["step_id", "host_seconds", "num_waiting"],
    "kv_summary": ["replica_id", "prefix_hit_rate", "peak_utilization"],
    "ev_drift": ["item_id", "base_score", "candidate_score"],
    "fd_table": ["finding_id", "kind", "severity", "summary"],
    "pf_list": ["profile_id", "replica_id", "samples"],
}


def frame(at: AppTest, name: str) -> pd.DataFrame:
    needed = TABLES[name]
    matches = [df.value for df in at.dataframe if set(needed) <= set(df.value.columns)]
    if name == "rq_prompt_tokens":  # the prompt table is the token table without timing
        matches = [m for m in matches if "gap (ms)" not in m.columns]
    assert matches, f"no table {name} with columns {needed}"
    return matches[0]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def array(value) -> list:
    """A plotly JSON array: a list, or {"dtype", "bdata"} (base64 numpy) as plotly 6 writes them."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


def chart_specs(at: AppTest) -> dict[str, dict]:
    return {c.proto.id.split("-")[-1]: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def test_fleet(app, seeded):
    _, info = seeded
    at = app()
    assert at.title[0].value == "Fleet"
    replicas = frame(at, "fleet_replicas")
    assert sorted(replicas["replica_id"]) == ["r0", "r1", "r2"]
    assert replicas.set_index("replica_id").loc["r1", "cpu_affinity"] == "8,9"
    assert bool(replicas.set_index("replica_id").loc["r2", "config_hash drift"])  # cfgA vs cfgB
    assert any("NUMA mismatch" in w.value and "r1" in w.value for w in at.warning)
    health = frame(at, "fleet_health").set_index("replica_id")
    assert health["requests"].to_dict() == {"r0": 101, "r1": 100, "r2": 101}
    # availability: every request in exactly one outcome
    outcomes = ["answered", "rejected", "shed", "failed", "timed_out", "aborted"]
    assert (health[outcomes].sum(axis=1) == health["requests"]).all()
    assert (health["answered %"] <= 100).all() and health.loc["r0", "answered %"] > 0
    assert health.loc["r2", "ttft_p50"] > 2 * health.loc["r0", "ttft_p50"]  # r2 was seeded 3x slower
    assert metrics(at)["Requests"] == f"{info.requests:,}"
    specs = chart_specs(at)
    assert {t["name"] for t in specs["fleet_latency_chart"]["data"]} == {"r0", "r1", "r2"}


def test_requests_search_and_one_request_in_detail(app, seeded):
    _, info = seeded
    at = app("requests")
    results = frame(at, "rq_results")
    assert results.iloc[0]["request_id"] == info.slowest_request  # sorted slowest end-to-end first
    assert len(results) == 200
    at.text_input(key="rq_search").input(info.special_request)
    at.button[0].click().run()
    assert frame(at, "rq_results")["request_id"].tolist() == [info.special_request]
    assert metrics(at)["Output tokens"] == str(len(frame(at, "rq_output_tokens")))
    code = [c.value for c in at.code]
    # decoded strings with whitespace and invisible characters made visible
    assert "<|bos|>··hello⏎⇥world\\u200b!" in code
    assert "Hi·there⏎friend" in code
    prompt = frame(at, "rq_prompt_tokens")
    assert prompt.iloc[0]["token"] == "<|bos|>" and "⏎" in "".join(prompt["token"])
    output = frame(at, "rq_output_tokens")
    assert output["gap (ms)"].iloc[0] == "-"  # the first token has no gap (its latency is TTFT)
    assert pd.to_numeric(output["gap (ms)"].iloc[1:]).round(3).tolist() == [50.0] * (len(output) - 1)  # seeded ITL
    steps = frame(at, "rq_steps")
    assert steps["step_id"].tolist() == [1000, 1001, 1002, 1003, 1004]


def test_requests_without_a_tokenizer_shows_ids_only(seeded, monkeypatch):
    store, info = seeded
    monkeypatch.delenv(settings.TOKENIZERS_ENV, raising=False)
    data.use_store(store)
    try:
        at = open_page("requests")
        assert any("showing token IDs only" in i.value for i in at.info)
        assert "token" not in frame(at, "rq_output_tokens").columns
    finally:
        data.use_store(None)


def test_compare_versions(app):
    at = app("compare")
    has_diagnostic = importlib.util.find_spec("diagnostics.regression") is not None
    if has_diagnostic:  # r0 against r1: same version, same speed
        assert not at.error and any("no significant regression" in m.value or "no regression" in m.value
                                    for m in at.success), [e.value for e in at.error]
    at.radio(key="cmp_dimension").set_value("engine version").run()
    assert not at.exception
    summary = frame(at, "cmp_summary")
    assert summary.loc["requests", "A"] == 201 and summary.loc["requests", "B"] == 101
    assert float(summary.loc["ttft_p50", "B / A"]) > 2  # 0.2.0 (r2) is the slow one
    identity = frame(at, "cmp_identity")
    assert identity.set_index("replica_id")["side"].to_dict() == {"r0": "A", "r1": "A", "r2": "B"}
    assert {t["name"] for t in chart_specs(at)["cmp_ttft_curve"]["data"]} == {"A: 0.1.0", "B: 0.2.0"}
    if not has_diagnostic:
        assert any("not part of this build" in i.value for i in at.info)
        return
    # the regression diagnostic's verdict: 0.2.0 is ~3x slower, with the statistics behind it
    assert any("time to first token regression" in e.value for e in at.error)
    verdicts = [df.value for df in at.dataframe if "verdict" in df.value.columns][0]
    ttft = verdicts[verdicts["metric"] == "ttft"]
    assert set(ttft["verdict"]) == {"regression"} and (ttft["ratio"] > 2).all()


def test_scheduler(app):
    at = app("scheduler")
    at.selectbox(key="sched_replica").set_value("r2").run()
    m = metrics(at)
    assert m["Steps"] == "200"
    assert m["Host overhead"] == "40.0%"  # forward 12 ms of 20 ms steps
    assert len(frame(at, "sched_recent")) == 200
    specs = chart_specs(at)
    assert {"sched_host_forward", "sched_tokens", "sched_batch", "sched_queues", "sched_split"} <= set(specs)
    waiting = [t for t in specs["sched_queues"]["data"] if t["name"] == "waiting"][0]
    assert set(array(waiting["y"])) == {6.0}


def test_kv_cache(app):
    at = app("kv_cache")
    summary = frame(at, "kv_summary").set_index("replica_id")
    assert sorted(summary.index) == ["r0", "r1", "r2"]
    assert summary.loc["r1", "prefix_hit_rate"] == pytest.approx(8 / 36, abs=1e-4)
    assert summary.loc["r1", "peak_utilization"] == pytest.approx(49 / 64, abs=1e-4)
    assert summary.loc["r1", "preemptions"] == 4 and summary.loc["r1", "evictions"] == 8
    assert {"kv_utilization", "kv_hit_rate", "kv_evictions", "kv_preemptions"} <= set(chart_specs(at))


def test_evals(app, seeded):
    _, info = seeded
    at = app("evals")
    m = metrics(at)
    assert m["Baseline accuracy"] == "0.900" and m["Candidate accuracy"] == "0.700"
    if importlib.util.find_spec("evals.gate") is None:
        assert m["Gate"] == "n/a" and any("not part of this build" in i.value for i in at.info)
        return
    # the eval gate's verdict on the two stored runs: a 20-point drop fails the default policy
    assert m["Gate"] == "FAIL"
    assert any("accuracy drop" in e.value for e in at.error)
    checks = [df.value for df in at.dataframe if "check" in df.value.columns][0].set_index("check")
    assert not checks.loc["accuracy drop", "passed"]
    assert checks.loc["accuracy drop", "value"] == pytest.approx(0.2)
    assert checks.loc["greedy output agreement", "value"] == pytest.approx(0.8)  # 8 of 10 outputs identical
    drift = frame(at, "ev_drift")
    assert sorted(drift["item_id"]) == ["item-03", "item-07"]  # item-09 fails in both: no drift
    assert at.selectbox(key="ev_item").value == info.drifted_item
    markdown = " ".join(md.value for md in at.markdown)
    assert "first diverge at output token" in markdown
    diff = [md.value for md in at.markdown if 'data-testid="token-diff"' in md.value][0]
    spans = re.findall(r'<span title="id \d+" style="([^"]*)">([^<]*)</span>', diff)
    removed = [text for style, text in spans if "line-through" in style]
    added = [text for style, text in spans if "#dfd" in style]
    # "The answer is 47." became "The answer is 74!"
    assert "".join(removed) == "·47." and "".join(added) == "·74!"


def test_evals_with_one_run_shows_its_accuracy_per_task(app):
    at = app("evals")
    at.selectbox(key="ev_suite").set_value("words").run()
    assert not at.exception
    chart = chart_specs(at)["ev_single_tasks"]["data"][0]
    accuracy = dict(zip(chart["y"], array(chart["x"])))
    assert accuracy == {"count": 0.5, "spell": 0.75}  # w-01, w-03 (count) and w-04 (spell) failed
    lows = dict(zip(chart["y"], np.subtract(array(chart["x"]), array(chart["error_x"]["arrayminus"]))))
    assert lows == pytest.approx({"count": 0.15, "spell": 0.301}, abs=0.01)  # Wilson intervals of 2/4 and 3/4
    assert any("a second run" in i.value for i in at.info)


def test_findings(app, seeded):
    _, info = seeded
    at = app("findings")
    table = frame(at, "fd_table")
    # critical first, then warnings, then info, each newest first
    assert table["finding_id"].tolist() == ["f-tok", "f-lag", "f-steps", "f-cp", "f-drift", "f-gap", "f-new"]
    lag = table.set_index("finding_id").loc["f-lag"]
    assert lag["summary"] == info.finding_summary and lag["severity"] == "warning"  # the latest version
    assert metrics(at)["critical"] == "1" and metrics(at)["warning"] == "4"
    # the tokenizer finding's evidence: both sequences side by side, decoded, the divergence marked
    assert at.selectbox(key="fd_selected").value == "f-tok"
    assert family_shown(at) == "tokens"
    code = [c.value for c in at.code]
    assert "<|bos|>hello·world" in code and "<|bos|>hello··world" in code
    rows = [md.value for md in at.markdown if 'data-testid="token-row"' in md.value]
    assert len(rows) == 2 and all('data-testid="first-divergent-token"' in r for r in rows)
    # the raw JSON only inside its expander
    assert len(at.json) == 1 and [e.label for e in at.expander if e.json] == ["Raw evidence (JSON)"]


def family_shown(at: AppTest) -> str:
    views = [md.value for md in at.markdown if 'data-testid="finding-view"' in md.value]
    assert len(views) == 1, views
    return re.search(r'data-family="(\w+)"', views[0]).group(1)


def test_each_finding_family_has_its_view(app):
    at = app("findings")
    # lagging replica: the ratio per metric with its interval, r2's distribution against its peers from the
    # store, and the identity fields it differs in
    at.selectbox(key="fd_selected").set_value("f-lag").run()
    assert family_shown(at) == "lagging"
    specs = chart_specs(at)
    effects = specs["fd_f_lag_effects"]["data"][0]
    assert list(effects["y"]) == ["ttft", "itl"] and array(effects["x"]) == [3.0, 2.9]
    curves = {t["name"]: t for t in specs["fd_f_lag_dist"]["data"]}
    assert set(curves) == {"r0 (101)", "r1 (100)", "r2 (101)"}
    assert np.median(array(curves["r2 (101)"]["x"])) > 2 * np.median(array(curves["r0 (101)"]["x"]))
    identity = [df.value for df in at.dataframe if "this replica" in df.value.columns][0]
    assert identity.set_index("field").loc["quantization"].tolist() == ["int8", "none (2)"]
    bars = specs["fd_f_lag_effects"]["data"][1]
    assert bars["name"] == "bar" and array(bars["x"]) == [1.15, 1.15]
    # slow steps: per step-time target, the ratio to the peers' model against that target's own bar (the
    # gap's is derived from its share of the wall time; host has none in this evidence: no tick), and the
    # mean batch shape
    at.selectbox(key="fd_selected").set_value("f-steps").run()
    assert family_shown(at) == "lagging"
    estimate, bars = chart_specs(at)["fd_f_steps_effects"]["data"]
    assert list(estimate["y"]) == ["forward time", "gap time", "host time"]
    assert list(bars["y"]) == ["forward time", "gap time"] and array(bars["x"]) == [1.1, 1.41]
    # a change point: the series with the change marked
    at.selectbox(key="fd_selected").set_value("f-cp").run()
    assert family_shown(at) == "regression"
    series = chart_specs(at)["fd_f_cp_series"]
    assert len(array(series["data"][0]["y"])) == 40
    assert [s["type"] for s in series["layout"]["shapes"]] == ["line"]  # the change point
    # output drift: the example's two outputs side by side (nested in evidence.examples)
    at.selectbox(key="fd_selected").set_value("f-drift").run()
    assert family_shown(at) == "tokens"
    assert any("examples[0]" in md.value and "first divergent position **3**" in md.value for md in at.markdown)
    # anything else, a kind added after the dashboard included: a table of its numbers, "-" when missing
    for fid in ("f-gap", "f-new"):
        at.selectbox(key="fd_selected").set_value(fid).run()
        assert family_shown(at) == "table"
        numbers = [df.value for df in at.dataframe if list(df.value.columns) == ["field", "value"]][0]
        assert not numbers["value"].isna().any()
    assert numbers.set_index("field").loc["nested.b", "value"] == "-"
    assert not at.exception


@pytest.mark.parametrize("finding_id", ["f-tok", "f-lag", "f-steps", "f-cp", "f-drift", "f-gap", "f-new"])
def test_finding_views_show_no_none_cells_and_no_emoji(app, finding_id):
    at = app("findings")
    at.selectbox(key="fd_selected").set_value(finding_id).run()
    assert not at.exception
    for df in at.dataframe:
        assert not shown_cells(df).isna().any().any(), list(df.value.columns)
    texts = [e.value for kind in ("markdown", "caption", "subheader") for e in at.get(kind)]
    assert not [t for t in texts if EMOJI.search(t)]


def shown_cells(df) -> pd.DataFrame:
    """What the table displays: a Styler's display text where the page sent one, else the data."""
    styler = df.proto.arrow_data.styler
    if styler.display_values:
        return pa.ipc.open_stream(styler.display_values).read_all().to_pandas()
    return df.value


EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B50\u2B55\uFE0F]")


@pytest.mark.parametrize("page", ["fleet", "requests", "compare", "scheduler", "kv_cache", "evals", "findings",
                                  "profiles"])
def test_no_none_cells_and_no_emoji(app, page):
    at = app(page)
    for df in at.dataframe:
        value = shown_cells(df)
        assert not value.isna().any().any(), f"{page}: a table with empty cells shown as None: {list(value.columns)}"
    texts = [e.value for kind in ("markdown", "caption", "title", "subheader", "info") for e in at.get(kind)
             if isinstance(getattr(e, "value", None), str)] + [m.label for m in at.metric]
    assert not [t for t in texts if EMOJI.search(t)]


def test_profiles(app, seeded):
    _, info = seeded
    at = app("profiles")
    assert frame(at, "pf_list")["profile_id"].tolist() == [info.profile_id]
    flame = chart_specs(at)["pf_flame"]["data"][0]
    values = dict(zip(flame["ids"], array(flame["values"])))
    assert values["all"] == 1000
    hot = [i for i in flame["ids"] if i.endswith(info.hot_frame)]
    assert [values[i] for i in hot] == [600]
    groups = chart_specs(at)["pf_groups"]["data"][0]
    assert "forward" in groups["y"]


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """A store with the schema and no rows, served by a sidecar of its own: chdb opens one data
    directory per process, and the suite's seeded store is already open in this one."""
    from telemetry.sidecar.process import start_sidecar
    from telemetry.store import open_store

    with start_sidecar(tmp_path_factory.mktemp("empty_store")) as sidecar, open_store(sidecar.url) as store:
        yield store


@pytest.mark.parametrize("page", ["requests", "scheduler", "kv_cache"])
def test_pages_on_an_empty_store_say_so_and_stop(page, empty_store):
    data.use_store(empty_store)
    try:
        at = open_page(page)
    finally:
        data.use_store(None)
    assert [i.value for i in at.info] == ["No requests in the store for this selection yet."]
    assert not at.dataframe  # the page stopped before any table
