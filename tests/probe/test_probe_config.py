"""The fleet's [probe] table (parsed, checked key by key, turned into the prober's command), and the
`infersight probe` errors a person meets first: messages and an exit status, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.console.cli import main
from engine.serving.fleet.config import load_fleet, parse_fleet
from engine.serving.fleet.fleet import prober_command

EXAMPLES = Path(__file__).resolve().parents[2] / "engine" / "serving" / "fleet" / "examples"


def _fleet(probe) -> dict:
    return {"defaults": {"model": "m"}, "replica": [{"id": "a"}], "probe": probe}


def test_canary_example_probes_every_minute():
    config = load_fleet(EXAMPLES / "canary.toml")
    assert [r.id for r in config.replicas] == ["r0", "r1"]
    assert config.probe.interval == 60.0 and config.probe.batched and config.probe.enabled


def test_probe_table_defaults_and_command(tmp_path):
    assert parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "a"}]}).probe is None
    spec = parse_fleet(_fleet({"interval": "3s", "token_budget": 500, "batched": False})).probe
    assert (spec.interval, spec.token_budget, spec.batched, spec.enabled) == (3.0, 500, False, True)
    cmd = prober_command(tmp_path, spec)
    assert cmd[cmd.index("probe"):] == ["probe", "--fleet", str(tmp_path), "--every", "3s", "--token-budget", "500",
                                        "--no-batched"]
    assert parse_fleet(_fleet({"interval": 90})).probe.interval == 90.0


@pytest.mark.parametrize("probe, words", [
    ({"intervl": "3s"}, ["[probe]", "intervl", "interval"]),
    ({"interval": "soon"}, ["[probe]", "soon"]),
    ({"interval": 0}, ["[probe]", "more than 0"]),
    ({"token_budget": -5}, ["token_budget"]),
    ({"token_budget": "lots"}, ["token_budget"]),
    ({"batched": "yes"}, ["batched", "true or false"]),
    ("60s", ["[probe] must be a table"]),
])
def test_bad_probe_tables_name_the_problem(probe, words):
    with pytest.raises(ValueError) as e:
        parse_fleet(_fleet(probe))
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("argv, words", [
    (["probe", "--fleet", "no-such-fleet-here"], ["no fleet state"]),
    (["probe", "--endpoints", "http://127.0.0.1:1", "--pin", "--every", "5s"], ["--pin pins one round"]),
    (["probe", "--endpoints", "http://127.0.0.1:1", "--note", "x"], ["go with --pin"]),
])
def test_cli_errors_are_messages_not_tracebacks(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert all(w in err for w in words) and "Traceback" not in err, err


def test_cli_reports_an_unreachable_replica(capsys):
    assert main(["probe", "--endpoints", "http://127.0.0.1:1"]) == 1
    out = capsys.readouterr().out
    assert "http://127.0.0.1:1" in out and "not an infersight replica" in out


def test_pin_without_a_store_fails_before_the_round(capsys):
    assert main(["probe", "--endpoints", "http://127.0.0.1:1", "--pin"]) == 1
    captured = capsys.readouterr()
    assert "--pin needs a store" in captured.err and "probe round" not in captured.out
