"""The CLI in scripts: `| head` ends a command quietly, help texts are clean, ports are chosen by the user."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dashboards.console.cli import build_parser


def _closed_reader(*argv: str) -> subprocess.CompletedProcess:
    """Run `infersight ARGV` with its stdout's reader gone before the first write (as `| head -0` leaves it)."""
    proc = subprocess.Popen([sys.executable, "-m", "dashboards.console.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the child is still importing: every write it makes meets a closed pipe
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, b"", err)


@pytest.mark.parametrize("argv", [("fleet", "status", "--json", "--run-dir", "{run_dir}"), ("serve", "--help")])
def test_closed_pipe_is_no_traceback(argv, tmp_path):
    from engine.serving.fleet.state import FleetState

    state = FleetState(name="t", run_dir=str(tmp_path), created=0.0, store_url="")
    state.events = [f"event {i}" for i in range(2000)]  # more than a pipe buffer of JSON
    state.save()
    done = _closed_reader(*(a.format(run_dir=tmp_path) for a in argv))
    err = done.stderr.decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert done.returncode in (0, 1, 141)


def test_fleet_help_hides_internal_action_cleanly(capsys):
    with pytest.raises(SystemExit):
        build_parser(load="fleet").parse_args(["fleet", "--help"])
    out = capsys.readouterr().out
    assert "SUPPRESS" not in out and "supervise" not in out and "status" in out


@pytest.mark.parametrize("command", ["serve", "sidecar", "dashboard", "demo", "proxy"])
def test_every_listening_command_takes_host_and_port(command):
    parser = build_parser(load=command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    flags = {s for a in sub._actions for s in a.option_strings}
    assert {"--host", "--port"} <= flags, (command, sorted(flags))


def test_fleet_up_takes_host_and_base_port():
    args = build_parser(load="fleet").parse_args(["fleet", "up", "--config", "x.toml", "--host", "0.0.0.0",
                                                  "--base-port", "9100", "--sidecar-port", "9099"])
    assert (args.host, args.base_port, args.sidecar_port) == ("0.0.0.0", 9100, 9099)


def test_base_port_fills_the_ports_the_toml_left_0():
    from engine.serving.fleet.config import override_ports, parse_fleet

    config = parse_fleet({"replica": [{"id": "a", "model": "m"}, {"id": "b", "model": "m", "port": 9200},
                                      {"id": "c", "model": "m"}]})
    override_ports(config, host="0.0.0.0", base_port=9100, sidecar_port=9099)
    assert [r.port for r in config.replicas] == [9100, 9200, 9102]
    assert (config.host, config.sidecar.port) == ("0.0.0.0", 9099)
    clash = parse_fleet({"replica": [{"id": "a", "model": "m"}, {"id": "b", "model": "m", "port": 9100}]})
    with pytest.raises(ValueError, match="9100"):
        override_ports(clash, base_port=9100)


def test_demo_ports(tmp_path):
    from dashboards.console.demo import demo_fleet

    args = build_parser(load="demo").parse_args(["demo", "--replicas", "2", "--port", "9300", "--base-port", "9301",
                                                 "--run-dir", str(tmp_path)])
    config = demo_fleet(args, tmp_path)
    assert config.sidecar.port == 9300 and [r.port for r in config.replicas] == [9301, 9302]
    default = demo_fleet(build_parser(load="demo").parse_args(["demo", "--run-dir", str(tmp_path)]), tmp_path)
    assert default.sidecar.port == 0 and all(r.port == 0 for r in default.replicas)


def test_dashboard_on_a_data_directory_takes_the_sidecar_port():
    args = build_parser(load="dashboard").parse_args(["dashboard", "--store", "/data", "--port", "8600",
                                                      "--sidecar-port", "8124"])
    assert (args.port, args.sidecar_port) == (8600, 8124)
    assert build_parser(load="dashboard").parse_args(["dashboard", "--store", "/data"]).sidecar_port == 0
