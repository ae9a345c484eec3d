"""A fleet gives each replica a spool directory of its own under the run directory, the same at
every (re)start, so what a replica spooled before a restart is replayed after it."""

from __future__ import annotations

import argparse

from engine.serving.fleet.config import parse_fleet
from engine.serving.fleet.fleet import replica_command, replica_spool_dir
from engine.serving.server.cli import add_arguments as add_serve_arguments


def _serve_args(cmd: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(cmd[cmd.index("serve") + 1:])


def test_each_replica_spools_under_the_run_dir_at_every_start(tmp_path):
    config = parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "a"}, {"id": "b"}, {"id": "../escape"}]})
    dirs = [replica_spool_dir(tmp_path, spec.id) for spec in config.replicas]
    assert dirs == [replica_spool_dir(tmp_path, spec.id) for spec in config.replicas]  # stable
    assert len(set(dirs)) == 3 and all(d.parent == tmp_path / "spool" for d in dirs)  # own, and inside
    for spec, spool_dir in zip(config.replicas, dirs):
        cmd = replica_command(spec, tmp_path, "127.0.0.1", 9999, "http://127.0.0.1:1", spool_dir=spool_dir)
        assert _serve_args(cmd).spool_dir == str(spool_dir)


def test_serve_without_spool_dir_leaves_the_default_to_the_replica_id(tmp_path):
    config = parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "a"}]})
    args = _serve_args(replica_command(config.replicas[0], tmp_path, "127.0.0.1", 9999, None))
    assert args.spool_dir is None and args.spool_max_bytes == 256 * 1024**2
    assert _serve_args(["serve", "--model", "m", "--spool-max-bytes", "40KiB"]).spool_max_bytes == 40 * 1024
