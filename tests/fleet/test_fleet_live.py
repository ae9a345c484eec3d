"""A real local fleet through the CLI: up (sidecar + 2 pinned replicas), status, a replica killed
(reported; restarted where configured), down - and nothing left running afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engine.serving.processes import alive, infersight_command
from engine.serving.fleet.state import FleetState


def infersight(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(infersight_command(*args), capture_output=True, text=True, timeout=timeout)


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (a run directory): what a fleet left behind."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def write_config(path: Path, model: Path, run_dir: Path, last_cpu: int) -> Path:
    path.write_text(f"""
[fleet]
name = "test-fleet"
run_dir = "{run_dir}"
startup_timeout = 150
stop_timeout = 10

[sidecar]
port = 0

[defaults]
model = "{model}"
threads = 1
drain_timeout = 2
engine = {{ max_num_seqs = 4, num_kv_blocks = 64, max_model_len = 256 }}

[[replica]]
id = "a"
cpus = "0"
restart = true

[[replica]]
id = "b"
cpus = "{last_cpu}"
""")
    return path


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@pytest.mark.slow
def test_fleet_up_status_kill_restart_down(tiny_llama, tmp_path):
    run_dir = tmp_path / "run"
    last_cpu = max(os.sched_getaffinity(0))
    config = write_config(tmp_path / "fleet.toml", tiny_llama, run_dir, last_cpu)
    try:
        up = infersight("fleet", "up", "--config", str(config))
        assert up.returncode == 0, up.stdout + up.stderr
        state = FleetState.load(run_dir)
        assert [r.name for r in state.replicas] == ["a", "b"]
        for r in state.replicas:
            assert r.url in up.stdout
        assert state.sidecar is not None and state.supervisor is not None  # "a" restarts: someone watches
        a, b = state.replicas
        assert cpus_allowed(a.pid) == "0" and cpus_allowed(b.pid) == str(last_cpu)

        status = infersight("fleet", "status", "--run-dir", str(run_dir), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout)["processes"]
        assert {r["name"]: r["healthy"] for r in rows} == {"supervisor": True, "a": True, "b": True,
                                                           "sidecar": True, "prober": True}  # cross-scoring
        for r in state.replicas:
            done = httpx.post(r.url + "/v1/completions", timeout=60, json={
                "model": tiny_llama.name, "prompt": "hi", "max_tokens": 3}, headers={"X-Request-Id": f"fl-{r.name}"})
            assert done.status_code == 200

        # b dies and is not restarted: reported
        os.kill(b.pid, signal.SIGKILL)
        wait_for(lambda: not alive(b.ref), 10, "b to die")
        status = infersight("fleet", "status", "--run-dir", str(run_dir))
        assert status.returncode == 1
        assert "DEAD" in status.stdout
        wait_for(lambda: any("replica b" in e and "died" in e for e in FleetState.load(run_dir).events), 30,
                 "the supervisor to report b")

        # a dies and comes back on the same port
        os.kill(a.pid, signal.SIGKILL)
        restarted = wait_for(lambda: next((r for r in FleetState.load(run_dir).replicas
                                           if r.name == "a" and r.restarts == 1 and r.pid != a.pid), None),
                             60, "a to be restarted")
        wait_for(lambda: _healthy(restarted.url), 150, "a to be healthy again")
        assert cpus_allowed(restarted.pid) == "0"

        # the store saw both starts of a, pinned as configured
        from telemetry.store import open_store

        with open_store(state.store_url) as store:
            def both_starts():  # the restarted replica's recorder ships its identity row with its next flush
                df = store.query_df("SELECT replica_id, cpu_affinity FROM replicas ORDER BY start_time")
                return [df] if list(df["replica_id"]).count("a") == 2 else None

            starts = wait_for(both_starts, 30, "a's second start in the store")[0]
        assert all(list(c) == [0] for c in starts[starts["replica_id"] == "a"]["cpu_affinity"])

        down = infersight("fleet", "down", "--run-dir", str(run_dir))
        assert down.returncode == 0, down.stdout + down.stderr
        assert not (run_dir / "state.json").exists()
    finally:
        if (run_dir / "state.json").exists():
            infersight("fleet", "down", "--run-dir", str(run_dir))
    assert processes_mentioning(str(run_dir)) == []


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_failed_start_leaves_nothing_running(tiny_llama, tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "bad.toml"
    config.write_text(f"""
[fleet]
name = "bad"
run_dir = "{run_dir}"
[defaults]
model = "{tiny_llama}"
[[replica]]
id = "x"
engine = {{ dtype = "float99" }}
""")
    up = infersight("fleet", "up", "--config", str(config))
    assert up.returncode == 1
    assert "replica" in up.stderr or "exited during startup" in up.stderr
    assert "float99" in up.stderr  # the replica's own error, from its log
    assert not (run_dir / "state.json").exists()
    assert processes_mentioning(str(run_dir)) == []


def test_status_without_a_fleet_is_an_error(tmp_path):
    r = infersight("fleet", "status", "--run-dir", str(tmp_path))
    assert r.returncode == 1 and "no fleet state" in r.stderr
    r = infersight("fleet", "up", "--config", str(tmp_path / "none.toml"))
    assert r.returncode == 1 and "no such fleet config" in r.stderr
