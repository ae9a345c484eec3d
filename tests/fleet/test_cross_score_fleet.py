"""Continuous cross-scoring in a real local fleet: on by default (the fleet's prober cross-scores with no
[cross_score] table), its rescore requests reach the store; `enabled = false` starts nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from engine.serving.fleet.config import parse_fleet
from engine.serving.fleet.fleet import fleet_down, fleet_up
from telemetry.contract.probes import RESCORE_WORKLOAD
from telemetry.store import open_store


def _config(model: Path, run_dir: Path, replicas: int, cross: dict | None) -> dict:
    data = {"fleet": {"name": run_dir.name, "run_dir": str(run_dir), "startup_timeout": 240, "stop_timeout": 10},
            "sidecar": {"port": 0},
            "defaults": {"model": str(model), "threads": 1, "drain_timeout": 2,
                         "engine": {"max_num_seqs": 4, "num_kv_blocks": 64, "max_model_len": 256}},
            "replica": [{"id": f"r{i}"} for i in range(replicas)]}
    if cross is not None:
        data["cross_score"] = cross
    return data


async def _traffic(urls: list[str], model: str, n: int) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(client.post(urls[i % len(urls)] + "/v1/completions", json={
            "model": model, "prompt": f"item {i} is", "temperature": 1.0, "max_tokens": 5, "ignore_eos": True},
            headers={"X-Request-Id": f"xs-{i}", "X-Workload": "chat"}) for i in range(n)))


def _rescored(store_url: str) -> int:
    with open_store(store_url) as store:
        return int(store.query_arrow(f"SELECT count() AS n FROM requests WHERE workload = '{RESCORE_WORKLOAD}'")
                   .to_pylist()[0]["n"])


@pytest.mark.slow
def test_a_fleet_cross_scores_by_default_and_one_setting_turns_it_off(tiny_llama, tmp_path):
    # the default is on: only the share and interval are raised, so a short test sees passes that pick
    config = parse_fleet(_config(tiny_llama, tmp_path / "on", 2, {"share": 1.0, "token_share": 1.0, "interval": "2s"}))
    assert config.cross_score.enabled
    state = fleet_up(config)
    try:
        assert state.prober is not None and "--cross-score" in state.prober.cmd
        asyncio.run(_traffic([r.url for r in state.replicas], tiny_llama.name, 12))
        deadline = time.monotonic() + 120
        while _rescored(state.store_url) == 0:
            assert time.monotonic() < deadline, Path(state.prober.log).read_text()[-2000:]
            time.sleep(0.25)
    finally:
        fleet_down(state.run_dir)

    off = fleet_up(parse_fleet(_config(tiny_llama, tmp_path / "off", 1, {"enabled": False})))
    try:
        assert off.prober is None  # owns its store, the one case where a lone replica's fleet would start it
    finally:
        fleet_down(off.run_dir)
