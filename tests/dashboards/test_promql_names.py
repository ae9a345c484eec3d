"""Every PromQL expression in the alert rules and Grafana dashboards uses only metric names the
engine and sidecar really export: the contract list, and a live scrape of the real exporters."""

from __future__ import annotations

import httpx
import pytest
from live_metrics import engine_exposition, series_names

from dashboards.metric_contract import ALL_SERIES, ENGINE_SERIES, SIDECAR_SERIES
from dashboards.promql import (
    alert_expressions,
    dashboard_expressions,
    metric_names,
    selectors,
    substitute_grafana_variables,
)

EXPRESSIONS = alert_expressions() + dashboard_expressions()


def test_selector_parsing():
    expr = ('sum by (le) (rate(a_bucket{x="b}", r=~"$replica"}[5m])) / on(replica) group_left(model) '
            'b offset 5m > bool 1e3 and up{job="j"} == 0 or vector(0) unless histogram_quantile(0.9, c)')
    assert selectors(expr) == ['a_bucket{x="b}", r=~"$replica"}', "b", 'up{job="j"}', "c"]
    assert metric_names(expr) == {"a_bucket", "b", "up", "c"}
    assert metric_names('label_replace(x, "dst", "$1", "src", "(.*)")') == {"x"}


def test_grafana_variables_are_substituted():
    expr = 'rate(x{replica=~"$replica", model=~"${model}"}[$__rate_interval])'
    assert substitute_grafana_variables(expr) == 'rate(x{replica=~".*", model=~".*"}[5m])'


def test_expressions_were_found():
    assert len(alert_expressions()) >= 13
    files = {e.where.split(":")[0] for e in dashboard_expressions()}
    assert files == {"overview.json", "replica_comparison.json", "kv_cache.json",
                     "speculative_decoding.json", "findings.json"}


@pytest.mark.parametrize("e", EXPRESSIONS, ids=lambda e: e.where)
def test_expression_uses_only_contract_metrics(e):
    names = metric_names(substitute_grafana_variables(e.expr))
    assert names, f"no metric found in {e.expr!r}"
    assert names <= ALL_SERIES, f"not in the metric contract: {names - ALL_SERIES}"


def test_contract_matches_a_live_engine_scrape():
    """The engine's real exporter shows exactly the engine half of the contract."""
    live = series_names(engine_exposition())
    assert ENGINE_SERIES - live == set(), "contract names the engine does not export"
    assert {n for n in live if n.startswith("infersight_")} - ENGINE_SERIES == set()


def test_contract_matches_a_live_sidecar_scrape(sidecar_metrics_target):
    live = series_names(httpx.get(f"http://{sidecar_metrics_target}/metrics", timeout=10).text)
    assert SIDECAR_SERIES - live == set(), "contract names the sidecar does not export"
    # prometheus_client's `_created` companions are tolerated here (the engine turns them off)
    assert {n for n in live if n.startswith("infersight_") and not n.endswith("_created")} - SIDECAR_SERIES == set()


def test_every_metric_used_is_exported_live(sidecar_metrics_target):
    live = series_names(engine_exposition())
    live |= series_names(httpx.get(f"http://{sidecar_metrics_target}/metrics", timeout=10).text)
    used = set().union(*(metric_names(substitute_grafana_variables(e.expr)) for e in EXPRESSIONS))
    assert used - live == {"up"}  # Prometheus' own
