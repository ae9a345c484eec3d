"""The recording rules that give vLLM's series the infersight names: written from one table, that table
covering the whole metric contract, and promtool agreeing with it on a real vLLM scrape (the one
committed in dashboards/prometheus/samples/, and a live one where vLLM is installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from dashboards import metric_contract
from dashboards.vllm_mapping import (MAPPINGS, RECORDED_SCRAPE, REPLICA_INFO, RULES_FILE, UNMAPPED, promtool_test,
                                     render, scrape_samples)

TARGET = {"job": "infersight-replicas", "replica": "v0", "instance": "127.0.0.1:8132"}
PROMETHEUS_DIR = RULES_FILE.parent
METRICS_MD = RULES_FILE.parents[2] / "telemetry" / "METRICS.md"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run .ci/setup (Debian package prometheus)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def run_on_scrape(scrape: str, tmp_path, rules_file=RULES_FILE) -> tuple[subprocess.CompletedProcess, list[str]]:
    document, missing = promtool_test(scrape, TARGET)
    document["rule_files"] = [str(rules_file)]
    path = tmp_path / "vllm_scrape_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return promtool("test", "rules", str(path)), missing


def test_the_rules_file_is_written_from_the_table():
    assert RULES_FILE.read_text() == render(), "stale: run python -m dashboards.vllm_mapping"
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_table_covers_the_engine_metric_contract():
    families = set(metric_contract.ENGINE_HISTOGRAMS + metric_contract.ENGINE_GAUGES + metric_contract.ENGINE_COUNTERS)
    mapped = {m.infersight for m in MAPPINGS} | {REPLICA_INFO}
    assert mapped <= families  # only names the dashboards may use
    unmapped = {n for n in UNMAPPED if "*" not in n}
    telemetry_rows = {f for f in families if f.startswith("infersight_telemetry_rows_")}
    assert families - mapped - unmapped - telemetry_rows == set(), "a contract metric neither mapped nor explained"


def test_metrics_md_shows_every_row_of_the_table():
    text = METRICS_MD.read_text()
    for m in MAPPINGS:
        assert f"`{m.infersight}`" in text and f"`{m.vllm}`" in text, m.infersight


def test_the_recorded_scrape_has_every_series_the_table_names():
    names = {name for name, _, _ in scrape_samples(RECORDED_SCRAPE.read_text())}
    absent = {theirs for m in MAPPINGS for _, theirs in m.series()} - names
    # vLLM exports its speculative-decoding series only when it runs speculative decoding
    assert absent == {theirs for m in MAPPINGS if "spec_decode" in m.vllm for _, theirs in m.series()}


def test_promtool_maps_the_recorded_vllm_scrape(tmp_path):
    result, _ = run_on_scrape(RECORDED_SCRAPE.read_text(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_that_keep_vllms_label_fail_on_the_scrape(tmp_path):
    """Not vacuous: rules without the model_name -> model relabelling fail the same test."""
    broken = tmp_path / "broken_rules.yml"
    broken.write_text(RULES_FILE.read_text().replace('"model", "$1", "model_name", "(.*)"',
                                                     '"model_copy", "$1", "model_name", "(.*)"'))
    result, _ = run_on_scrape(RECORDED_SCRAPE.read_text(), tmp_path, broken)
    assert result.returncode != 0


def test_the_mixed_fleet_prometheus_config_loads_both_rule_files():
    result = promtool("check", "config", str(PROMETHEUS_DIR / "prometheus-mixed.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout
