"""Scrape a registry through the text exposition format, as Prometheus would, and look values up."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.metrics.definitions import engine_families

# the engine half of the metric-name contract, name -> type, from the registry of names
# (telemetry/metrics/definitions.py): the tests check a scrape shows exactly these
CONTRACT = engine_families()


def scrape(registry) -> dict:
    """{sample name: [(labels, value)]} plus {"__types__": {metric name: type}} from the text format."""
    out: dict = {"__types__": {}}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        name = family.name + "_total" if family.type == "counter" else family.name
        out["__types__"][name] = family.type
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(scraped, name, **labels) -> float:
    matches = [v for lbls, v in scraped.get(name, []) if all(lbls.get(k) == str(x) for k, x in labels.items())]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} samples"
    return matches[0]
