"""What a newcomer meets first on the dashboard: an unreachable store said plainly (at open and mid-session),
a finding's heading on one line with its summary below, the Fleet page marking replicas by their findings'
severity."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data, finding_views, settings
from dashboards.promql import HERE as DASHBOARDS_DIR
from engine.util import free_port

APP = str(DASHBOARDS_DIR / "app.py")
URLLIB3_NOISE = ("HTTPConnectionPool", "Max retries", "query_id", "Retry(", "NewConnectionError", "Caused by")


def _run(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page is not None:
        at.switch_page(f"views/{page}.py")
        at.run()
    return at


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_unreachable_store_at_open_is_one_plain_line(monkeypatch):
    port = free_port()
    monkeypatch.setenv(settings.STORE_ENV, f"http://dashboard:pw0rd@127.0.0.1:{port}/infersight")
    data.use_store(None)
    at = _run()
    assert not at.exception, [e.value for e in at.exception]
    errors = _errors(at)
    assert len(errors) == 1 and "unreachable: connection refused" in errors[0], errors
    assert not [n for n in URLLIB3_NOISE if n in errors[0]] and "pw0rd" not in errors[0], errors[0]


def test_store_gone_mid_session_is_said_plainly(tmp_path):
    from telemetry.sidecar.process import start_sidecar
    from telemetry.store.remote import RemoteStore

    sidecar = start_sidecar(tmp_path / "store")
    try:
        store = RemoteStore(sidecar.url)
    finally:
        sidecar.stop()  # the dashboard had it open; now it is gone
    data.use_store(store)
    try:
        at = _run()
    finally:
        data.use_store(None)
        store.close()
    assert not at.exception, [e.value for e in at.exception]
    errors = _errors(at)
    assert errors and "unreachable: connection refused" in errors[0] and "once the store is back" in errors[0], errors
    assert not [n for n in URLLIB3_NOISE if n in errors[0]], errors[0]


@pytest.fixture
def seeded_app(seeded, tokenizer_dir, monkeypatch):
    store, _ = seeded
    monkeypatch.setenv(settings.TOKENIZERS_ENV, json.dumps({"*": str(tokenizer_dir)}))
    data.use_store(store)
    yield
    data.use_store(None)


def test_a_finding_heading_is_one_line_with_the_summary_below(seeded_app):
    at = _run("findings")
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="fd_selected").value == "f-tok"
    headings = [h.value for h in at.subheader]
    assert headings[0] == "tokenizer divergence · r0 vs r2"
    assert "same prompt, different token IDs on r0 and r2" in [m.value for m in at.markdown]
    long = finding_views.title("latency_change_point", "ttft: " + ", ".join(f"replica-{i}" for i in range(40)))
    assert len(long) <= finding_views.TITLE_CHARS and "\n" not in long and long.endswith("…")


def test_fleet_marks_replicas_by_their_worst_finding(seeded_app):
    at = _run()
    assert not at.exception, [e.value for e in at.exception]
    health = next(df.value for df in at.dataframe if "worst finding" in df.value.columns)
    worst = dict(zip(health["replica_id"], health["worst finding"]))
    # r0 and r2 share the critical tokenizer finding ("r0 vs r2"); r2 also has warnings; r1 only info
    assert worst == {"r0": "critical", "r1": "info", "r2": "critical"}
    assert [e.value for e in at.error] == ["Critical findings on r0, r2: see the Findings page."]


def test_requests_decode_with_the_tokenizer_the_replica_recorded(seeded, tokenizer_dir, monkeypatch):
    """No --model: the replicas row names the model directory and the tokenizer hash; the directory's
    tokenizer decodes when its hash is the recorded one, and a changed directory is named, not used."""
    import dataclasses

    from dashboard_seed import T0, replica

    from engine.core.tokenization import Tokenizer

    store, _ = seeded
    monkeypatch.delenv(settings.TOKENIZERS_ENV, raising=False)
    recorded = Tokenizer(tokenizer_dir).tokenizer_hash

    def restart(at: float, tokenizer_hash: str) -> None:  # every replica restarted before the requests arrived
        store.insert_records("replicas", [
            dataclasses.replace(replica(rid, "0.1.0", "cfgA", "none", False), start_time=at, tokenizer_hash=tokenizer_hash,
                                config_json=json.dumps({"model": str(tokenizer_dir)})) for rid in ("r0", "r1", "r2")])

    def requests_page() -> AppTest:
        data.use_store(store)  # clears the dashboard's caches
        at = _run("requests")
        assert not at.exception, [e.value for e in at.exception]
        return at

    try:
        restart(T0 - 300, recorded)
        at = requests_page()
        assert not [i.value for i in at.info if "No tokenizer" in i.value]
        tokens = next(df.value for df in at.dataframe if {"position", "id", "gap (ms)"} <= set(df.value.columns))
        assert "token" in tokens.columns and tokens["token"].str.len().gt(0).all()

        # the Findings page's token view decodes each side with its replica's recorded tokenizer too
        data.use_store(store)
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        at.switch_page("views/findings.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.selectbox(key="fd_selected").value == "f-tok"
        code = [c.value for c in at.code]
        assert "<|bos|>hello·world" in code and "<|bos|>hello··world" in code, code

        restart(T0 - 200, "a-different-tokenizer")
        at = requests_page()
        infos = [i.value for i in at.info if "No tokenizer for replica" in i.value]
        assert infos and "is not the one" in infos[0] and "showing token IDs only" in infos[0], infos
    finally:
        data.use_store(None)
