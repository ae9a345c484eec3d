"""Small builders for Grafana dashboard JSON (schema of Grafana 10/11).

Only what our dashboards use: time series, stat and table panels over a Prometheus or
ClickHouse (grafana-clickhouse-datasource) data source chosen by the `datasource`
variable, laid out left to right in rows of 24 grid units.
"""

from __future__ import annotations

from telemetry.contract.derived import QUANTILES

PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
CLICKHOUSE = {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}

# Every engine-metric selector honours the dashboard's model and replica variables.
SEL = 'model=~"$model", replica=~"$replica"'
RATE = "$__rate_interval"


def prom(expr: str, legend: str = "", instant: bool = False, table: bool = False) -> dict:
    target = {"datasource": PROMETHEUS, "expr": expr, "legendFormat": legend or "__auto",
              "range": not instant, "instant": instant}
    if table:
        target["format"] = "table"
    return target


def sql(query: str, table: bool = True) -> dict:
    # format 1 = table, 0 = time series (long frames are widened by the plugin)
    return {"datasource": CLICKHOUSE, "editorType": "sql", "rawSql": query.strip(),
            "format": 1 if table else 0, "queryType": "table" if table else "timeseries"}


def quantiles(metric: str, by: str = "", qs=QUANTILES, sel: str = SEL) -> list[dict]:
    """histogram_quantile targets for a histogram, one per quantile (optionally per label)."""
    group = f"{by}, le" if by else "le"
    return [
        prom(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RATE}])))",
             f"{{{{{by}}}}} p{int(q * 100)}" if by else f"p{int(q * 100)}")
        for q in qs
    ]


def timeseries(title: str, targets: list[dict], unit: str = "short", w: int = 12, h: int = 8,
               description: str = "", stack: bool = False, ds: dict = PROMETHEUS) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if not stack else 40,
              "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    return {"type": "timeseries", "title": title, "description": description, "datasource": ds,
            "targets": targets, "_size": (w, h),
            "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "right",
                                   "calcs": ["mean", "max", "lastNotNull"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, target: dict, unit: str = "short", w: int = 4, h: int = 4,
         thresholds: list[tuple[float | None, str]] | None = None, description: str = "") -> dict:
    steps = [{"value": v, "color": c} for v, c in (thresholds or [(None, "green")])]
    return {"type": "stat", "title": title, "description": description, "datasource": target["datasource"],
            "targets": [target], "_size": (w, h),
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}}


def table(title: str, targets: list[dict], w: int = 24, h: int = 8, description: str = "",
          hide: tuple[str, ...] = ("Time", "Value", "__name__")) -> dict:
    return {"type": "table", "title": title, "description": description,
            "datasource": targets[0]["datasource"], "targets": targets, "_size": (w, h),
            "fieldConfig": {"defaults": {}, "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm"},
            "transformations": [{"id": "organize",
                                 "options": {"excludeByName": {name: True for name in hide}}}]}


def prometheus_variables() -> list[dict]:
    def query_var(name: str, label: str, query: str) -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": PROMETHEUS,
                "query": {"query": query, "refId": f"{name}-var"}, "refresh": 2, "sort": 1,
                "multi": True, "includeAll": True, "allValue": ".*",
                "current": {"text": "All", "value": "$__all"}}

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        query_var("model", "Model", "label_values(infersight_replica_info, model)"),
        query_var("replica", "Replica", 'label_values(infersight_replica_info{model=~"$model"}, replica)'),
    ]


def dashboard(uid: str, title: str, panels: list[dict], variables: list[dict],
              description: str = "", tags=("infersight",), time_from: str = "now-6h") -> dict:
    """The dashboard, with ids and grid positions assigned in reading order."""
    x = y = row_h = 0
    laid_out = []
    for i, panel in enumerate(panels, start=1):
        panel = dict(panel)
        w, h = panel.pop("_size")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        panel["id"] = i
        panel["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        for j, target in enumerate(panel["targets"]):
            target["refId"] = chr(ord("A") + j)
        x, row_h = x + w, max(row_h, h)
        laid_out.append(panel)
    return {
        "uid": uid, "title": title, "description": description, "tags": list(tags),
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "time": {"from": time_from, "to": "now"}, "refresh": "30s", "timezone": "utc",
        "annotations": {"list": []}, "links": [
            {"type": "dashboards", "tags": ["infersight"], "asDropdown": True, "title": "infersight",
             "includeVars": True, "keepTime": True}],
        "templating": {"list": variables}, "panels": laid_out,
    }
