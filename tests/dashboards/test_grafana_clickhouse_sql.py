"""The ClickHouse deep-dive dashboard's SQL runs on the real schema (embedded chdb, seeded) once
Grafana's macros and variables are expanded the way the grafana-clickhouse-datasource plugin does."""

from __future__ import annotations

import re

import pytest

from dashboards.promql import clickhouse_queries

QUERIES = {e.where: e.expr for e in clickhouse_queries()}


def expand(sql: str, start: float, end: float, variables: dict[str, list[str]]) -> str:
    """Grafana's expansion: $__timeFilter / $__timeInterval macros, ${var:format} interpolation."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)",
                 lambda m: f"{m.group(1)} >= toDateTime({int(start)}) AND {m.group(1)} <= toDateTime({int(end) + 1})", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)",
                 lambda m: f"toStartOfInterval(toDateTime({m.group(1)}), INTERVAL 60 second)", sql)

    def var(m: re.Match) -> str:
        values, fmt = variables[m.group(1)], m.group(2)
        if fmt in ("singlequote", "sqlstring"):
            return ",".join("'" + v.replace("'", "''") + "'" for v in values)
        return ",".join(values)  # raw

    return re.sub(r"\$\{(\w+):(\w+)\}", var, sql)


@pytest.fixture(scope="module")
def run(seeded):
    store, info = seeded
    from dashboard_seed import T0

    variables = {"replica": list(info.replicas), "request_id": [info.special_request], "min_e2e": ["0"]}

    def run_query(where: str):
        return store.query_df(expand(QUERIES[where], T0 - 60, T0 + 4000, variables))

    return run_query


def test_every_query_expands_fully():
    assert len(QUERIES) == 9
    for where, sql in QUERIES.items():
        expanded = expand(sql, 0, 1, {"replica": ["r0"], "request_id": ["x'y"], "min_e2e": ["1"]})
        assert "$" not in expanded, where
        if "${request_id" in sql:
            assert "'x''y'" in expanded  # sqlstring escapes quotes


def test_replicas_and_latency_panels(run):
    assert sorted(run("clickhouse_deep_dive.json: variable replica")["replica_id"]) == ["r0", "r1", "r2"]
    replicas = run("clickhouse_deep_dive.json: panel 'Replicas: identity and placement'")
    assert set(replicas["replica_id"]) == {"r0", "r1", "r2"}
    ttft = run("clickhouse_deep_dive.json: panel 'TTFT p99 per replica (from requests)'")
    assert set(ttft["replica_id"]) == {"r0", "r1", "r2"} and (ttft["ttft_p99"] > 0).all()
    host = run("clickhouse_deep_dive.json: panel 'Host time against forward time (from steps)'")
    assert host["host"].sum() / (host["host"].sum() + host["forward"].sum()) == pytest.approx(0.4)


def test_request_panels(run, seeded):
    _, info = seeded
    slow = run("clickhouse_deep_dive.json: panel 'Slowest requests'")
    assert slow.iloc[0]["request_id"] == info.slowest_request and len(slow) == 50
    one = run("clickhouse_deep_dive.json: panel 'Request: token IDs and per-token timing'")
    assert one["request_id"].tolist() == [info.special_request]
    # per-gap ITL (telemetry.contract.derived): n tokens, n - 1 gaps, the seeded 50 ms each
    gaps, times = one.iloc[0]["inter_token_seconds"], one.iloc[0]["token_times"]
    assert list(gaps) == pytest.approx([0.05] * (len(times) - 1), abs=1e-5)
    steps = run("clickhouse_deep_dive.json: panel 'Request: the steps it took part in'")
    assert steps["step_id"].tolist() == [1000, 1001, 1002, 1003, 1004]


def test_divergence_and_findings_panels(run):
    divergent = run("clickhouse_deep_dive.json: panel 'Same prompt, different tokens across replicas'")
    assert len(divergent) == 1 and divergent.iloc[0]["tokenizations"] == 2
    assert "r2" in list(divergent.iloc[0]["replicas"])
    findings = run("clickhouse_deep_dive.json: panel 'Findings'").set_index("finding_id")
    assert findings.loc["f-lag", "severity"] == "warning"  # the latest version of an updated finding
