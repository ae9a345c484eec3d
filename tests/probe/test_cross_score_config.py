"""The fleet's [cross_score] table: on by default, off with one setting, checked key by key, and turned
into the prober's command (alone, or beside the scheduled probe rounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.console.cli import main
from engine.serving.fleet.config import load_fleet, parse_fleet
from engine.serving.fleet.fleet import prober_command

EXAMPLES = Path(__file__).resolve().parents[2] / "engine" / "serving" / "fleet" / "examples"


def _fleet(cross=None, replicas=2) -> dict:
    data = {"defaults": {"model": "m"}, "replica": [{"id": f"r{i}"} for i in range(replicas)]}
    if cross is not None:
        data["cross_score"] = cross
    return data


def test_on_by_default_where_the_fleet_owns_its_store_or_has_two_replicas():
    spec = parse_fleet(_fleet()).cross_score
    assert spec.enabled and spec.wanted(owns_store=True, replicas=1) and spec.wanted(owns_store=False, replicas=2)
    assert not spec.wanted(owns_store=False, replicas=1)  # a lone canary writing to another's store: the owner scores it


def test_one_setting_turns_it_off():
    spec = parse_fleet(_fleet({"enabled": False})).cross_score
    assert not spec.wanted(owns_store=True, replicas=3)


def test_shipped_canary_cross_scores_beside_its_probe_rounds(tmp_path):
    config = load_fleet(EXAMPLES / "canary.toml")
    assert config.cross_score.enabled
    cmd = prober_command(tmp_path, config.probe, config.cross_score)
    tail = cmd[cmd.index("probe"):]
    assert tail[:3] == ["probe", "--fleet", str(tmp_path)] and "--cross-score" in tail and "--every" in tail
    assert tail[tail.index("--cross-share") + 1] == f"{config.cross_score.settings.share:g}"


def test_cross_scoring_alone_is_a_prober_without_rounds(tmp_path):
    spec = parse_fleet(_fleet({"share": 0.1, "token_share": 0.02, "interval": "30s"})).cross_score
    cmd = prober_command(tmp_path, None, spec)
    assert cmd[cmd.index("probe"):] == ["probe", "--fleet", str(tmp_path), "--cross-score", "--cross-share", "0.1",
                                        "--cross-token-share", "0.02", "--cross-interval", "30s"]


@pytest.mark.parametrize("cross, words", [
    ({"shar": 0.1}, ["[cross_score]", "shar", "share"]),
    ({"share": 0}, ["[cross_score]", "share", "(0, 1]"]),
    ({"share": 1.5}, ["[cross_score]", "share"]),
    ({"token_share": -0.1}, ["token share"]),
    ({"interval": "soon"}, ["[cross_score]", "soon"]),
    ({"enabled": "no"}, ["enabled"]),
    ("on", ["[cross_score] must be a table"]),
])
def test_bad_tables_name_the_problem(cross, words):
    with pytest.raises(ValueError) as e:
        parse_fleet(_fleet(cross))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_cli_bad_share_is_a_message(capsys):
    assert main(["probe", "--endpoints", "http://127.0.0.1:1", "--store", "http://127.0.0.1:1", "--cross-score",
                 "--cross-share", "2"]) == 1
    err = capsys.readouterr().err
    assert "share" in err and "Traceback" not in err, err
