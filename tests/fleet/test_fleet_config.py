"""Fleet configs: the shipped examples load, every mistake is an error that names it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.serving.fleet.config import load_fleet, parse_fleet
from engine.serving.fleet.fleet import replica_command
from engine.serving.server.cli import add_arguments as add_serve_arguments
from engine.serving.server.engine_args import engine_cli_args, engine_config_from_args, parse_size

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "engine" / "serving" / "fleet" / "examples").glob("*.toml"))


def _fleet(**replica):
    return {"defaults": {"model": "m"}, "replica": [{"id": "a", **replica}]}


def test_examples_load():
    assert {p.stem for p in EXAMPLES} >= {"two_replicas", "three_replicas_pinned", "int8_vs_fp32"}
    for path in EXAMPLES:
        config = load_fleet(path)
        assert len(config.replicas) >= 2
        assert len({r.id for r in config.replicas}) == len(config.replicas)
    pinned = load_fleet(EXAMPLES[[p.stem for p in EXAMPLES].index("three_replicas_pinned")])
    assert len({r.cpus for r in pinned.replicas}) < len(pinned.replicas)  # one placed differently
    pair = load_fleet(EXAMPLES[[p.stem for p in EXAMPLES].index("int8_vs_fp32")])
    assert sorted(r.engine.get("quantization") for r in pair.replicas) == ["int8", "none"]


def test_defaults_merge_and_ports():
    config = parse_fleet({"fleet": {"name": "x", "base_port": 9000},
                          "defaults": {"model": "m", "engine": {"block_size": 8, "max_num_seqs": 4}},
                          "replica": [{"id": "a"}, {"id": "b", "port": 9500, "engine": {"block_size": 32}}]})
    a, b = config.replicas
    assert (a.port, b.port) == (9000, 9500)
    assert a.engine == {"block_size": 8, "max_num_seqs": 4}
    assert b.engine == {"block_size": 32, "max_num_seqs": 4}
    assert str(config.run_dir).endswith("fleets/x")


@pytest.mark.parametrize("data, words", [
    ({"replica": [{"id": "a", "model": "m", "colour": "red"}]}, ["colour"]),
    ({"fleet": {"nme": "x"}, "replica": [{"id": "a", "model": "m"}]}, ["nme"]),
    (_fleet(engine={"blok_size": 8}), ["blok_size", "block_size"]),
    ({"defaults": {"model": "m"}, "replica": [{"id": "a"}, {"id": "a"}]}, ["duplicate", "a"]),
    ({"defaults": {"model": "m"}, "replica": [{"id": "a", "port": 9001}, {"id": "b", "port": 9001}]}, ["9001"]),
    ({"replica": [{"id": "a"}]}, ["no model"]),
    ({"fleet": {"name": "x"}}, ["[[replica]]"]),
    (_fleet(engine={"enable_prefix_caching": "yes"}), ["true or false"]),
    (_fleet(role="canary"), ["role", "baseline", "candidate", "'canary'"]),
    (_fleet(engine={"role": "candidate"}), ["replica's `role`"]),
])
def test_bad_configs_name_the_problem(data, words):
    with pytest.raises(ValueError) as e:
        parse_fleet(data)
    for word in words:
        assert word in str(e.value)


def test_bad_toml_file(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("[fleet\nname=")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_fleet(path)
    with pytest.raises(ValueError, match="no such fleet config"):
        load_fleet(tmp_path / "missing.toml")


def test_replica_command_parses_back_into_the_engine_config(tmp_path):
    """What the fleet writes on a replica's command line is what `serve` turns into an EngineConfig."""
    config = parse_fleet({"defaults": {"model": "m"}, "replica": [{
        "id": "r7", "cpus": "0", "engine": {"block_size": 8, "kv_cache_memory_bytes": "16MiB",
                                            "enable_prefix_caching": False, "quant_skip_layers": ["lm_head", "q"],
                                            "quantization": "int8"}}]})
    cmd = replica_command(config.replicas[0], tmp_path, "127.0.0.1", 9999, "http://127.0.0.1:1")
    argv = cmd[cmd.index("serve") + 1:]
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    engine = engine_config_from_args(args.model, args)
    assert (engine.replica_id, engine.block_size, engine.quantization) == ("r7", 8, "int8")
    assert engine.kv_cache_memory_bytes == 16 * 1024**2
    assert engine.enable_prefix_caching is False
    assert engine.quant_skip_layers == ["lm_head", "q"]
    assert (args.cpus, args.port, args.store) == ("0", 9999, "http://127.0.0.1:1")


def test_a_role_and_the_fleets_deploy_time_reach_the_engine_config(tmp_path):
    """`role` of a replica and `fleet up`'s one deploy instant are `serve` options, in the engine's config (and so
    in its replica row); without a role none is passed."""
    config = parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "r0"}, {"id": "r1", "role": "candidate"}]})
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    engines = []
    for spec in config.replicas:
        cmd = replica_command(spec, tmp_path, "127.0.0.1", 9999, None, deploy_time=1_700_000_000.25)
        args = parser.parse_args(cmd[cmd.index("serve") + 1:])
        engines.append(engine_config_from_args(args.model, args))
    assert [(e.role, e.deploy_time) for e in engines] == [("", 1_700_000_000.25), ("candidate", 1_700_000_000.25)]
    canary = load_fleet(EXAMPLES[[p.stem for p in EXAMPLES].index("canary")])
    assert [r.role for r in canary.replicas] == ["baseline", "candidate"]
    # a role serve does not know is refused, naming the ones it knows
    args = parser.parse_args(["--model", "m", "--role", "canary"])
    with pytest.raises(ValueError, match="role must be one of"):
        engine_config_from_args(args.model, args)


def test_sizes_and_unknown_engine_options():
    assert parse_size("64MiB") == 64 * 1024**2
    assert parse_size("1GB") == 10**9
    assert parse_size("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")
    with pytest.raises(ValueError, match="unknown engine option 'speed'"):
        engine_cli_args({"speed": 11})
