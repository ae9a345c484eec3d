"""The fault matrix: each fault, deployed the ordinary way, on real local fleets under
production-shaped traffic; which finding catches it, on which replica, after how much traffic.

    python -m diagnostics.benchmarks.fault_matrix [--matrix identity|perf] [--faults a,b]
                                                  [--shapes canary,three] [--clean-runs 3] [--requests 300]
                                                  [--rate 4]

Two matrices: `identity` (the prober's faults, probe rounds on) and `perf` (perf_faults.py: CPU
starvation, scheduler budget, prefix caching, eos, quantization, noisy weights, a damaged draft,
caught from sampled, load-balanced traffic alone by the rules that compare the same work).

A run, per (fault, fleet shape):
1. the baseline replicas start on a copy of the reference model at one path P (one sidecar);
2. the fault is deployed: a file fault changes P in place (the usual incident: a new checkpoint or
   tokenizer pushed to the path a replica serves from), an option fault is the candidate's engine
   option; the candidate then starts on P - same path, its own options;
3. traffic: a probe round (engine/probe; not in the perf matrix), the loadgen's default mix (sampled
   at 0.8, each request to one replica picked at random, nothing broadcast) in checkpoints, a second
   probe round;
4. after each checkpoint every diagnostic runs over the window (not written), and the first
   checkpoint where a finding above info names the candidate with one of the fault's detector
   kinds is "requests needed".
Shapes: "canary" (one baseline + one candidate, started later) and "three" (two baselines + the
candidate). A clean run (no fault) must give nothing above info on any replica.

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

from diagnostics import DIAGNOSTICS, replicas, request_strata, spec_sums, step_model
from diagnostics import run as run_diagnostics
from diagnostics.benchmarks import perf_faults
from diagnostics.benchmarks.model_faults import FILE_FAULTS
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in
from engine.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.fleet.fleet import fleet_down, fleet_up
from engine.fleet.models import REFERENCE_MODEL
from engine.loadgen.arrivals import Arrival
from engine.loadgen.runner import run_load
from engine.loadgen.workloads import make_workload
from engine.probe.rescore import run_rescore_round
from engine.probe.runner import run_probe_round
from telemetry.store import open_store
from telemetry.store.waiting import wait_for_requests

# small engines: three replicas, the sidecar and the load share two cores
ENGINE = {"served_model_name": "reference", "max_num_seqs": 8, "num_kv_blocks": 128, "block_size": 16}
SERVE_ARGS = ["--store-text"]  # the recorder keeps prompt text: the text checks use it
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
MATRICES = {"identity": FAULTS, "perf": PERF_FAULTS}
SHAPES = {"canary": 1, "three": 2}  # shape -> baseline replicas (the candidate is one more)


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


def _spec(rid: str, model: Path, engine: dict) -> ReplicaSpec:
    return ReplicaSpec(id=rid, model=str(model), threads=1, engine={**ENGINE, **engine}, drain_timeout=3.0,
                       args=list(SERVE_ARGS))


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
    every = dict(fault.every_engine) if fault else {}
    cand_engine = {**every, **(fault.engine if fault else {})}
    if fault is not None and fault.draft:
        every["draft_model"] = perf_faults.good_draft(model)
        cand_engine["draft_model"] = (perf_faults.damaged_draft(work, model) if fault.draft == "damaged"
                                      else perf_faults.good_draft(model))
    fleets = []
    with ExitStack() as neighbours:
        try:
            base = _up(work, "base", [_spec(r, model, every) for r in baselines], SidecarSpec(port=0))
            fleets.append(base.run_dir)
            if fault is not None and fault.file_fault:
                file_faults[fault.file_fault](model)
            cand_spec = _spec(candidate, model, cand_engine)
            if fault is not None and fault.neighbour:
                cand_spec.cpus = str(perf_faults.NEIGHBOUR_CPU)
                neighbours.enter_context(perf_faults.busy_neighbour())
            cand = _up(work, "cand", [cand_spec], SidecarSpec(enabled=False, url=base.store_url))
            fleets.append(cand.run_dir)
            outcome = (traffic or _traffic)(fault, shape, candidate, base, cand, requests, seed, checkpoints, log,
                                            probes, rate)
            outcome.traffic = f"{rate:g}/s"
            return outcome
        finally:
            for run_dir in reversed(fleets):
                fleet_down(run_dir)


def _traffic(fault, shape, candidate, base, cand, requests, seed, checkpoints, log, probes, rate) -> Outcome:
    urls = [r.url for r in base.replicas] + [r.url for r in cand.replicas]
    since = time.time() - 1
    stages = []  # (label, findings)

    def check(label: str) -> None:
        stages.append((label, _diagnose(base.store_url, since)))

    first = "probe round 1 + " if probes else ""
    if probes:
        run_probe_round(urls)
        check("probe round 1")
    run_id = f"fm{seed}-{int(time.time())}"
    # the perf matrix's traffic ends at EOS as production traffic does (an eos change must be able to show);
    # the identity matrix keeps the loadgen's default (ignore_eos: fixed output lengths)
    ignore_eos = probes
    workload = make_workload("mixed", seed, ignore_eos=ignore_eos)
    sent = 0
    per = max(1, requests // checkpoints)
    for k in range(checkpoints):
        n = per if k < checkpoints - 1 else requests - sent
        load = asyncio.run(run_load(urls, workload, Arrival("poisson", rate=rate), num_requests=n,
                                    seed=seed * 100 + k, pick="random", run_id=f"{run_id}c{k}",
                                    request_timeout=60.0))
        workload = make_workload("mixed", seed * 100 + k + 1, ignore_eos=ignore_eos)  # new prompts each checkpoint
        sent += len(load.results)
        with open_store(base.store_url) as store:
            wait_for_requests(store, f"{run_id}c{k}-", len(load.results))
        check(f"{first}{sent} requests")
    if probes:
        run_probe_round(urls)
        check(f"two probe rounds + {sent} requests")
    else:  # cross-scoring: the traffic's own requests, teacher-forced on every replica (no shared prompts)
        rescored = run_rescore_round(urls, base.store_url, per_replica=RESCORED)
        with open_store(base.store_url) as store:
            wait_for_requests(store, f"rescore.{rescored.round_id}.", rescored.sent - len(rescored.failed))
        check(f"{sent} requests + a rescore round")
    if fault is not None and fault.draft:  # what the detector sees: each replica's acceptance over the run
        with open_store(base.store_url) as store:
            for r in spec_sums.acceptance(store, Scope(start=since)):
                rate = "n/a" if r["rate"] is None else f"{r['rate']:.3f}"
                log(f"    acceptance {r['replica_id']}: {r['accepted']}/{r['proposed']} = {rate} "
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
    return _outcome(fault, shape, candidate, stages, sent, log)


def _measured(store_url: str, since: float, candidate: str, log) -> None:
    """What the same-work rules measured on the candidate over the run, whether they fired or not."""
    scope = Scope(start=since)
    report: list = []
    with open_store(store_url) as store:
        step_model.run(store, DiagnosticRequest(scope), report=report)
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
        hits = [f for f in findings if f.severity != "info" and f.subject == candidate
                and fault is not None and f.kind in fault.detectors]
        if hits:
            caught, explanation = label, f"{hits[0].kind} ({hits[0].severity}): {hits[0].summary}"
            break
    above = [f for f in final if f.severity != "info"]
    clean = fault is None or fault.clean
    false_positives = [(f.kind, f.subject, f.severity, f.summary) for f in above
                       if clean or f.subject != candidate]
    name = "clean" if fault is None else fault.name
    out = Outcome(name, shape, candidate, caught, explanation, false_positives, sent)
    verdict = "clean run" if clean else f"caught: {caught}" if caught else "MISSED"
    log(f"{out.fault:22s} {shape:7s} {verdict}  {explanation[:140]}")
    if not clean and caught is None:  # what the detectors said instead (info: insufficient data, below a bar ...)
        for f in final:
            if f.kind in fault.detectors or f.subject == candidate:
                log(f"    {f.severity} {f.kind} {f.subject}: {f.summary[:220]}")
    for fp in false_positives:
        log(f"    false positive: {fp}")
    return out


def table(outcomes: list[Outcome]) -> str:
    lines = ["| fault | fleet | traffic | caught after | explanation | false positives |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.fault.startswith("clean"):
            caught = "(clean: nothing expected)"
        else:
            caught = o.caught_after or "**missed**"
        fps = "; ".join(f"{k} {s} on {subj}" for k, subj, s, _ in o.false_positives) or "none"
        lines.append(f"| {o.fault} | {o.shape} | {o.traffic} | {caught} | {o.explanation[:120]} | {fps} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", choices=sorted(MATRICES), default="identity",
                        help="identity: the prober's faults (probes on); perf: the same-work rules' faults, "
                             "from sampled traffic alone (no probes)")
    parser.add_argument("--faults", default="", help="comma-separated (default: the matrix's all); "
                                                     "'none' for clean runs only")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--clean-runs", type=int, default=3, help="clean fleets per shape")
    parser.add_argument("--requests", type=int, default=300)
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
                outcome = run_case(fault, shape, Path(work), requests, seed=i, probes=args.matrix == "identity",
                                   rate=rate)
            if traffic:
                outcome.traffic = f"{traffic} ({outcome.traffic})"
            outcomes.append(outcome)
    print(table(outcomes))
    missed = [o for o in outcomes if not o.fault.startswith("clean") and o.caught_after is None]
    noisy = [o for o in outcomes if o.false_positives]
    return 1 if missed or noisy else 0


if __name__ == "__main__":
    raise SystemExit(main())
