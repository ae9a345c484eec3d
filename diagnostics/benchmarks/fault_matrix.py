"""The fault matrix: each fault, deployed the ordinary way, on real local fleets under
production-shaped traffic; which finding catches it, on which replica, after how much traffic.

    python -m diagnostics.benchmarks.fault_matrix [--matrix identity|perf|deploy] [--faults a,b]
                                                  [--shapes canary,three] [--clean-runs 3] [--requests 300]
                                                  [--rate 4]

Three matrices: `identity` (the prober's faults, probe rounds on), `perf` (perf_faults.py: CPU
starvation, scheduler budget, prefix caching, eos, quantization, noisy weights, a damaged draft,
caught from sampled, load-balanced traffic alone by the rules that compare the same work) and `deploy`
(faults of every family an operator deploys by configuration: config.json, generation_config.json,
engine limits, serve flags, a cgroup CPU quota, the KV cache's size, a restart with other options; and
tenants whose traffic alone differs). A deploy fault names the key a finding must say with both values
and, where there is one, the mechanism it must cite (Fault.key, Fault.mechanism; finding_checks.py).

A run, per (fault, fleet shape):
1. the baseline replicas start on a copy of the reference model at one path P (one sidecar);
2. the fault is deployed: a file fault changes P in place (the usual incident: a new checkpoint or
   tokenizer pushed to the path a replica serves from), an option fault is the candidate's engine
   option; the candidate then starts on P - same path, its own options;
3. traffic: a probe round (engine/traffic/probe; not in the perf matrix), the loadgen's default mix (sampled
   at 0.8, each request to one replica picked at random, nothing broadcast) in checkpoints, a second
   probe round;
4. after each checkpoint every diagnostic runs over the window (not written), and the first
   checkpoint where a finding above info names the candidate with one of the fault's detector
   kinds is "requests needed".
Shapes: "canary-staggered" (one baseline + one candidate deployed once the baseline serves; "canary" is
its old name), "canary-together" (both started by one `fleet up`, roles recorded as a fleet TOML with
`role` gives them; a file fault is then the candidate's own model directory) and "three" (two baselines +
the candidate, deployed later). A clean run (no fault) and a tenant run must give nothing above info on
any replica.

Traffic: --rate and --requests, except for a fault that names its own (Fault.traffic, TRAFFIC; main
applies it, and run_case's caller passes its rate and requests): a scheduler limit costs latency only
where requests overlap, and at RATE the reference model's replicas run steps ~3% of the time (sampled
outputs end at EOS after 2-3 tokens, ~15 ms a request). Clean runs are repeated at each traffic the
selected faults use (with --faults none, every traffic of the matrix), so a busier traffic's false
positives are counted too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from diagnostics import DIAGNOSTICS, replicas, request_strata, spec_sums, steps
from diagnostics import run as run_diagnostics
from diagnostics.benchmarks import finding_checks, perf_faults
from diagnostics.benchmarks.deploy_faults import QuotaUnavailable, Tenant, cpu_quota_group, restart_replica
from diagnostics.benchmarks.model_faults import FILE_FAULTS
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.core.model_refs import REFERENCE_MODEL
from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.fit import fit_scale
from engine.traffic.loadgen.runner import discover, run_load
from engine.traffic.loadgen.workloads import make_workload
from engine.traffic.probe.rescore import run_rescore_round
from engine.traffic.probe.runner import run_probe_round
from telemetry.store import open_store
from telemetry.store.waiting import wait_for_requests

# small engines: three replicas, the sidecar and the load share two cores
ENGINE = {"served_model_name": "reference", "max_num_seqs": 8, "num_kv_blocks": 128, "block_size": 16}
SERVE_ARGS = ["--store-text"]  # the recorder keeps prompt text: the text checks use it
PROBE_FILLERS = 1  # busy-batch fillers per batched probe: one makes it batched; the default 4 would spend most of
#                   the matrix's requests per replica on fillers (a round is ~80 requests per replica with one)
RESCORED = 24  # requests of each replica a rescore round teacher-forces on every replica (perf matrix)
RATE = 4.0  # requests/s over the fleet: 2 cores for 3 replicas, the sidecar and the load; the default traffic
# (rate, requests) a fault may ask for: "busy" is 5x the arrivals for the same ~75 s of traffic. Measured on the
# tiny-budget canary (step time / wall time per replica): 2-3% at RATE, 8-9% at "busy"; its queue's p90 1.2x the
# peer's at RATE (not significant), 2.45x [1.39, 4.61] at "busy"
TRAFFIC = {"busy": (20.0, 1500)}


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # as a person would say what was deployed
    detectors: frozenset  # finding kinds that catch it (above info, naming the candidate); empty: a clean run
    file_fault: str | None = None  # diagnostics.benchmarks.model_faults.FILE_FAULTS, applied at P
    engine: dict = field(default_factory=dict)  # the candidate's engine options
    every_engine: dict = field(default_factory=dict)  # options of every replica (speculative decoding ...)
    neighbour: bool = False  # the candidate pinned to one CPU beside a busy loop (perf_faults.busy_neighbour)
    draft: str | None = None  # "good" | "damaged": every replica drafts with the served checkpoint, the
    #                           candidate with this one (perf_faults.good_draft / damaged_draft)
    traffic: str | None = None  # TRAFFIC's key: the rate and requests this fault shows at (None: the run's)
    serve_args: tuple = ()  # the candidate's further `infersight serve` flags
    cpu_quota: float | None = None  # the candidate starts in a cgroup with this many CPUs' worth of quota
    restart_engine: dict = field(default_factory=dict)  # after the first checkpoint the candidate restarts,
    #                                                     same id, with these options over its own
    tenant: Tenant | None = None  # the candidate gets a tenant's traffic of its own (a clean run: nothing differs)
    key: tuple | None = None  # (key, one value, the other): what a finding on the candidate must say
    mechanism: str | tuple | None = None  # diagnostics.mechanisms' name(s) a finding on the candidate must cite

    @property
    def clean(self) -> bool:
        return not self.detectors


FAULTS = {f.name: f for f in (
    Fault("lowercase_normalizer", "tokenizer.json gains a Lowercase normalizer",
          frozenset({"tokenizer_divergence", "token_distribution_shift", "probe_drift", "tokenizer_hash_mismatch"}),
          file_fault="lowercase_normalizer"),
    Fault("template_newline", "the chat template gains a newline after each role marker",
          frozenset({"chat_template_mismatch", "probe_drift", "tokenizer_divergence"}), file_fault="template_newline"),
    Fault("double_bos", "the tokenizer's post-processor adds a second BOS",
          frozenset({"tokenizer_divergence", "probe_drift", "tokenizer_hash_mismatch"}), file_fault="double_bos"),
    Fault("int4_coarse", "int4 weights with the coarsest group (one group per 128-wide row)",
          frozenset({"config_mismatch", "probe_drift", "output_drift"}),
          engine={"quantization": "int4", "quant_group_size": 128}),
    Fault("noisy_weights", "weights with 5% relative noise at the same path, same options",
          frozenset({"weights_mismatch", "probe_drift"}), file_fault="noisy_weights"),
    Fault("eos_ids", "generation_config.json names another eos id",
          frozenset({"config_mismatch", "probe_drift"}), file_fault="eos_ids"),
    Fault("prefix_caching_off", "prefix caching switched off", frozenset({"config_mismatch"}),
          engine={"enable_prefix_caching": False}),
    Fault("batched_tokens", "max_num_batched_tokens 64 instead of 2048", frozenset({"config_mismatch"}),
          engine={"max_num_batched_tokens": 64}),
)}
# the same work at the same unit (issue 15's rules), from sampled traffic alone: no prober
PERF_FAULTS = {f.name: f for f in (
    Fault("cpu_starved", "the candidate pinned to one CPU that a busy loop shares",
          frozenset({"slow_steps", "lagging_replica"}), neighbour=True),
    Fault("prefix_caching_off", "prefix caching switched off", frozenset({"prefix_hit_gap"}),
          engine={"enable_prefix_caching": False}),
    Fault("tiny_budget", "max_num_seqs 1 and a 32-token step budget", frozenset({"lagging_replica", "slow_steps"}),
          engine={"max_num_seqs": 1, "max_num_batched_tokens": 32}, traffic="busy"),
    Fault("eos_ids", "generation_config.json names another eos id", frozenset({"output_mix_shift"}),
          file_fault="eos_ids"),
    Fault("int4_coarse", "int4 weights with the coarsest group",
          frozenset({"sampled_logprob_shift", "cross_score_shift"}),
          engine={"quantization": "int4", "quant_group_size": 128}),
    Fault("noisy_weights", "weights with 5% relative noise at the same path",
          frozenset({"sampled_logprob_shift", "cross_score_shift"}), file_fault="noisy_weights"),
    Fault("damaged_draft", "every replica drafts with the served checkpoint; the candidate's draft is a copy "
                           "with 50% weight noise (a corrupted draft checkpoint)",
          frozenset({"spec_acceptance_drop"}), every_engine=perf_faults.SPECULATIVE, draft="damaged"),
    Fault("clean_speculative", "every replica drafts with the same good draft model (a clean run)", frozenset(),
          every_engine=perf_faults.SPECULATIVE, draft="good"),
)}
_LIMITS = frozenset({"config_mismatch", "lagging_replica", "slow_steps", "availability_gap"})
# every family an operator deploys by configuration, each with the key a finding must name (both values)
DEPLOY_FAULTS = {f.name: f for f in (
    Fault("rope_theta", "config.json's rope_theta x10 (10000 -> 100000)",
          frozenset({"config_mismatch", "probe_drift", "output_drift"}), file_fault="rope_theta",
          key=("rope_theta", 10000.0, 100000.0)),
    Fault("eos_ids", "generation_config.json names another eos id",
          frozenset({"config_mismatch", "probe_drift", "output_drift"}), file_fault="eos_ids",
          key=("eos_token_id", [1], [4])),
    Fault("max_num_seqs", "max_num_seqs 2 instead of 8", _LIMITS, engine={"max_num_seqs": 2},
          key=("max_num_seqs", 2, 8), mechanism="queue_at_max_num_seqs"),
    Fault("max_model_len", "max_model_len 64 instead of the model's 256", _LIMITS, engine={"max_model_len": 64},
          key=("max_model_len", 64, 256)),
    Fault("max_queue", "serve --max-queue 0 (the default lets 4 x max_num_seqs wait)", _LIMITS,
          serve_args=("--max-queue", "0"), key=("max_queue", 0, 32)),
    # 0.1, not 0.3: at 0.3 a replica of the reference model at RATE never used its quota on a loaded 2-core host
    # (nothing throttled, so nothing a lag finding could cite)
    Fault("cpu_quota", "a cgroup CPU quota of 0.1 CPUs", _LIMITS, cpu_quota=0.1,
          key=("cpu_quota_cpus", 0.1, "max"), mechanism="cpu_quota"),
    # 16 blocks hold one max_model_len sequence (256 tokens): at 24 the default mix at RATE ran at most 3
    # sequences at once on the candidate and used 22 of 24 blocks, never preempting; at 16 it ran full in 2% of
    # its steps and preempted 3 of 225 requests (too few to be a cause: mechanisms.MIN_EVENTS), so KV pressure
    # counts as its mechanism too
    Fault("kv_small", "num_kv_blocks 16 instead of 128 (preemptions)", _LIMITS, engine={"num_kv_blocks": 16},
          key=("num_kv_blocks", 16, 128), mechanism=("preemptions", "kv_pressure")),
    Fault("restart_max_num_seqs", "every replica at max_num_seqs 16; the candidate restarted (same id) with 2",
          frozenset({"identity_changed", *_LIMITS}), every_engine={"max_num_seqs": 16},
          restart_engine={"max_num_seqs": 2}, key=("max_num_seqs", 16, 2)),
    Fault("tenant_load", "the candidate's tenant sends 4x the requests per second", frozenset(),
          tenant=Tenant(load=4.0)),
    Fault("tenant_output", "max_tokens 64 from the candidate's tenant, 8 from the fleet's", frozenset(),
          tenant=Tenant(max_tokens=(8, 64))),
    Fault("tenant_prompts", "the candidate's tenant has its own system prompts and seed", frozenset(),
          tenant=Tenant(own_seed=True)),
)}
MATRICES = {"identity": FAULTS, "perf": PERF_FAULTS, "deploy": DEPLOY_FAULTS}
# shape -> baseline replicas (the candidate is one more)
SHAPES = {"canary-staggered": 1, "canary-together": 1, "three": 2, "canary": 1}
TOGETHER = frozenset({"canary-together"})  # one `fleet up` starts every replica, roles recorded


@dataclass
class Outcome:
    fault: str
    shape: str
    candidate: str
    caught_after: str | None  # "probe round 1", "150 requests" ... None: missed
    explanation: str  # the catching finding's summary
    false_positives: list  # (kind, subject, severity) above info that are not the candidate's
    requests: int = 0
    traffic: str = ""  # the rate it ran at (main adds TRAFFIC's name where a case ran at one)
    per_replica: int = 0  # the most requests one replica got
    key_named: bool | None = None  # a finding on the candidate said Fault.key with both values (None: none asked)
    mechanism_cited: bool | None = None  # ... cited Fault.mechanism (None: none asked)
    symmetric: list = field(default_factory=list)  # above-info findings on a pair ("r0 vs r1"): nobody blamed
    skipped: str = ""  # why the case could not run here (a cgroup quota without a writable cgroup ...)


def _spec(rid: str, model: Path, engine: dict, serve_args=()) -> ReplicaSpec:
    return ReplicaSpec(id=rid, model=str(model), threads=1, engine={**ENGINE, **engine}, drain_timeout=3.0,
                       args=[*SERVE_ARGS, *serve_args])


def _up(run_dir: Path, name: str, replicas: list[ReplicaSpec], sidecar: SidecarSpec):
    config = FleetConfig(name=name, run_dir=run_dir / name, startup_timeout=240.0, stop_timeout=10.0,
                         log_level="warning", sidecar=sidecar, replicas=replicas)
    return fleet_up(config)


def _diagnose(store_url: str, since: float) -> list:
    with open_store(store_url) as store:
        return run_diagnostics(DIAGNOSTICS, store, DiagnosticRequest(Scope(start=since)), write=False)


def run_case(fault: Fault | None, shape: str, work: Path, requests: int = 300, seed: int = 0,
             checkpoints: int = 3, log=print, probes: bool = True, rate: float = RATE, traffic=None,
             file_faults: dict = FILE_FAULTS) -> Outcome:
    """One fleet, one fault (None: clean), the traffic and the diagnostics (see the module doc);
    without `probes`, sampled traffic only. `traffic` replaces this module's traffic and checks (same
    arguments, quality_faults.py); `file_faults` names the file faults a Fault may use."""
    model = work / "model"
    shutil.copytree(REFERENCE_MODEL, model)
    baselines = [f"r{i}" for i in range(SHAPES[shape])]
    candidate = f"r{len(baselines)}"
    together = shape in TOGETHER
    every = dict(fault.every_engine) if fault else {}
    cand_engine = {**every, **(fault.engine if fault else {})}
    if fault is not None and fault.draft:
        every["draft_model"] = perf_faults.good_draft(model)
        cand_engine["draft_model"] = (perf_faults.damaged_draft(work, model) if fault.draft == "damaged"
                                      else perf_faults.good_draft(model))
    cand_model = model
    if fault is not None and fault.file_fault and together:  # started at once: the candidate's own directory
        cand_model = work / "candidate-model"
        shutil.copytree(model, cand_model)
        file_faults[fault.file_fault](cand_model)
    fleets = []
    with ExitStack() as context:
        try:
            cand_spec = _spec(candidate, cand_model, cand_engine, fault.serve_args if fault else ())
            base_specs = [_spec(r, model, every) for r in baselines]
            if fault is not None and fault.cpu_quota is not None:
                try:
                    cand_spec.env = context.enter_context(cpu_quota_group(fault.cpu_quota))
                except QuotaUnavailable as e:
                    log(f"{fault.name:22s} {shape:7s} not run: {e}")
                    return Outcome(fault.name, shape, candidate, None, "", [], skipped=str(e))
            if fault is not None and fault.neighbour:
                cand_spec.cpus = str(perf_faults.NEIGHBOUR_CPU)
                context.enter_context(perf_faults.busy_neighbour())
            if together:
                for spec in base_specs:
                    spec.role = "baseline"
                cand_spec.role = "candidate"
                base = _up(work, "fleet", [*base_specs, cand_spec], SidecarSpec(port=0))
                fleets.append(base.run_dir)
                cand = base
            else:
                base = _up(work, "base", base_specs, SidecarSpec(port=0))
                fleets.append(base.run_dir)
                if fault is not None and fault.file_fault:
                    file_faults[fault.file_fault](model)
                cand = _up(work, "cand", [cand_spec], SidecarSpec(enabled=False, url=base.store_url))
                fleets.append(cand.run_dir)
            restart = None
            if fault is not None and fault.restart_engine:
                again = _spec(candidate, cand_model, {**cand_engine, **fault.restart_engine}, fault.serve_args)
                again.role, again.env = cand_spec.role, cand_spec.env
                restart = lambda: restart_replica(cand, again, cand_model)  # noqa: E731
            run_traffic = traffic or _traffic
            outcome = run_traffic(fault, shape, candidate, base, cand, requests, seed, checkpoints, log, probes, rate,
                                  restart)
            outcome.traffic = f"{rate:g}/s"
            return outcome
        finally:
            for run_dir in reversed(fleets):
                fleet_down(run_dir)


async def _fitted(workload, urls: list[str]):
    """The workload at the prompt scale that fits the baselines' context: a candidate with a shorter one
    gets the same production prompts, as it would behind a load balancer."""
    import httpx

    async with httpx.AsyncClient(timeout=60.0) as client:
        tightest = min(await discover(client, urls, None), key=lambda e: e.max_model_len or 1 << 30)
        if not tightest.max_model_len:
            return workload
        scale = await fit_scale(client, tightest.url, tightest.model, tightest.max_model_len, workload)
    return workload.rescaled(scale) if scale != workload.scale else workload


async def _loads(streams: list[tuple]) -> list:
    """Several load streams at once: (urls, workload, rate, requests, seed, run id) each."""
    return await asyncio.gather(*(
        run_load(urls, workload, Arrival("poisson", rate=r), num_requests=n, seed=s, pick="random", run_id=rid,
                 request_timeout=60.0, fit_context=False)
        for urls, workload, r, n, s, rid in streams if n > 0))


def _traffic(fault, shape, candidate, base, cand, requests, seed, checkpoints, log, probes, rate,
             restart=None) -> Outcome:
    replicas = {r.name: r.url for r in [*base.replicas, *(cand.replicas if cand is not base else [])]}
    urls = list(replicas.values())
    base_urls = [u for name, u in replicas.items() if name != candidate]
    since = time.time() - 1
    stages = []  # (label, findings)

    def check(label: str) -> None:
        stages.append((label, _diagnose(base.store_url, since)))

    first = "probe round 1 + " if probes else ""
    if probes:
        run_probe_round(urls, batch_fillers=PROBE_FILLERS)
        check("probe round 1")
    run_id = f"fm{seed}-{int(time.time())}"
    # the perf matrix's traffic ends at EOS as production traffic does (an eos change must be able to show);
    # the identity matrix keeps the loadgen's default (ignore_eos: fixed output lengths)
    ignore_eos = probes
    tenant = fault.tenant if fault is not None else None
    fleet_tokens, own_tokens = tenant.max_tokens if tenant else (None, None)

    def workloads(k: int):
        fleet = make_workload("mixed", seed * 100 + k, ignore_eos=ignore_eos, max_tokens=fleet_tokens)
        own = make_workload("mixed", (seed * 100 + k) + (7919 if tenant and tenant.own_seed else 0),
                            ignore_eos=ignore_eos, max_tokens=own_tokens)
        return (asyncio.run(_fitted(fleet, base_urls)),
                asyncio.run(_fitted(own, base_urls)) if tenant else None)  # new prompts each checkpoint

    sent = 0
    per = max(1, requests // checkpoints)
    for k in range(checkpoints):
        n = per if k < checkpoints - 1 else requests - sent
        fleet_load, own = workloads(k)
        if tenant is None:
            streams = [(urls, fleet_load, rate, n, seed * 100 + k, f"{run_id}c{k}")]
        else:  # the baselines at the fleet's per-replica rate, the candidate at `load` times it, for as long
            share = n / (len(base_urls) + tenant.load)
            each = rate / len(urls)
            streams = [(base_urls, fleet_load, each * len(base_urls), round(share * len(base_urls)), seed * 100 + k,
                        f"{run_id}c{k}"),
                       ([replicas[candidate]], own, each * tenant.load, round(share * tenant.load),
                        seed * 100 + k + 50, f"{run_id}t{k}")]
        loads = asyncio.run(_loads(streams))
        with open_store(base.store_url) as store:
            for stream, load in zip([s for s in streams if s[3] > 0], loads):
                sent += len(load.results)
                wait_for_requests(store, f"{stream[5]}-", len(load.results))
        check(f"{first}{sent} requests")
        if k == 0 and restart is not None:
            restart()
            log(f"    {candidate} restarted with {fault.restart_engine}")
    if probes:
        run_probe_round(urls, batch_fillers=PROBE_FILLERS)
        check(f"two probe rounds + {sent} requests")
    else:  # cross-scoring: the traffic's own requests, teacher-forced on every replica (no shared prompts)
        rescored = run_rescore_round(urls, base.store_url, per_replica=RESCORED)
        with open_store(base.store_url) as store:
            wait_for_requests(store, f"rescore.{rescored.round_id}.", rescored.sent - len(rescored.failed))
        check(f"{sent} requests + a rescore round")
    if fault is not None and fault.draft:  # what the detector sees: each replica's acceptance over the run
        with open_store(base.store_url) as store:
            for r in spec_sums.acceptance(store, Scope(start=since)):
                acc = "n/a" if r["rate"] is None else f"{r['rate']:.3f}"
                log(f"    acceptance {r['replica_id']}: {r['accepted']}/{r['proposed']} = {acc} "
                    f"({sum(s.n for s in r['requests'].values())} requests with drafts)")
    if fault is not None and fault.detectors & {"slow_steps", "lagging_replica"}:
        _measured(base.store_url, since, candidate, log)
    if os.environ.get("INFERSIGHT_FM_DUMP"):  # keep the run's telemetry (the fleet's store goes with its work dir)
        import pyarrow.parquet as pq

        dump = Path(os.environ["INFERSIGHT_FM_DUMP"])
        dump.mkdir(parents=True, exist_ok=True)
        with open_store(base.store_url) as store:
            for table in ("replicas", "requests", "steps"):
                pq.write_table(store.query_arrow(f"SELECT * FROM {table}"),
                               dump / f"{fault.name if fault else 'clean'}-{shape}-{table}.parquet")
    log(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with open_store(base.store_url) as store:
        most = finding_checks.most_requests_per_replica(store, since)
    outcome = _outcome(fault, shape, candidate, stages, sent, log)
    outcome.per_replica = most
    return outcome


def _measured(store_url: str, since: float, candidate: str, log) -> None:
    """What the same-work rules measured on the candidate over the run, whether they fired or not."""
    scope = Scope(start=since)
    report: list = []
    with open_store(store_url) as store:
        steps.run(store, DiagnosticRequest(scope), report=report)
        group = {rid: e for (_, rid), e in request_strata.samples(store, scope).items()}
        limits = {r["replica_id"]: replicas.scheduler_limits(r) for r in replicas_in(store, scope)}
    for r in report:
        if r["replica"] == candidate:
            log(f"    steps {r['target']}: {r['ratio']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] bar {r['bar']:.2f}x"
                f" Holm p={r['p_holm']:.1e}"
                f" ({r['steps']} steps, {r['block_seconds']:g} s blocks)")
    if len(group) > 1:
        for t in replicas.tests(group, {}, limits):
            c = t["comparison"]
            if t["replica"] == candidate and t["metric"] in ("ttft", "prefill", "queue", "tpot", "ttft_p90",
                                                              "queue_p90"):
                log(f"    {t['metric']}: {c.ratio:.2f}x CI {c.ratio_ci} Holm p={t['holm_p']:.1e} "
                    f"({c.n_subject} requests in {c.strata} strata)")


def _outcome(fault, shape, candidate, stages, sent, log) -> Outcome:
    caught, explanation = None, ""
    final = stages[-1][1]
    for label, findings in stages:
        hits = [f for f in findings if fault is not None and f.kind in fault.detectors and f.subject == candidate
                and (f.severity != "info" or f.kind == finding_checks.CHANGE_KIND)]
        if hits:
            caught, explanation = label, f"{hits[0].kind} ({hits[0].severity}): {hits[0].summary}"
            break
    above = [f for f in final if f.severity != "info"]
    clean = fault is None or fault.clean
    symmetric = [(f.kind, f.subject, f.severity, f.summary) for f in above if " vs " in f.subject]
    false_positives = [(f.kind, f.subject, f.severity, f.summary) for f in above
                       if " vs " not in f.subject and (clean or f.subject != candidate)]
    name = "clean" if fault is None else fault.name
    out = Outcome(name, shape, candidate, caught, explanation, false_positives, sent, symmetric=symmetric)
    if fault is not None and fault.key:
        out.key_named = finding_checks.key_named(final, candidate, *fault.key)
    if fault is not None and fault.mechanism:
        out.mechanism_cited = finding_checks.mechanism_cited(final, candidate, fault.mechanism)
    verdict = "clean run" if clean else f"caught: {caught}" if caught else "MISSED"
    log(f"{out.fault:22s} {shape:7s} {verdict}  key named {out.key_named} mechanism {out.mechanism_cited}  "
        f"{explanation[:400]}")
    for f in final:  # what each finding that looked for causes on the candidate cited (or that it found none)
        if candidate in f.subject.split(" vs ") and "mechanisms" in f.evidence:
            cited = ", ".join(m["mechanism"] for m in f.evidence["mechanisms"]) or "nothing found"
            log(f"    {f.severity} {f.kind} cites: {cited}")
    if not clean and (caught is None or out.key_named is False or out.mechanism_cited is False):
        for f in final:  # what the detectors said instead (info: insufficient data, below a bar ...)
            if f.kind in fault.detectors or candidate in f.subject.split(" vs "):
                log(f"    {f.severity} {f.kind} {f.subject}: {f.summary[:300]}")
    for fp in false_positives + symmetric:
        log(f"    above info, not on the candidate: {fp}")
    return out


def table(outcomes: list[Outcome], faults: dict | None = None) -> str:
    lines = ["| fault | fleet | traffic | caught after | explanation | false positives |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.fault.startswith("clean") or (faults and o.fault in faults and faults[o.fault].clean):
            caught = "(clean: nothing expected)"
        else:
            caught = o.caught_after or "**missed**"
        fps = "; ".join(f"{k} {s} on {subj}" for k, subj, s, _ in o.false_positives) or "none"
        lines.append(f"| {o.fault} | {o.shape} | {o.traffic} | {caught} | {o.explanation[:120]} | {fps} |")
    return "\n".join(lines)


def confusion(outcomes: list[Outcome], faults: dict) -> str:
    """fault x shape: caught (the candidate named; + key: the key with both values; + mechanism), missed,
    symmetric (a pair named, nobody blamed), false-blame (a healthy replica named above info), quiet (a clean
    or tenant run with nothing above info); with the requests it took and the most one replica got."""
    shapes = list(dict.fromkeys(o.shape for o in outcomes))
    rows: dict[str, dict[str, str]] = {}
    for o in outcomes:
        rows.setdefault(o.fault, {})[o.shape] = finding_checks.cell(o, faults.get(o.fault))
    lines = ["| fault | " + " | ".join(shapes) + " |", "|---|" + "---|" * len(shapes)]
    lines += [f"| {fault} | " + " | ".join(cells.get(s, "") for s in shapes) + " |" for fault, cells in rows.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", choices=sorted(MATRICES), default="identity",
                        help="identity: the prober's faults (probes on); perf: the same-work rules' faults, "
                             "from sampled traffic alone (no probes); deploy: every configuration family and "
                             "tenants, probes on, the key and mechanism checked")
    parser.add_argument("--faults", default="", help="comma-separated (default: the matrix's all); "
                                                     "'none' for clean runs only")
    parser.add_argument("--shapes", default="canary-staggered,canary-together,three",
                        help=f"comma-separated, of {', '.join(SHAPES)} (canary: canary-staggered's old name)")
    parser.add_argument("--clean-runs", type=int, default=3, help="clean fleets per shape")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, default=3, help="diagnose after each of this many parts of the "
                                                                    "traffic")
    parser.add_argument("--rate", type=float, default=RATE,
                        help=f"requests/s over the fleet (default {RATE:g}); a fault with a traffic of its own "
                             f"(TRAFFIC: {TRAFFIC}, rate and requests) runs at that, whatever --rate and "
                             "--requests say")
    args = parser.parse_args(argv)
    faults = MATRICES[args.matrix]
    names = [] if args.faults == "none" else [f for f in (args.faults or ",".join(faults)).split(",") if f]
    unknown = sorted(set(names) - set(faults))
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(faults)}")
    default = (args.rate, args.requests)
    # clean runs at the run's traffic and at every traffic the selected faults ask for (all of the matrix's
    # with --faults none)
    selected = [faults[n] for n in names] or list(faults.values())
    traffics = [None] + sorted({f.traffic for f in selected if f.traffic})
    outcomes = []
    for shape in args.shapes.split(","):
        cases = [(faults[n], faults[n].traffic) for n in names] + [(None, t) for t in traffics
                                                                   for _ in range(args.clean_runs)]
        for i, (fault, traffic) in enumerate(cases):
            rate, requests = TRAFFIC[traffic] if traffic else default
            with tempfile.TemporaryDirectory(prefix="infersight-fm-") as work:
                outcome = run_case(fault, shape, Path(work), requests, seed=i, probes=args.matrix != "perf",
                                   rate=rate, checkpoints=args.checkpoints)
            if traffic:
                outcome.traffic = f"{traffic} ({outcome.traffic})"
            outcomes.append(outcome)
    print(table(outcomes, faults))
    print()
    print(confusion(outcomes, faults))
    missed = [o for o in outcomes if not o.fault.startswith("clean") and not o.skipped and o.caught_after is None
              and not faults[o.fault].clean]
    noisy = [o for o in outcomes if o.false_positives]
    return 1 if missed or noisy else 0


if __name__ == "__main__":
    raise SystemExit(main())
