"""Fault injection on real local fleets (sidecar + `infersight serve` replicas) under the same traffic.

Each fault is ordinary configuration, not a flag in the product:
- r1: a copy of the model whose tokenizer.json has a Lowercase normalizer;
- r2: int4 weights (engine option quantization = "int4");
- r3: a copy of the model with an altered chat template (chat_template.jinja);
- r4: pinned to one CPU (--cpus) beside a busy neighbour (two CPU-burning processes on that CPU);
- r0: clean.
The right finding must name the right replica, and a clean fleet under the same traffic must
yield nothing above info. The outcome table (faults tried, detected, missed, false positives)
is printed (`pytest -s` shows it).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import time

import pytest
from diag_faults import ALTERED_TEMPLATE, with_chat_template, with_normalizer

from diagnostics import DIAGNOSTICS
from diagnostics import run as run_diagnostics
from diagnostics.findings import format_table
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from diagnostics.stack_groups import GROUPS
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.serving.processes import infersight_command
from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import RequestSpec, Workload
from telemetry.contract import derived
from telemetry.store import open_store
from telemetry.store.waiting import wait_for_requests

pytestmark = pytest.mark.slow

TRAFFIC_SECONDS = 25.0
RATE = 6.0  # requests/s over the fleet: replicas are busy, not saturated
ENGINE = {"served_model_name": "tiny", "max_num_seqs": 8, "num_kv_blocks": 128, "max_model_len": 512}
SERVE_ARGS = ["--store-text"]  # the recorder stores prompt and output text (the text checks need it)

def prompt(i: int) -> tuple[str, str]:
    """(api, text): capitals in most (the lowercasing tokenizer differs there), chat and completions."""
    if i % 4 == 3:
        return "completions", f"count the tokens in record {i}: one two three four five"
    if i % 2:
        return "chat", f"Question {i}: What does the Scheduler do when Request {i} arrives?"
    return "completions", f"Summarize record {i}: The KV Cache on Replica {i % 7} is FULL again."


class RepeatedGreedy(Workload):
    """Prompts each sent `copies` times in a row: with round-robin picking, once to every replica.
    Greedy and of fixed length, so replicas of one model should answer identically."""

    def __init__(self, copies: int, seed: int = 0):
        super().__init__("greedy-pool", seed, max_tokens=16)
        self.copies, self.sent = copies, 0

    def next(self) -> RequestSpec:
        api, text = prompt(self.sent // self.copies)
        self.sent += 1
        common = {"max_tokens": 16, "temperature": 0.0, "ignore_eos": True}
        if api == "chat":
            return RequestSpec("chat", "chat", {"messages": [{"role": "user", "content": text}], **common}, stream=True)
        return RequestSpec("batch", "completions", {"prompt": text, **common}, stream=False)


def burners(cpu: int, n: int = 2) -> list[subprocess.Popen]:
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def traffic(state, copies: int, seed: int = 0):
    urls = [r.url for r in state.replicas]
    run_id = f"fi{int(time.time())}"
    # the prompts are short and fixed: no fitting to the context (that re-makes workloads by name)
    fit = {"fit_context": False} if "fit_context" in inspect.signature(run_load).parameters else {}
    load = asyncio.run(run_load(urls, RepeatedGreedy(copies, seed), Arrival("poisson", rate=RATE),
                                duration=TRAFFIC_SECONDS, seed=seed, run_id=run_id, request_timeout=60.0, **fit))
    return run_id, load


def profile_busy_replica(state, replica: str, seconds: int = 5) -> tuple[int, str]:
    """`infersight profile` on a replica (pid from the store, profile stored through the sidecar) while
    traffic keeps it busy: the traffic starts once the command says py-spy is attached."""
    proc = subprocess.Popen(infersight_command("profile", "--replica", replica, "--seconds", str(seconds),
                                               "--store", state.store_url),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("profiling "):
                url = next(r.url for r in state.replicas if r.name == replica)
                fit = {"fit_context": False} if "fit_context" in inspect.signature(run_load).parameters else {}
                asyncio.run(run_load([url], RepeatedGreedy(1), Arrival("closed", concurrency=2),
                                     duration=seconds + 1, run_id=f"profile{int(time.time())}", **fit))
                break
        lines += proc.stdout.readlines()
        return proc.wait(timeout=120), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def up(tmp_path, name: str, replicas: list[ReplicaSpec]):
    config = FleetConfig(name=name, run_dir=tmp_path / name, startup_timeout=240.0, stop_timeout=10.0,
                         log_level="warning", sidecar=SidecarSpec(port=0), replicas=replicas)
    return fleet_up(config)


def diagnose(state, since: float) -> list:
    with open_store(state.store_url) as store:
        return run_diagnostics(DIAGNOSTICS, store, DiagnosticRequest(Scope(start=since)), write=True)


def spec(rid: str, model, **kw) -> ReplicaSpec:
    engine = {**ENGINE, **kw.pop("engine", {})}
    args = [*SERVE_ARGS, *kw.pop("args", [])]
    return ReplicaSpec(id=rid, model=str(model), threads=1, engine=engine, drain_timeout=3.0, args=args, **kw)


CPU_FAULT = "pinned to one CPU beside a busy neighbour"
# fault -> (replica, finding kinds that detect it)
FAULTS = {
    "tokenizer normalizes differently (Lowercase)": ("r1", {"tokenizer_divergence"}),
    "int4 weights": ("r2", {"output_drift"}),
    "altered chat template": ("r3", {"chat_template_mismatch"}),
    CPU_FAULT: ("r4", {"lagging_replica", "slow_steps"}),
}
LATENCIES = f"""
SELECT replica_id, count() AS requests, round(median(ttft_seconds) * 1000, 1) AS ttft_p50_ms,
       round({derived.itl_per_gap_quantiles_sql(levels=(0.5,))}[1] * 1000, 1) AS itl_p50_ms,
       round(median(e2e_seconds) * 1000, 1) AS e2e_p50_ms
