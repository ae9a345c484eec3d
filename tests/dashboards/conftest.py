"""Fixtures for the dashboards tests: a real Prometheus on loopback, scraping live exporters."""

from __future__ import annotations

import pytest
from live_prometheus import free_port, running_prometheus

from dashboards.promql import ALERTS_FILE


@pytest.fixture(scope="session")
def engine_metrics_target():
    """host:port of a live engine /metrics (telemetry.metrics fed with real records)."""
    from live_metrics import serve_engine_metrics

    port = free_port()
    server = serve_engine_metrics(port)
    yield f"127.0.0.1:{port}"
    server.shutdown()


@pytest.fixture(scope="session")
def sidecar_metrics_target(tmp_path_factory):
    """host:port of a live sidecar (/metrics with an active finding of every kind we alert on)."""
    from live_metrics import start_sidecar_with_findings

    sidecar = start_sidecar_with_findings(tmp_path_factory.mktemp("sidecar_store"))
    yield sidecar.url.split("://", 1)[1]
    sidecar.stop()


@pytest.fixture(scope="session")
def prometheus_url(tmp_path_factory, engine_metrics_target, sidecar_metrics_target):
    """Debian's `prometheus` on a free loopback port, loading our alert rules and scraping the
    live engine exporter (job infersight-replicas) and a live sidecar (job infersight-sidecar)
    every second."""
    scrape_configs = [
        {"job_name": "infersight-replicas", "honor_labels": True,
         "static_configs": [{"targets": [engine_metrics_target], "labels": {"replica": "r0"}}]},
        {"job_name": "infersight-sidecar", "static_configs": [{"targets": [sidecar_metrics_target]}]},
    ]
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), scrape_configs, [ALERTS_FILE]) as url:
        yield url


# -- the Streamlit dashboard's fixtures ----------------------------------------------------------

@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A real byte-level BPE tokenizer (Hugging Face format), trained once per session."""
    from engine.core.tiny_model import build_bpe_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    build_bpe_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, tokenizer_dir, migrated_copy):
    """(store, Seeded): an embedded store with the known data set of dashboard_seed.

    Module scope: chdb holds one data directory per process, so each module opens and closes
    its own rather than keeping one open across everyone's tests."""
    from dashboard_seed import seed
    from tokenizers import Tokenizer

    from telemetry.store import open_store

    store = open_store(migrated_copy(tmp_path_factory.mktemp("dashboard_store")))
    try:
        info = seed(store, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
        yield store, info
    finally:
        store.close()
