"""`infersight eval gate` as the README writes it works from any directory: the default policy's suites and
the example configurations' models are found wherever the command runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine.serving.processes import infersight_command
from evals.cli import DEFAULT_POLICY
from evals.policy import load_policy
from evals.sides import load_engine_config
from evals.suite import load_suite

EXAMPLES = Path(__file__).resolve().parents[2] / "evals" / "examples"


def test_default_policy_suites_resolve_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = load_policy(DEFAULT_POLICY)
    assert policy.suites
    for suite in policy.suites:
        assert Path(suite).is_file(), suite
        assert load_suite(suite).items


def test_a_copied_policy_finds_the_shipped_suites(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "deploy" / "gate.toml"
    mine.parent.mkdir()
    mine.write_text(Path(DEFAULT_POLICY).read_text())
    assert all(Path(s).is_file() for s in load_policy(mine).suites)


def test_example_configurations_load_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("production.toml", "candidate.toml"):
        config = load_engine_config(EXAMPLES / name)
        assert (Path(config.model) / "config.json").is_file(), name


def test_example_contexts_fit_the_model():
    import json

    for name in ("production.toml", "candidate.toml"):
        config = load_engine_config(EXAMPLES / name)
        positions = json.loads((Path(config.model) / "config.json").read_text())["max_position_embeddings"]
        assert config.max_model_len is None or config.max_model_len <= positions, name


@pytest.mark.slow
def test_readme_gate_command_runs_from_another_directory(tmp_path):
    r = subprocess.run(infersight_command("eval", "gate", "--baseline", str(EXAMPLES / "production.toml"),
                                          "--candidate", str(EXAMPLES / "candidate.toml"), "--report-md", "gate.md",
                                          "--no-progress"),
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "gate.md").read_text().startswith("# Eval gate: **PASS**")