FROM requests WHERE request_id LIKE {{prefix:String}} GROUP BY replica_id ORDER BY replica_id
"""
# findings above info that are true consequences of a fault (not false positives) though not its detector
CONSEQUENCES = {
    "r1": {"tokenizer_hash_mismatch", "tokenizer_roundtrip", "tokenizer_unicode_roundtrip"},
    # int4 dequantization costs time on a CPU; int4 is an engine option (identity: quantization, group size)
    "r2": {"lagging_replica", "slow_steps", "host_overhead_outlier", "config_mismatch", "sampled_logprob_shift"},
    # the template file is one of the tokenizer files; its chat requests become other token IDs
    "r3": {"tokenizer_hash_mismatch", "tokenizer_divergence"},
    "r4": {"host_overhead_outlier", "slow_steps", "lagging_replica"},
}


def outcome(findings) -> dict:
    above = [f for f in findings if f.severity != "info"]
    detected, missed = {}, []
    for fault, (rid, kinds) in FAULTS.items():
        hit = [f for f in above if f.subject == rid and f.kind in kinds]
        if hit:
            detected[fault] = f"{hit[0].kind} ({hit[0].severity}) on {rid}"
        else:
            missed.append(fault)
    expected = {(rid, k) for rid, kinds in FAULTS.values() for k in kinds}
    expected |= {(rid, k) for rid, kinds in CONSEQUENCES.items() for k in kinds}
    false_positives = [f for f in above if (f.subject, f.kind) not in expected]
    return {"detected": detected, "missed": missed, "false_positives": false_positives}


def test_faults_are_named_and_a_clean_fleet_is_quiet(tiny_llama, tmp_path, capsys):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one to pin the replica beside its busy neighbour")
    lower = with_normalizer(tiny_llama, tmp_path / "model-lower", {"type": "Lowercase"})
    template = with_chat_template(tiny_llama, tmp_path / "model-template", ALTERED_TEMPLATE)
    busy_cpu = cpus[-1]

    # -- the faulty fleet -------------------------------------------------------------------------
    faulty = [spec("r0", tiny_llama), spec("r1", lower),
              spec("r2", tiny_llama, engine={"quantization": "int4", "quant_group_size": 32}),
              spec("r3", template), spec("r4", tiny_llama, cpus=str(busy_cpu))]
    neighbours = burners(busy_cpu)
    state = None
    try:
        state = up(tmp_path, "faulty", faulty)
        since = time.time()
        load_before = os.getloadavg()[0]
        run_id, load = traffic(state, copies=len(faulty))
        saturated = max(load_before, os.getloadavg()[0]) > len(cpus)
        ok = [r for r in load.results if r.ok]
        assert len(ok) >= 0.9 * len(load.results), [r.error for r in load.results if not r.ok][:5]
        with open_store(state.store_url) as store:
            stored = wait_for_requests(store, run_id + "-", len(load.results), timeout=30)
            assert stored >= 0.9 * len(load.results)  # telemetry completeness is the recorder's own test
            latencies = store.query_df(LATENCIES, {"prefix": run_id + "-%"})
        findings = diagnose(state, since - 1)
        profile_run = profile_busy_replica(state, "r4")
        with open_store(state.store_url) as store:
            profiles = store.query_df("SELECT `group`, sum(samples) AS n FROM profiles WHERE replica_id = 'r4' "
                                      "GROUP BY `group`").set_index("group")["n"].to_dict()
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
        if state is not None:
            fleet_down(state.run_dir)

    result = outcome(findings)
    with capsys.disabled():
        print(f"\n== faulty fleet: {len(load.results)} requests in {TRAFFIC_SECONDS:g} s ==")
        print(format_table([f for f in findings if f.severity != "info"], width=160))
        print("detected:", result["detected"])
        print("missed:", result["missed"])
        print("false positives:", [(f.kind, f.subject, f.summary) for f in result["false_positives"]])
        print("profile of r4 by group:", profiles)
        print(profile_run[1].strip())
        print(f"machine load average {load_before:.1f} before the traffic ({len(cpus)} CPUs)")
        print(latencies.to_string(index=False))
    assert profile_run[0] == 0, profile_run[1]
    assert profiles and set(profiles) <= set(GROUPS), profiles
    assert profiles.get("forward", 0) > 0, profiles
    missed = set(result["missed"])
    if saturated:
        # every runnable task gets the same CPU share once the machine is saturated (CFS balances the
        # migratable ones around the pinned replica): a pinned replica is slower only when its peers
        # have spare CPU, so on a saturated machine it may rightly not stand out
        missed.discard(CPU_FAULT)
    assert not missed, result
    assert not [f for f in result["false_positives"] if f.subject == "r0"], result["false_positives"]

    # -- the clean fleet, same traffic ------------------------------------------------------------
    clean = [spec(f"c{i}", tiny_llama) for i in range(3)]
    state = None
    try:
        state = up(tmp_path, "clean", clean)
        since = time.time()
        run_id, load = traffic(state, copies=len(clean))
        with open_store(state.store_url) as store:
            wait_for_requests(store, run_id + "-", len(load.results), timeout=30)
            latencies = store.query_df(LATENCIES, {"prefix": run_id + "-%"})
        findings = diagnose(state, since - 1)
    finally:
        if state is not None:
            fleet_down(state.run_dir)
    above = [f for f in findings if f.severity != "info"]
    with capsys.disabled():
        print(f"\n== clean fleet: {len(load.results)} requests ==")
        print(format_table(findings, width=160))
        print(latencies.to_string(index=False))
    assert above == [], format_table(above)
