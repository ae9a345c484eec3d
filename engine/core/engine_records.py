"""Builds the telemetry records the engine emits (replica identity, finished requests, steps) and hands them
to its observer (EngineTelemetry); and a finished request's metrics, derived as its record's are.

Kept apart from the engine loop so that the loop reads as scheduling and
compute; this runs only when an observer listens (except the replica
identity, built once at start, and the finished request's metrics that
every output carries).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from engine.core import cgroup_limits
from engine.core.config import EngineConfig
from engine.core.model_files import SECTION, model_files
from engine.core.outputs import RequestMetrics
from engine.core.phase_timer import PhaseTimer
from engine.core.placement import discover_placement
from engine.core.sequence import Sequence
from engine.core.step_result import StepResult
from telemetry.contract.derived import e2e_seconds, mean_itl, ttft_split
from telemetry.contract.hooks import EngineObserver
from telemetry.contract.outcomes import engine_error_code
from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord

log = logging.getLogger(__name__)
perf_counter = time.perf_counter

ENGINE_DISTRIBUTION = "infersight"
_THROTTLING = cgroup_limits.ThrottlingSampler()  # the process's cgroup: one sampler for every engine in it


def engine_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(ENGINE_DISTRIBUTION)
    except PackageNotFoundError:
        return "0.0.0+unknown"


def _gpu_pci_address(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - identity is best effort; never stops the engine
        return None


def _placement(device: str) -> dict:
    """Where this process runs (engine.core.placement; the affinity alone where sysfs cannot be read)."""
    try:
        p = discover_placement(gpu_pci_address=_gpu_pci_address(device))
        return dict(cpu_affinity=list(p.cpu_affinity), cpu_numa_nodes=list(p.cpu_numa_nodes),
                    mem_policy_nodes=list(p.mem_policy_nodes), gpu_numa_node=int(p.gpu_numa_node),
                    numa_mismatch=bool(p.numa_mismatch))
    except Exception:  # noqa: BLE001 - unreadable sysfs / procfs: fall back
        try:
            affinity = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = []
        return dict(cpu_affinity=affinity, cpu_numa_nodes=[], mem_policy_nodes=[], gpu_numa_node=-1,
                    numa_mismatch=False)


def process_launch_time(pid: int | str = "self") -> float:
    """When the process started (epoch seconds), before it loaded anything; 0.0 where /proc cannot say."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22: start time, clock ticks after boot
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return 0.0


def identity_sections(config: EngineConfig, generation: dict) -> dict:
    """What the model directory says, for the identity: `generation` (eos / bos ids as the engine reads them)
    and every behaviour file (engine/core/model_files.py)."""
    return {"generation": generation, SECTION: model_files(config.model)}


def _effective_limits(document: dict, sections: dict) -> None:
    """An engine limit left unset is recorded as it takes effect (the model's), in place: a peer's explicit
    `max_model_len 64` then reads against `256`, not against `unset`. Not in config_hash: it follows from
    config.json, which is."""
    if document.get("max_model_len") is None:
        positions = ((sections.get(SECTION) or {}).get("config_json") or {}).get("max_position_embeddings")
        if isinstance(positions, int) and not isinstance(positions, bool):
            document["max_model_len"] = positions


def build_replica_record(config: EngineConfig, *, model_name: str, weights_hash: str, tokenizer_hash: str,
                         chat_template_hash: str, quantization: str, attention_backend: str,
                         sections: dict | None = None) -> ReplicaRecord:
    """The replica's row. Its config document holds the engine options, the serve flags (config.serve_options)
    and `sections` (identity_sections: generation ids, the model directory's files), all hashed into
    config_hash, and its cgroup limits under "placement" (engine/core/cgroup_limits.py): where it runs, not what it
    computes, so like the CPU affinity columns outside the hash; the throttling counters at start are under
    "_start" (not compared)."""
    sections = sections or {}
    document = json.loads(config.to_json(sections))
    _effective_limits(document, sections)
    document["placement"] = {"cgroup": cgroup_limits.limits()}
    document["_start"] = {"cgroup_throttling": cgroup_limits.throttling()}
    return ReplicaRecord(
        replica_id=config.replica_id, host=socket.gethostname(), pid=os.getpid(), start_time=time.time(),
        engine_version=engine_version(), model_name=model_name, weights_hash=weights_hash,
        tokenizer_hash=tokenizer_hash, chat_template_hash=chat_template_hash,
        config_json=json.dumps(document, sort_keys=True), config_hash=config.config_hash(sections), dtype=config.dtype,
        quantization=quantization, speculative_mode=config.speculative_mode,
        attention_backend=attention_backend, device=config.device, role=config.role,
        deploy_time=config.deploy_time if config.deploy_time is not None else time.time(),
        **_placement(config.device))


