"""The alert rules: valid for promtool, and every rule has unit tests that fire and that stay quiet."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.promql import ALERTS_FILE

PROM_DIR = ALERTS_FILE.parent
TEST_FILES = sorted((PROM_DIR / "tests").glob("*.yml"))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run .ci/setup (Debian package prometheus)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def alert_names() -> list[str]:
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    return [r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_rules_pass_promtool_check():
    result = promtool("check", "rules", str(ALERTS_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in result.stdout


def test_example_prometheus_config_is_valid_and_loads_the_rules():
    result = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout
    jobs = {c["job_name"] for c in yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["scrape_configs"]}
    # the availability rules select these job names
    assert jobs == {"infersight-replicas", "infersight-sidecar"}


def test_promtool_unit_tests_pass():
    assert TEST_FILES, "no promtool unit tests found"
    result = promtool("test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES)


def test_every_alert_has_a_firing_case_and_a_quiet_case():
    firing, quiet = set(), set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alert_names())
    assert names - firing == set(), "alerts without a case that fires"
    assert names - quiet == set(), "alerts without a case that stays quiet"


def test_unit_tests_catch_a_wrong_threshold(tmp_path):
    """The unit tests are not vacuous: with the TTFT SLO raised to 10 s they fail."""
    broken = ALERTS_FILE.read_text().replace(
        "rate(infersight_time_to_first_token_seconds_bucket[5m]))\n          ) > 2",
        "rate(infersight_time_to_first_token_seconds_bucket[5m]))\n          ) > 10")
    assert broken != ALERTS_FILE.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "latency_test.yml"
    shutil.copy(PROM_DIR / "tests" / "latency_test.yml", test_file)
    result = promtool("test", "rules", str(test_file))
    assert result.returncode != 0
    assert "InfersightTTFTP99AboveSLO" in result.stdout + result.stderr
