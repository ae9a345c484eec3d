"""One sample of a replica's /metrics, read as Prometheus parses it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scraped_metric(url: str, name: str, **labels) -> float:
    """The value of sample `name` with `labels` on `url`/metrics (AssertionError when there is none)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no metric {name} {labels}")
