"""The prober against a real fleet: sidecar + two `infersight serve` replicas on a tiny model.

One round lands in the store (workload "probe", parseable ids, both modes, both replicas; a batched
probe shares its steps with other sequences); replicas that do not answer are reported while the
round goes on; `infersight probe --pin` copies the stored solo token IDs into probe_baselines; and a
fleet with a [probe] table runs rounds on its own until `fleet down` stops it.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from diagnostics.baseline import pinned_probes
from engine.serving.fleet.config import FleetConfig, ProbeSpec, ReplicaSpec, SidecarSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.serving.processes import alive, infersight_command
from engine.traffic.probe.pin import wait_for_solo_rows
from engine.traffic.probe.runner import run_probe_round
from telemetry.contract.probes import MODES, parse_probe_request_id
from telemetry.store import open_store

pytestmark = pytest.mark.slow

# one decode step per schedule: with multi-step's K up to 16 a filler of the ~200 tokens this context leaves
# finished in ~13 schedules, and on a loaded host the client's probe, sent once every filler had its first token,
# was sometimes admitted after they had all finished (the batched probe then ran alone)
ENGINE = {"served_model_name": "tiny", "max_num_seqs": 8, "num_kv_blocks": 128, "max_model_len": 256,
          "num_scheduler_steps": 1}
ROWS = """
SELECT request_id, replica_id, workload, prompt_token_ids, output_token_ids, scheduled_time, finish_time
FROM requests WHERE startsWith(request_id, {prefix:String}) ORDER BY request_id
"""
BUSY_STEPS = """
SELECT count() AS n FROM steps
WHERE replica_id = {replica:String} AND num_seqs >= 2
  AND start_time >= toDateTime64({start:Float64}, 6, 'UTC') AND start_time <= toDateTime64({end:Float64}, 6, 'UTC')
"""


def _spec(rid: str, model) -> ReplicaSpec:
    return ReplicaSpec(id=rid, model=str(model), threads=1, engine=dict(ENGINE), drain_timeout=2.0)


@pytest.fixture(scope="module")
def fleet(tiny_llama, tmp_path_factory):
    config = FleetConfig(name="probe-test", run_dir=tmp_path_factory.mktemp("probe-fleet"), startup_timeout=240.0,
                         stop_timeout=10.0, sidecar=SidecarSpec(port=0),
                         replicas=[_spec("r0", tiny_llama), _spec("r1", tiny_llama)])
    state = fleet_up(config)
    try:
        yield state
    finally:
        fleet_down(state.run_dir)


def _rows(store, prefix: str, expected: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = store.query_arrow(ROWS, {"prefix": prefix}).to_pylist()
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_a_round_lands_in_the_store_and_unreachable_replicas_are_reported(fleet):
    urls = [r.url for r in fleet.replicas]
    dead = "http://127.0.0.1:1"  # connection refused
    round_ = run_probe_round([urls[0], dead, fleet.store_url, urls[1]], batch_fillers=3)
    assert [r.url for r in round_.replicas] == [urls[0], dead, fleet.store_url, urls[1]]
    down = [r for r in round_.replicas if r.error]
    assert [r.url for r in down] == [dead, fleet.store_url]  # reported; the round went on with the others
    assert all("not an infersight replica" in r.error for r in down)
    live = [r for r in round_.replicas if not r.error]
    assert [r.replica for r in live] == ["r0", "r1"]
    for r in live:
        assert r.failed == 0 and r.ok == len(r.results) and {p.mode for p in r.results} == set(MODES), r.results
    assert not round_.skipped  # no budget, and the near-context probe was built from the 256-token context
    sent = sum(len(r.results) + r.fillers_sent for r in live)
    with open_store(fleet.store_url) as store:
        rows = _rows(store, f"probe.{round_.round_id}.", sent)
        assert len(rows) == sent and {row["workload"] for row in rows} == {"probe"}
        parsed = [parse_probe_request_id(row["request_id"]) for row in rows]
        assert all(p is not None and p.replica_id == row["replica_id"] for p, row in zip(parsed, rows))
        probes = {(p.replica_id, p.mode) for p in parsed if not p.probe_id.startswith("filler_")}
        assert probes == {(rid, mode) for rid in ("r0", "r1") for mode in MODES}
        # a batched probe ran beside its fillers: the replica stepped several sequences during it
        batched = next(row for row, p in zip(rows, parsed) if p.probe_id == "eval_addition" and p.mode == "batched")
        window = {"replica": batched["replica_id"], "start": batched["scheduled_time"].timestamp(),
                  "end": batched["finish_time"].timestamp()}
        deadline = time.monotonic() + 30
        while int(store.query_df(BUSY_STEPS, window)["n"].iloc[0]) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)  # steps flush on their own schedule
        assert int(store.query_df(BUSY_STEPS, window)["n"].iloc[0]) > 0


def test_pin_copies_the_stored_solo_token_ids(fleet):
    proc = subprocess.run(infersight_command("probe", "--fleet", fleet.run_dir, "--no-batched",
                                             "--token-budget", "3000", "--pin", "--replica", "r1",
                                             "--note", "live test"),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    round_id = re.search(r"^probe round (p\d+):", proc.stdout, re.M).group(1)
    assert f"from replica r1 (round {round_id})" in proc.stdout
    with open_store(fleet.store_url) as store:
        solo = wait_for_solo_rows(store, round_id, "r1", timeout=5)
        pins = pinned_probes(store, "tiny")  # what the diagnostics' baseline rule reads
        assert solo and set(solo) <= set(pins)
        for probe_id, row in solo.items():
            pin = pins[probe_id]
            assert (pin["round_id"], pin["replica_id"], pin["note"]) == (round_id, "r1", "live test")
            assert list(pin["prompt_token_ids"]) == list(row["prompt_token_ids"])
            assert list(pin["output_token_ids"]) == list(row["output_token_ids"])
            assert pin["weights_hash"] == row["weights_hash"] != ""
        chat = [p for p in solo if p.startswith("chat_") or p.startswith("eval_")]
        assert chat and all(pins[p]["api"] == "chat" for p in chat)


def test_a_fleet_with_a_probe_table_probes_on_its_own_until_down(fleet, tiny_llama, tmp_path):
    # one replica beside the first fleet's store: no second sidecar to start
    config = FleetConfig(name="probe-scheduled", run_dir=tmp_path / "scheduled", startup_timeout=240.0,
                         stop_timeout=10.0, sidecar=SidecarSpec(url=fleet.store_url),
                         replicas=[_spec("s0", tiny_llama)],
                         probe=ProbeSpec(interval=3.0, token_budget=600, batched=False))
    state = fleet_up(config)
    try:
        assert state.prober and alive(state.prober.ref)
        log = Path(state.prober.log)
        deadline = time.monotonic() + 60
        while log.read_text().count("\nround p") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert log.read_text().count("\nround p") >= 2, log.read_text()
    finally:
        outcome = fleet_down(state.run_dir)
    assert outcome["prober"] == "stopped" and not alive(state.prober.ref)
    assert "stopped after" in log.read_text()  # SIGTERM ended it cleanly
    with open_store(fleet.store_url) as store:
        rounds = store.query_df("SELECT uniqExact(extract(request_id, '^probe\\\\.(p\\\\d+)\\\\.')) AS n FROM requests "
                                "WHERE replica_id = 's0' AND workload = 'probe'")["n"].iloc[0]
    assert rounds >= 2