def trace_id_of(trace_context: dict | None) -> str:
    """The 32-hex trace id of a W3C `traceparent` ("00-<trace id>-<span id>-<flags>"), or ""."""
    if not trace_context:
        return ""
    if trace_context.get("trace_id"):
        return str(trace_context["trace_id"])
    parts = str(trace_context.get("traceparent", "")).split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else ""


def build_request_record(seq: Sequence, *, replica_id: str, model_name: str, output_text: str) -> RequestRecord:
    """The finished request, its prompt and output text included: the record is in memory only; the
    Recorder alone decides whether the text is stored (its store_text, `serve --store-text`)."""
    arrival = seq.arrival_time
    scheduled, first, finish = seq.scheduled_time, seq.first_token_time, seq.finish_time
    queue, prefill, ttft = ttft_split(arrival, scheduled, first)
    return RequestRecord(
        replica_id=replica_id, request_id=seq.request_id, trace_id=trace_id_of(seq.trace_context),
        model_name=model_name, workload=seq.workload,
        arrival_time=arrival, scheduled_time=scheduled, first_token_time=first, finish_time=finish,
        queue_seconds=queue, prefill_seconds=prefill, ttft_seconds=ttft, e2e_seconds=e2e_seconds(arrival, finish),
        prompt_tokens=seq.num_prompt_tokens, output_tokens=seq.num_output_tokens,
        cached_tokens=seq.num_cached_tokens,
        prompt_token_ids=seq.prompt_token_ids, output_token_ids=seq.output_token_ids,
        token_times=[t - arrival for t in seq.token_times],
        sampling_params_json=seq.sampling_params.to_json(),
        finish_reason=seq.finish_reason or "abort", error=seq.error or "",
        error_code=engine_error_code(seq.finish_reason or "abort"),
        preemptions=seq.num_preemptions, spec_proposed=seq.spec_proposed, spec_accepted=seq.spec_accepted,
        prompt_text_hash=seq.prompt_text_hash, rendered_prompt_hash=seq.rendered_prompt_hash,
        prompt_text=seq.prompt_text or "", output_text=output_text,
        # a speculative step can emit tokens past a stop: keep one logprob per output token
        output_logprobs=seq.output_logprobs[:seq.num_output_tokens],
        # asked-for prompt logprobs (teacher-forced scoring); the first prompt token has none
        prompt_logprobs=[lp.logprob for lp in (seq.prompt_logprobs or [])[1:] if lp is not None],
    )


def request_metrics(seq: Sequence) -> RequestMetrics:
    """The finished request's timings and counts that its output carries (the API's; every output has them,
    whether or not an observer listens), derived as its RequestRecord's are."""
    arrival, first, finish = seq.arrival_time, seq.first_token_time, seq.finish_time
    queue, _, ttft = ttft_split(arrival, seq.scheduled_time, first)
    return RequestMetrics(
        arrival_time=arrival, scheduled_time=seq.scheduled_time, first_token_time=first,
        finish_time=finish, queue_seconds=queue, ttft_seconds=ttft, e2e_seconds=e2e_seconds(arrival, finish),
        # the per-request mean of the per-gap ITLs (0.0, not nan, in the API with fewer than two tokens)
        mean_itl_seconds=mean_itl(seq.token_times, empty=0.0),
        cached_tokens=seq.num_cached_tokens, preemptions=seq.num_preemptions,
        spec_proposed=seq.spec_proposed, spec_accepted=seq.spec_accepted)


def step_phase(batch) -> str:
    """A step's phase as the StepRecord names it: idle, prefill, decode, or mixed (both)."""
    if not batch.seqs:
        return "idle"
    if batch.num_decode_seqs == 0:
        return "prefill"
    return "decode" if batch.num_decode_seqs == len(batch.seqs) else "mixed"


