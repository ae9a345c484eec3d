"""Scopes as SQL filters (replica starts matched by time), and findings that update rather than pile up."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from diag_records import replica, request

from diagnostics.findings import Finding, format_table, insufficient, write_findings
from diagnostics.scope import Scope, parse_time, replicas_in, requests_in


def test_parse_time_forms():
    now = 1_700_000_000.0
    assert parse_time("2h", now) == now - 7200 and parse_time("now", now) == now
    assert parse_time("1700000000.5", now) == 1700000000.5
    assert parse_time("2023-11-14T22:13:20Z", now) == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20", now) == 1_700_000_000.0  # naive means UTC
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday-ish", now)


def test_side_specs():
    base = Scope.window(since="24h", now=1e9)
    s = base.with_side("version=0.2.0 replica=r1,r2", now=1e9)
    assert s.versions == ("0.2.0",) and s.replicas == ("r1", "r2") and s.start == base.start and s.name
    w = base.with_side("window=2h..1h", now=1e9)
    assert (w.start, w.end) == (1e9 - 7200, 1e9 - 3600)
    for bad in ("version", "colour=red", "window=2h", ""):
        with pytest.raises(ValueError):
            base.with_side(bad)
    with pytest.raises(ValueError, match="empty window"):
        Scope(start=10, end=5)


def test_relative_windows_key_by_their_spec_so_reruns_share_ids():
    a, b = Scope.window(since="1h", now=1000.0), Scope.window(since="1h", now=5000.0)
    assert a.start != b.start and a.key() == b.key()
    f = lambda s: Finding("lagging_replica", "warning", "r1", "x", "replicas", s)  # noqa: E731
    assert f(a).finding_id == f(b).finding_id
    assert f(a).finding_id != f(a.narrowed(replicas=("r1",))).finding_id


def test_versions_follow_the_replica_start_that_served_each_request(clean):
    t0 = time.time() - 1000
    # r1 is upgraded in place at t0 + 100: its requests before and after belong to different versions
    clean.insert_records("replicas", [replica("r1", t0, version="0.1.0"), replica("r1", t0 + 100, version="0.2.0"),
                                      replica("r2", t0, version="0.1.0")])
    clean.insert_records("requests", [request("r1", i, t0 + 50 * i + 1) for i in range(4)]
                         + [request("r2", 10, t0 + 5)])
    sql = "SELECT replica_id, engine_version, count() AS n FROM " + requests_in(
        "t.replica_id AS replica_id") + " GROUP BY replica_id, engine_version ORDER BY replica_id, engine_version"
    rows = clean.query_df(sql, Scope().parameters()).to_dict("records")
    assert rows == [{"replica_id": "r1", "engine_version": "0.1.0", "n": 2},
                    {"replica_id": "r1", "engine_version": "0.2.0", "n": 2},
                    {"replica_id": "r2", "engine_version": "0.1.0", "n": 1}]
    only = clean.query_df("SELECT count() AS n FROM " + requests_in("t.replica_id AS replica_id"),
                          Scope(versions=("0.2.0",)).parameters())
    assert only["n"][0] == 2
    # identity: the latest start of replicas active in the window, with their CPU count
    active = replicas_in(clean, Scope(start=t0 + 120))
    assert [(r["replica_id"], r["engine_version"], r["cpu_count"]) for r in active] == [("r1", "0.2.0", 2)]


def test_findings_rerun_updates_one_row_and_keeps_first_seen(clean):
    scope = Scope.window(since="1h")
    f = Finding("lagging_replica", "warning", "r3", "r3 is slow", "replicas", scope, {"ratio": 1.8})
    t = time.time()
    write_findings(clean, [f], now=t - 60)
    f2 = Finding("lagging_replica", "critical", "r3", "r3 is slower", "replicas", Scope.window(since="1h"),
                 {"ratio": 2.5})
    write_findings(clean, [f2], now=t)
    clean.command("OPTIMIZE TABLE findings FINAL")
    rows = clean.query_df("SELECT * FROM findings").to_dict("records")
    assert len(rows) == 1
    row = rows[0]
    assert row["severity"] == "critical" and row["summary"] == "r3 is slower"
    assert row["first_seen"].timestamp() == pytest.approx(t - 60, abs=1e-3)
    assert row["last_seen"].timestamp() == pytest.approx(t, abs=1e-3)
    evidence = json.loads(row["evidence_json"])
    assert evidence["ratio"] == 2.5 and evidence["scope_key"] == scope.key()


def test_evidence_is_plain_json_and_severity_is_checked():
    import numpy as np

    f = insufficient("regression", "ttft", "regression", Scope(), "12 samples", n=np.int64(12), x=float("nan"))
    ev = json.loads(f.evidence_json())
    assert ev["status"] == "insufficient_data" and ev["n"] == 12 and ev["x"] is None and f.severity == "info"
    with pytest.raises(ValueError, match="severity"):
        Finding("k", "bad", "s", "x", "d", Scope())
    assert "insufficient data: 12 samples" in format_table([f])


def test_the_sidecar_exports_recorded_findings_as_gauges(tmp_path):
    """Findings written through the sidecar's HTTP endpoint come back on its /metrics."""
    from telemetry.sidecar.process import start_sidecar
    from telemetry.store import open_store

    with start_sidecar(tmp_path / "store") as sidecar:
        store = open_store(sidecar.store_url)
        try:
            from telemetry.schema import migrate

            migrate(store)
            write_findings(store, [Finding("lagging_replica", "warning", "r3", "r3 is slow", "replicas", Scope()),
                                   Finding("host_overhead", "info", "r1", "fine", "overhead", Scope())])
        finally:
            store.close()
        text = httpx.get(f"{sidecar.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines()
                if x.startswith("infersight_finding_severity_level{") and 'subject="r3"' in x)
    assert 'kind="lagging_replica"' in line and 'diagnostic="replicas"' in line and line.endswith(" 1.0")
    assert any(x.startswith("infersight_finding_active{") and 'subject="r1"' in x for x in text.splitlines())
