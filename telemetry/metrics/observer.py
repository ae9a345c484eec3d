"""MetricsObserver: turns the engine's hooks into Prometheus metrics.

The hooks run on the engine thread every step, so every labelled child is bound
once here (`.labels(...)` costs a dict lookup and a lock per call otherwise).
`telemetry/benchmarks/observer_cost.py` measures it.

Steps and finished requests are deferred: their hook only appends the record to a
queue, folded into the metrics every FOLD_EVERY records (on the engine thread, in
one warm loop) and before every collection (`FoldDeferred`, the registry's first
collector), so a scrape misses nothing. Called once per step between forwards that
evict the caches, an eager hook costs ~10 us where a fold costs ~1 us per record
(`infersight bench telemetry-overhead` gives the metrics' share of the engine thread).
Queue time and TTFT stay immediate (alerts on them must not wait for a fold).

With `vllm_names` (the default) the registry also shows vLLM's names for the same data
(vllm_names.py: views built at scrape time) and the few series only vLLM had, folded in the
same loop (vllm_fold.py).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from prometheus_client import CollectorRegistry

from telemetry.contract.derived import decode_seconds, itl_gaps, ttft_split
from telemetry.contract.hooks import EngineObserver
from telemetry.contract.outcomes import ABORTED, REJECTED, SHED, engine_error_code, outcome_of
from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord
from telemetry.metrics.definitions import FINISH_REASONS, engine_metrics

log = logging.getLogger(__name__)

FOLD_EVERY = 64  # deferred records folded at once on the engine thread
# the codes the engine writes on its own rows (counted in request_success by finish reason)
ENGINE_ERROR_CODES = frozenset(engine_error_code(reason) for reason in FINISH_REASONS) - {""}
USUAL_REJECTIONS = ("invalid_request", "context_length")
USUAL_FAILURES = ("internal_error", "upstream_error", "timeout")


class MetricsObserver(EngineObserver):
    """Updates the `infersight_*` metrics of one replica on `registry` (a private one by default)."""

    enabled = True

    def __init__(self, replica_id: str, model: str, registry: CollectorRegistry | None = None,
                 vllm_names: bool = True):
        self.replica_id = replica_id
        self.model = model
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = m = engine_metrics(self.registry)
        self._info_labels: tuple | None = None
        self._last_state: tuple | None = None
        self._arrivals: dict[str, float] = {}  # request id -> arrival, until its first token
        # deferred StepRecords / RequestRecords: appended by the engine thread, folded under the lock by
        # it or by a scrape (a deque: append and popleft are atomic, so no record is lost between them)
        self._deferred: deque = deque()
        self.failures = 0  # records a fold could not take (the hooks' own failures are the fan-out's)
        self._fold_lock = threading.RLock()  # a fold sets the gauges under it too
        m.before_collect.folds.append(self.fold)
        ids = (replica_id, model)

        self._ttft = m.ttft.labels(*ids)
        self._itl = m.itl.labels(*ids)
        self._e2e = m.e2e.labels(*ids)
        self._queue = m.queue.labels(*ids)
        self._prefill = m.prefill.labels(*ids)
        self._decode = m.decode.labels(*ids)
        self._request_prompt_tokens = m.request_prompt_tokens.labels(*ids)
        self._request_generation_tokens = m.request_generation_tokens.labels(*ids)
        self._step_duration = m.step_duration.labels(*ids)
        self._host_overhead = m.host_overhead.labels(*ids)
        self._running = m.running.labels(*ids)
        self._waiting = m.waiting.labels(*ids)
        self._kv_usage = m.kv_usage.labels(*ids)
        self._kv_used = m.kv_blocks.labels(*ids, "used")
        self._kv_free = m.kv_blocks.labels(*ids, "free")
        self._kv_cached = m.kv_blocks.labels(*ids, "cached")
        self._prompt_tokens = m.prompt_tokens.labels(*ids)
        self._generation_tokens = m.generation_tokens.labels(*ids)
        # the usual reasons exist from the start (rate() needs a series before its first increment)
        self._success = {reason: m.request_success.labels(*ids, reason) for reason in FINISH_REASONS}
        self._preemptions = m.preemptions.labels(*ids)
        self._requests_shed = m.requests_shed.labels(*ids)  # 0 from the start
        # refused and failed requests by reason (their error code); the usual ones exist from the start: the
        # availability burn-rate alerts add these families per replica, and rate() needs a series to add
        self._refused = {code: m.requests_rejected.labels(*ids, code) for code in USUAL_REJECTIONS}
        self._refused.update({code: m.requests_failed.labels(*ids, code) for code in USUAL_FAILURES})
        self._prefix_queries = m.prefix_queries.labels(*ids)
        self._prefix_hits = m.prefix_hits.labels(*ids)
        self._evictions = m.evictions.labels(*ids)
        self._spec_drafts = m.spec_drafts.labels(*ids)
        self._spec_draft_tokens = m.spec_draft_tokens.labels(*ids)
        self._spec_accepted = m.spec_accepted.labels(*ids)
        self._spec_per_pos: list = []  # grown on demand: the draft length is the engine's config
        self._tok_queries = m.tokenization_queries.labels(*ids)
        self._tok_hits = m.tokenization_hits.labels(*ids)
        self.vllm_names = vllm_names  # the server adds vLLM's http_* series too (http_metrics.py)
        self._vllm = self._vllm_fold(vllm_names)

    # -- hooks -------------------------------------------------------------------------

    def on_replica_start(self, record: ReplicaRecord) -> None:
        labels = (
            self.replica_id, self.model, record.engine_version, record.config_hash, record.quantization,
            record.speculative_mode, record.attention_backend, record.tokenizer_hash,
            record.chat_template_hash, str(bool(record.numa_mismatch)).lower(),
        )
        if self._info_labels is not None and self._info_labels != labels:
            self.metrics.replica_info.remove(*self._info_labels)  # a restart with a new identity
        self._info_labels = labels
        self.metrics.replica_info.labels(*labels).set(1)
        if self._vllm is not None:
            self._vllm.replica_start(record)

    # steps and finished requests: deferred (module docstring)

    def on_step(self, r: StepRecord) -> None:
        self._defer(r)

    def on_request_finished(self, r: RequestRecord) -> None:
        self._arrivals.pop(r.request_id, None)  # finished before its first token (aborted, or an error)
        self._defer(r)

    def _defer(self, r: StepRecord | RequestRecord) -> None:
        self._deferred.append(r)
        if len(self._deferred) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Fold every deferred record into the metrics (the engine thread, or a scrape's)."""
        with self._fold_lock:
            pending, step = self._deferred, None
            while pending:
                r = pending.popleft()
                try:
                    if isinstance(r, StepRecord):
                        self._fold_step(r)
                        step = r
                        if self._vllm is not None:
                            self._vllm.step(r)
                    else:
                        self._fold_finished(r)
                        if self._vllm is not None:
                            self._vllm.finished(r)
                except Exception:  # a malformed record: counted, logged once; the others still fold
                    self.failures += 1
                    if self.failures == 1:
                        log.exception("metrics: cannot fold a %s (further failures counted only)", type(r).__name__)
            if step is not None:  # the queue and KV gauges: the latest step's
                self.set_engine_state(step.num_running, step.num_waiting, step.kv_blocks_used, step.kv_blocks_free,
                                      step.kv_blocks_cached, step.kv_blocks_total)

    def _fold_step(self, r: StepRecord) -> None:
        if r.num_preempted:
            self._preemptions.inc(r.num_preempted)
        if r.prefix_query_tokens:
            self._prefix_queries.inc(r.prefix_query_tokens)
            if r.prefix_hit_tokens:
                self._prefix_hits.inc(r.prefix_hit_tokens)
        if r.evictions:
            self._evictions.inc(r.evictions)
        if r.phase != "idle" and r.duration_seconds > 0:
            self._step_duration.observe(r.duration_seconds)
            self._host_overhead.observe(min(1.0, max(0.0, 1.0 - r.forward_seconds / r.duration_seconds)))
        if r.spec_proposed:
            self._on_spec(r)

    def set_engine_state(self, running: int, waiting: int, kv_used: int, kv_free: int, kv_cached: int,
                         kv_total: int) -> None:
        """The queue and KV gauges. Each fold sets them from its latest step; so does the server at every
        scrape (from the engine's live state, after a fold), because requests aborted while no step runs
        (clients gone) change them too."""
        state = (running, waiting, kv_used, kv_free, kv_cached, kv_total)
        with self._fold_lock:  # a fold on the engine thread and a scrape: one at a time
            if state == self._last_state:  # in steady decode most steps change none of them: skip six sets
                return
            self._last_state = state
            self._running.set(running)
            self._waiting.set(waiting)
            self._kv_usage.set(kv_used / kv_total if kv_total else 0.0)
            self._kv_used.set(kv_used)
            self._kv_free.set(kv_free)
            self._kv_cached.set(kv_cached)

    def on_request_arrival(self, request_id, arrival_time, prompt_tokens, workload, trace_context) -> None:
        self._arrivals[request_id] = arrival_time

    def on_request_scheduled(self, request_id: str, when: float) -> None:
        # queue time and TTFT are observed when they happen, not when the request finishes (as vLLM
        # does): a TTFT alert does not wait for long generations to end
        arrival = self._arrivals.get(request_id)
        if arrival is not None:
            self._queue.observe(ttft_split(arrival, when, 0.0)[0])

    def on_first_token(self, request_id: str, when: float) -> None:
        arrival = self._arrivals.pop(request_id, None)
        if arrival is not None:
            self._ttft.observe(ttft_split(arrival, 0.0, when)[2])

    def _fold_refused(self, r: RequestRecord) -> None:
        """A request the HTTP layer answered itself: counted by outcome and reason, never in the latency
        and token metrics of the requests the engine served."""
        outcome = outcome_of(r.error_code, r.finish_reason)
        if outcome == SHED:
            self._requests_shed.inc()
            return
        if outcome == ABORTED:  # its client gave up before the server read it (499, 408): counted as the engine's
            self._success["abort"].inc()  # aborts are, in the SLO's total and never its errors (no budget spent)
            return
        child = self._refused.get(r.error_code)
        if child is None:
            family = self.metrics.requests_rejected if outcome == REJECTED else self.metrics.requests_failed
            child = self._refused[r.error_code] = family.labels(self.replica_id, self.model, r.error_code)
        child.inc()

    def _fold_finished(self, r: RequestRecord) -> None:
        if r.error_code and (r.http_status >= 400 or r.error_code not in ENGINE_ERROR_CODES):  # the HTTP layer answered
            self._fold_refused(r)
            return
        success = self._success.get(r.finish_reason)
        if success is None:  # an unexpected reason still counts, under its own name
            success = self._success[r.finish_reason] = self.metrics.request_success.labels(
                self.replica_id, self.model, r.finish_reason)
        success.inc()
        self._prompt_tokens.inc(r.prompt_tokens)
        self._request_prompt_tokens.observe(r.prompt_tokens)
        self._generation_tokens.inc(r.output_tokens)
        self._request_generation_tokens.observe(r.output_tokens)
        self._e2e.observe(r.e2e_seconds)
        if r.first_token_time > 0:
            if r.scheduled_time > 0:
                self._prefill.observe(r.prefill_seconds)
            self._decode.observe(decode_seconds(r.first_token_time, r.finish_time))
        if len(r.token_times) > 1:  # per gap, as the dashboards and the demo report define ITL
            self._itl.observe_many(itl_gaps(r.token_times))

    def on_tokenization(self, cache_hit: bool) -> None:
        self._tok_queries.inc()
        if cache_hit:
            self._tok_hits.inc()

    # -- vLLM's names -------------------------------------------------------------------

    def _vllm_fold(self, enabled: bool):
        """The vLLM-only series' fold for this replica (None: the registry shows infersight's names only)."""
        if not enabled:
            return None
        from telemetry.metrics.vllm_fold import VllmFold
        from telemetry.metrics.vllm_names import vllm_families

        return VllmFold(vllm_families(self.registry), self.replica_id, self.model)

    def set_max_model_len(self, max_model_len: int) -> None:
        """The replica's context length (the engine's, resolved from the model when not configured): vLLM's
        token-count histograms end their bounds there."""
        if self._vllm is not None and max_model_len:
            self._vllm.families.set_max_model_len(self.replica_id, self.model, int(max_model_len))

    # -- speculative decoding ----------------------------------------------------------

    def _on_spec(self, r: StepRecord) -> None:
        self._spec_drafts.inc(num_drafts(r))
        self._spec_draft_tokens.inc(r.spec_proposed)
        if r.spec_accepted:
            self._spec_accepted.inc(r.spec_accepted)
        per_pos = r.spec_accepted_per_pos
        while len(self._spec_per_pos) < len(per_pos):
            position = str(len(self._spec_per_pos))
            self._spec_per_pos.append(self.metrics.spec_accepted_per_pos.labels(self.replica_id, self.model, position))
        for child, accepted in zip(self._spec_per_pos, per_pos):
            if accepted:
                child.inc(accepted)


def num_drafts(r: StepRecord) -> int:
    """Drafts (sequences given a non-empty draft) in a step, as the engine counted them."""
    return r.spec_num_drafts
