"""Every PromQL expression is accepted by a real Prometheus, every selector finds series in a live
scrape of the real exporters, and the alert rules load and evaluate there."""

from __future__ import annotations

import time

import httpx
import pytest
from live_metrics import LIVE_FINDINGS

from dashboards.promql import alert_expressions, dashboard_expressions, selectors, substitute_grafana_variables

EXPRESSIONS = alert_expressions() + dashboard_expressions()


def query(url: str, expr: str) -> dict:
    return httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()


def test_prometheus_rejects_a_broken_expression(prometheus_url):
    """The check below can fail: a parse error comes back as an error."""
    body = query(prometheus_url, "sum by (replica (rate(infersight_prompt_tokens_total[5m]))")
    assert body["status"] == "error" and body["errorType"] == "bad_data"


@pytest.mark.parametrize("e", EXPRESSIONS, ids=lambda e: e.where)
def test_expression_is_accepted_by_prometheus(prometheus_url, e):
    body = query(prometheus_url, substitute_grafana_variables(e.expr))
    assert body["status"] == "success", f"{e.where}: {body.get('error')}"


def wait_for_scrapes(url: str, job: str, scrapes: int = 2, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = query(url, f'count_over_time(up{{job="{job}"}}[1m])')
        if body["data"]["result"] and float(body["data"]["result"][0]["value"][1]) >= scrapes:
            return
        time.sleep(0.5)
    pytest.fail(f"prometheus did not scrape job {job}")


def test_every_selector_finds_live_series(prometheus_url):
    """Names and label matchers (state="used", job="infersight-replicas", severity="critical" ...)
    match what the real engine exporter and the real sidecar expose, as scraped by Prometheus."""
    wait_for_scrapes(prometheus_url, "infersight-replicas")
    wait_for_scrapes(prometheus_url, "infersight-sidecar")
    missing = []
    checked = set()
    for e in EXPRESSIONS:
        for sel in selectors(substitute_grafana_variables(e.expr)):
            if sel in checked:
                continue
            checked.add(sel)
            body = httpx.get(f"{prometheus_url}/api/v1/series", params={"match[]": sel}, timeout=10).json()
            assert body["status"] == "success", body
            if not body["data"]:
                missing.append(f"{e.where}: {sel}")
    assert len(checked) > 40
    assert missing == []


def test_alert_rules_load_and_evaluate(prometheus_url):
    deadline = time.monotonic() + 30
    while True:
        groups = httpx.get(f"{prometheus_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["health"] == "ok" for r in rules):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"rules not healthy: {[(r['name'], r['health'], r.get('lastError')) for r in rules]}")
        time.sleep(0.5)
    assert {r["name"] for r in rules} == {e.where.split(": ")[1] for e in alert_expressions()}
    # end to end: findings in the store -> the sidecar's /metrics -> Prometheus -> the alerts fire
    wait_for_scrapes(prometheus_url, "infersight-sidecar")
    deadline = time.monotonic() + 30
    while True:
        alerts = httpx.get(f"{prometheus_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        firing = {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}
        if set(firing) >= set(LIVE_FINDINGS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(firing) == set(LIVE_FINDINGS), alerts  # and nothing else: the replica and sidecar are up
    for name, finding in LIVE_FINDINGS.items():
        labels = firing[name]["labels"]
        assert {k: labels[k] for k in finding} == finding