def build_step_record(replica_id: str, step_id: int, batch, start_wall: float, split: tuple, num_generated: int,
                      telemetry_seconds: float, kv, evictions: int, scheduler, spec_fields: dict,
                      context_lens: list[int] = ()) -> StepRecord:
    """One scheduler step: the batch's shape, the host-time split, the KV pool and the queues after it.

    `split` is (schedule, prepare, forward, sample, postprocess) seconds; `kv` the KVCacheManager;
    `spec_fields` the speculator's proposed / accepted counters for this step (empty without one);
    `context_lens` each batch sequence's context length as the step's attention read it (computed +
    new tokens, drafts included): taken when the batch was prepared, since after the step the
    sequences have moved on (a speculator rolls rejected drafts back).
    """
    schedule_s, prepare_s, forward_s, sample_s, post_s = split
    return StepRecord(
        replica_id=replica_id, step_id=step_id, start_time=start_wall,
        duration_seconds=sum(split), phase=step_phase(batch), num_seqs=len(batch.seqs),
        num_prefill_seqs=len(batch.seqs) - batch.num_decode_seqs, num_decode_seqs=batch.num_decode_seqs,
        num_tokens=batch.num_prefill_tokens + batch.num_decode_tokens, num_prefill_tokens=batch.num_prefill_tokens,
        num_decode_tokens=batch.num_decode_tokens, num_generated_tokens=num_generated,
        schedule_seconds=schedule_s, prepare_seconds=prepare_s, forward_seconds=forward_s,
        sample_seconds=sample_s, postprocess_seconds=post_s, telemetry_seconds=telemetry_seconds,
        kv_blocks_total=kv.num_blocks, kv_blocks_used=kv.num_used_blocks, kv_blocks_free=kv.num_free_blocks,
        kv_blocks_cached=kv.num_cached_blocks, prefix_hit_tokens=batch.prefix_hit_tokens,
        prefix_query_tokens=batch.prefix_query_tokens, evictions=evictions,
        num_waiting=scheduler.num_waiting, num_running=scheduler.num_running,
        num_preempted=len(batch.preempted), num_context_tokens=sum(context_lens),
        **dict(zip(("cpu_periods", "cpu_throttled_periods", "cpu_throttled_seconds"), _THROTTLING.read())),
        **spec_fields)


class EngineTelemetry:
    """What the engine tells its observer: lifecycle hooks, a finished request's record, one StepRecord per
    forward. The engine calls it only while an observer listens. The observer's own time is measured here and
    carried by the next step record as its `telemetry_seconds`: a record cannot contain its own cost."""

    def __init__(self, observer: EngineObserver, replica_id: str, model_name: str, kv_cache, scheduler,
                 speculator=None):
        self.observer = observer
        self.replica_id = replica_id
        self.model_name = model_name
        # the parts whose state after a step its records read: the KV pool, the queues, the drafts (or None)
        self.kv_cache = kv_cache
        self.scheduler = scheduler
        self.speculator = speculator
        self.seconds = 0.0  # observer time since the last step record
        self._last_evictions = 0

    def notify(self, hook: str, *args) -> None:
        """The observer's `hook` called (when it listens), its time counted as the telemetry's."""
        if not self.observer.enabled:
            return
        t = perf_counter()
        getattr(self.observer, hook)(*args)
        self.seconds += perf_counter() - t

    def request_finished(self, seq: Sequence, text: str) -> None:
        t = perf_counter()
        self._report_finished(seq, text)
        self.seconds += perf_counter() - t

    def _report_finished(self, seq: Sequence, text: str) -> None:
        try:  # one request's record that cannot be built must not end the step of the others
            record = build_request_record(seq, replica_id=self.replica_id, model_name=self.model_name,
                                          output_text=text)
        except Exception:  # noqa: BLE001
            log.exception("the record of request %s could not be built", seq.request_id)
            return
        self.observer.on_request_finished(record)

    def steps(self, step_id: int, batch, timer: PhaseTimer, result: StepResult, finished: list,
              context_lens: list[int]) -> None:
        """One StepRecord per forward, numbered from `step_id`: a multi-step batch's sub-steps
        (engine/core/multi_step.py) each have their own, sub-step j counting the sequences that kept a j-th
        token and reading one more position; the step's finished requests are reported before the last."""
        splits = timer.splits(result.forward_seconds)
        start, last = timer.start_wall, len(splits) - 1
        kv = self.kv_cache
        spec_fields = self.speculator.step_record_fields if self.speculator is not None else {}
        for j, split in enumerate(splits):
            t = perf_counter()
            telemetry_seconds, self.seconds = self.seconds, 0.0
            for seq, out in finished if j == last else ():
                self._report_finished(seq, out.text)
            generated = sum(1 for n in result.kept if n > j) if last else sum(result.kept)
            record = build_step_record(
                self.replica_id, step_id + j, batch, start, split, generated, telemetry_seconds, kv,
                kv.evictions - self._last_evictions, self.scheduler, spec_fields, [n + j for n in context_lens])
            self._last_evictions = kv.evictions
            self.observer.on_step(record)
            start += sum(split)
            self.seconds += perf_counter() - t
