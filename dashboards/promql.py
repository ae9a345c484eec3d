"""PromQL found in our alert rules and Grafana dashboards, and the metric names it uses.

Used by the tests (every expression uses only contract metrics and is accepted by a real
Prometheus) and handy for anyone auditing the dashboards.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ALERTS_FILE = HERE / "prometheus" / "alerts.yml"
GRAFANA_DIR = HERE / "grafana"

PROMETHEUS_DS = "prometheus"

# Words of the language that look like metric names but are not.
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\{[^}]*\})?(\s*\()?")
_GRAFANA_VAR = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)")

# What a Grafana variable stands for when an expression is checked outside Grafana.
_GRAFANA_VALUES = {
    "__rate_interval": "5m", "__interval": "1m", "__range": "1h",
    "__range_s": "3600", "__interval_ms": "60000",
}


@dataclass(frozen=True)
class Expression:
    where: str  # "alerts.yml: InfersightReplicaDown", "overview.json: panel 'TTFT'" ...
    expr: str


def _blank(m: re.Match) -> str:
    return " " * len(m.group(0))


def _blank_string(m: re.Match) -> str:
    text = m.group(0)
    return text[0] + " " * (len(text) - 2) + text[-1]


def selectors(expr: str) -> list[str]:
    """The vector selectors of an expression (`name` or `name{matchers}`), as written.

    String contents, range brackets and grouping clauses are blanked (positions kept), then
    every identifier that is not a function call or a keyword is a metric name, with the
    label matchers that follow it."""
    masked = _STRING.sub(_blank_string, expr)
    masked = _RANGE.sub(_blank, masked)
    masked = _GROUPING.sub(_blank, masked)
    out = []
    for m in _SELECTOR.finditer(masked):
        name, matchers, call = m.group(1), m.group(2), m.group(3)
        if (call and not matchers) or name.lower() in _KEYWORDS:
            continue
        out.append(expr[m.start(1):m.end(2) if matchers else m.end(1)])
    return out


def metric_names(expr: str) -> set[str]:
    """Metric (series) names an expression selects."""
    return {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s).group(0) for s in selectors(expr)}


def substitute_grafana_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace `$var` / `${var}` as Grafana would (regex-matcher variables become `.*`)."""
    table = {**_GRAFANA_VALUES, **(values or {})}

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return table.get(name, ".*")

    return _GRAFANA_VAR.sub(repl, expr)


def alert_expressions(path: Path = ALERTS_FILE) -> list[Expression]:
    doc = yaml.safe_load(path.read_text())
    out = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            out.append(Expression(f"{path.name}: {name}", rule["expr"]))
    return out


def grafana_dashboards(directory: Path = GRAFANA_DIR) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _panels(dashboard: dict):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def dashboard_expressions(directory: Path = GRAFANA_DIR) -> list[Expression]:
    """PromQL of every Prometheus panel target and query variable (label_values(sel, l) -> sel)."""
    out = []
    for file, dash in grafana_dashboards(directory).items():
        for panel in _panels(dash):
            for target in panel.get("targets", []):
                ds = target.get("datasource") or panel.get("datasource") or {}
                if ds.get("type") == PROMETHEUS_DS and target.get("expr"):
                    out.append(Expression(f"{file}: panel '{panel.get('title')}'", target["expr"]))
        for var in dash.get("templating", {}).get("list", []):
            ds = var.get("datasource") or {}
            if var.get("type") != "query" or ds.get("type") != PROMETHEUS_DS:
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", query)
            out.append(Expression(f"{file}: variable {var['name']}", m.group(1) if m else query))
    return out


def clickhouse_queries(directory: Path = GRAFANA_DIR) -> list[Expression]:
    """SQL of every ClickHouse panel target and query variable."""
    out = []
    for file, dash in grafana_dashboards(directory).items():
        for panel in _panels(dash):
            for target in panel.get("targets", []):
                ds = target.get("datasource") or panel.get("datasource") or {}
                if ds.get("type") == "grafana-clickhouse-datasource" and target.get("rawSql"):
                    out.append(Expression(f"{file}: panel '{panel.get('title')}'", target["rawSql"]))
        for var in dash.get("templating", {}).get("list", []):
            ds = var.get("datasource") or {}
            if var.get("type") == "query" and ds.get("type") == "grafana-clickhouse-datasource":
                out.append(Expression(f"{file}: variable {var['name']}", var["query"]))
    return out
