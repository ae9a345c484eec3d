"""The Grafana dashboards: generated JSON is current, well-formed, templated and laid out."""

from __future__ import annotations

import itertools

import pytest
import yaml

from dashboards.grafana import generate
from dashboards.promql import GRAFANA_DIR, grafana_dashboards

DASHBOARDS = grafana_dashboards()
PROMETHEUS_FILES = ["overview.json", "replica_comparison.json", "kv_cache.json",
                    "speculative_decoding.json", "findings.json"]


def test_committed_json_is_what_the_generator_writes():
    assert generate.main(["--check"]) == 0


def test_all_dashboards_exist_with_unique_uids():
    assert set(DASHBOARDS) == set(PROMETHEUS_FILES) | {"clickhouse_deep_dive.json"}
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("file", PROMETHEUS_FILES)
def test_prometheus_dashboard_is_templated(file):
    dash = DASHBOARDS[file]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"model", "replica"} <= set(variables)
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_engine_panels_honour_the_replica_and_model_variables():
    for file in PROMETHEUS_FILES:
        for panel in DASHBOARDS[file]["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                engine = "infersight_" in expr and not any(
                    s in expr for s in ("infersight_finding", "infersight_findings", "infersight_sidecar"))
                if engine:
                    assert '$replica' in expr and '$model' in expr, f"{file}: {panel['title']}: {expr}"


def test_clickhouse_dashboard_uses_the_plugin_shape():
    dash = DASHBOARDS["clickhouse_deep_dive.json"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "grafana-clickhouse-datasource"
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["editorType"] == "sql" and target["rawSql"].startswith(("SELECT", "WITH"))
            assert target["format"] in (0, 1)
            # user input goes through Grafana's escaping formats only
            assert "'${request_id" not in target["rawSql"] and "$request_id" not in target["rawSql"]


@pytest.mark.parametrize("file", sorted(DASHBOARDS))
def test_panels_do_not_overlap_and_fit_the_grid(file):
    boxes = []
    for panel in DASHBOARDS[file]["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for a, b in itertools.combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (file, a, b)
    ids = [p["id"] for p in DASHBOARDS[file]["panels"]]
    assert len(set(ids)) == len(ids)


def test_provisioning_examples():
    ds = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "infersight.yml").read_text())
    types = {d["type"] for d in ds["datasources"]}
    assert types == {"prometheus", "grafana-clickhouse-datasource"}
    boards = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "infersight.yml").read_text())
    assert boards["providers"][0]["type"] == "file"
