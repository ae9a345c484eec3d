"""The telemetry contract: every record infersight stores.

The engine produces these, the recorder buffers and ships them, the DDL in
`telemetry/schema/` mirrors them column for column, and diagnostics, dashboards
and evals read only what is defined here. Columns may be added; none may
silently change meaning.

Conventions:
- time is UTC; wall-clock instants are float seconds since the epoch
  (`time.time()`), durations are float seconds;
- token IDs are lists of ints (Array(UInt32) in ClickHouse);
- JSON-valued fields are `str` holding JSON (so the records stay flat);
- this module depends on nothing but the standard library, so the engine can
  import it without pulling in the telemetry stack.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ReplicaRecord:
    """One row per replica start: its identity and its placement."""

    replica_id: str
    host: str
    pid: int
    start_time: float
    engine_version: str
    model_name: str
    weights_hash: str
    tokenizer_hash: str
    chat_template_hash: str
    config_json: str  # the full engine config as JSON
    config_hash: str
    dtype: str
    quantization: str  # "none" | "int8" | "int4-g128" ...
    speculative_mode: str  # "none" | "ngram" | "draft"
    attention_backend: str  # "torch" | "flashinfer"
    device: str  # "cpu" | "cuda:0" ...
    # placement
    cpu_affinity: list[int] = field(default_factory=list)
    cpu_numa_nodes: list[int] = field(default_factory=list)
    mem_policy_nodes: list[int] = field(default_factory=list)
    gpu_numa_node: int = -1  # -1: no GPU or unknown
    numa_mismatch: bool = False
    labels_json: str = "{}"  # free-form operator labels (fleet name, zone ...)
    # the deploy (diagnostics/baseline.py): "baseline" | "candidate" | "" (not given), and when it was
    # deployed (epoch seconds, before the model loaded; `fleet up` gives its replicas one instant); 0.0 unknown
    role: str = ""
    deploy_time: float = 0.0


@dataclass(slots=True)
class RequestRecord:
    """One row per finished or aborted request."""

    replica_id: str
    request_id: str
    trace_id: str  # W3C trace id (32 hex), "" when not traced
    model_name: str
    workload: str  # workload tag from the client ("chat", "agent", "batch", "" ...)
    # lifecycle instants (epoch seconds); 0.0 when the request never got there
    arrival_time: float
    scheduled_time: float  # first time the scheduler ran any of its tokens
    first_token_time: float
    finish_time: float
    # derived durations (seconds); nan where the writer could not measure one (derived.UNKNOWN: a
    # recording proxy's queue and prefill, a proxied whole response's TTFT), never 0
    queue_seconds: float  # arrival -> scheduled
    prefill_seconds: float  # scheduled -> first token
    ttft_seconds: float  # arrival -> first token
    e2e_seconds: float  # arrival -> finish
    # tokens
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # offset of each output token from arrival_time, seconds (len == output_tokens)
    token_times: list[float]
    # sampling and outcome
    sampling_params_json: str
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    error: str = ""
    preemptions: int = 0
    spec_proposed: int = 0  # draft tokens proposed for this request
    spec_accepted: int = 0  # of which accepted
    # what the request came as (see `text_sha256` / `chat_messages_hash` below for exactly what is hashed):
    # a completion: sha256 of its prompt text; a chat: sha256 of its canonical messages JSON;
    # "" for a token-ID prompt. The same input has the same hash on every replica, whatever its
    # tokenizer or chat template (the tokenizer diagnostic groups requests by it).
    prompt_text_hash: str = ""
    # the text the tokenizer encoded (its token IDs are prompt_token_ids): a completion's prompt
    # text, a chat's prompt as the chat template rendered it. Stored only where the operator allows
    # it (`infersight serve --store-text`): the engine's records always carry it, the Recorder alone
    # decides what reaches the store, and writes "" otherwise (telemetry/recorder.py, store_text).
    prompt_text: str = ""
    output_text: str = ""  # the output text as streamed; stored like prompt_text, only where allowed
    # chat only: sha256 of the prompt text the chat template rendered ("" for completions and token-ID
    # prompts, whose text is not rendered): same messages (prompt_text_hash) with a different
    # rendered_prompt_hash on two replicas means their chat templates differ
    rendered_prompt_hash: str = ""
    # natural-log probability of each sampled output token (one per output_token_ids entry) under the
    # model's raw distribution (log-softmax before temperature / top-k / top-p); [] where not computed
    output_logprobs: list[float] = field(default_factory=list)
    # prompt_logprobs asked: the raw logprob of each prompt token after the first, given those before it
    # (teacher-forced scoring: telemetry.contract.probes' rescore requests); [] otherwise
    prompt_logprobs: list[float] = field(default_factory=list)
    # availability (telemetry/contract/outcomes.py): every request received is a row, refused ones too.
    # The status the client got; 0 on the engine's own rows (their finish_reason says how they ended).
    http_status: int = 0
    error_code: str = ""  # outcomes.ERROR_CODES: why it was not answered; "" when answered
    error_param: str = ""  # a rejected request: the field at fault (as the 400 named it)
    # the numbers behind error_code as JSON: the API's own code, a length refusal's prompt length and limit,
    # the queue's state when shed, the upstream's error type and code; "" when answered
    error_detail_json: str = ""
    upstream_status: int = 0  # a recording proxy: the upstream's HTTP status (0: not proxied, or unreachable)
    # a recording proxy: the upstream's error body as it came; it may quote the request (a validation
    # error's input), so it is text like prompt_text: stored only where the operator allows it
    upstream_error_body: str = ""


@dataclass(slots=True)
class StepRecord:
    """One row per scheduler step."""

    replica_id: str
    step_id: int  # monotonically increasing per replica start
    start_time: float  # epoch seconds
    duration_seconds: float  # wall time of the whole step
    phase: str  # "prefill" | "decode" | "mixed" | "idle"
    num_seqs: int  # sequences in the batch
    num_prefill_seqs: int
    num_decode_seqs: int
    num_tokens: int  # tokens fed to the forward pass
    num_prefill_tokens: int
    num_decode_tokens: int
    num_generated_tokens: int  # tokens appended to outputs this step
    # host time split, seconds
    schedule_seconds: float
    prepare_seconds: float
    forward_seconds: float
    sample_seconds: float
    postprocess_seconds: float
    telemetry_seconds: float  # time spent in observers during the previous step
    # KV cache (blocks)
    kv_blocks_total: int
    kv_blocks_used: int  # referenced by running sequences
    kv_blocks_free: int  # not referenced (includes cached)
    kv_blocks_cached: int  # free but holding a reusable prefix
    prefix_hit_tokens: int  # prompt tokens served from cache in this step's admissions
    prefix_query_tokens: int  # prompt tokens looked up in this step's admissions
    evictions: int  # cached blocks evicted this step
    # queues
    num_waiting: int
    num_running: int
    num_preempted: int  # preemptions this step
    # speculative decoding
    spec_proposed: int = 0
    spec_accepted: int = 0
    # accepted count per draft position (index 0 = first draft token) this step
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    spec_num_drafts: int = 0  # sequences that got a non-empty draft this step
    num_context_tokens: int = 0  # tokens attention reads this step: sum of the batch's context lengths
    # the replica's cgroup CPU throttling counters as last read (at most a second old; cumulative, engine/
    # cgroup_limits.py): periods, periods throttled, seconds throttled; 0 where the OS does not expose them
    cpu_periods: int = 0
    cpu_throttled_periods: int = 0
    cpu_throttled_seconds: float = 0.0


@dataclass(slots=True)
class EvalRunRecord:
    run_id: str
    suite: str
    start_time: float
    finish_time: float
    config_json: str
    config_hash: str
    model_name: str
    weights_hash: str
    quantization: str
    speculative_mode: str
    git_sha: str
    num_items: int
    accuracy: float
    endpoint: str = ""  # URL when run against a deployed replica
    notes: str = ""


@dataclass(slots=True)
class EvalItemRecord:
    run_id: str
    item_id: str
    suite: str
    task: str  # sub-task label (e.g. "addition")
    scorer: str
    score: float  # 1.0 correct / 0.0 wrong, or a graded score
    reference: str
    output_text: str
    input_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float] = field(default_factory=list)  # logprob of each output token
    latency_seconds: float = 0.0


@dataclass(slots=True)
class FindingRecord:
    finding_id: str  # stable hash of (kind, subject, scope) so re-runs update, not duplicate
    kind: str  # "regression" | "lagging_replica" | "tokenizer_divergence" | "quality_drift" ...
    severity: str  # "info" | "warning" | "critical"
    subject: str  # what it is about: a replica id, a version pair, a config hash ...
    summary: str  # one line a person reads first
    window_start: float
    window_end: float
    evidence_json: str  # numbers, tests, replicas, token IDs, first divergence
    first_seen: float
    last_seen: float
    diagnostic: str = ""  # which diagnostic produced it


@dataclass(slots=True)
class ProfileRecord:
    profile_id: str
    replica_id: str
    pid: int
    start_time: float
    duration_seconds: float
    stack: str  # folded stack "a;b;c"
    samples: int
    group: str = ""  # scheduler | input_preparation | forward | sampling | telemetry | server | other


@dataclass(slots=True)
class ProbeBaselineRecord:
    """One probe of a pinned round (`infersight probe --pin`): what the model should answer, with
    the identity that answered it. The latest pin of (model_name, probe_id) is the baseline."""

    model_name: str
    probe_id: str  # telemetry.contract.probes: the probe's name in the shipped suite
    pinned_time: float
    round_id: str
    replica_id: str  # the replica whose answers were pinned
    api: str  # "completions" | "chat"
    weights_hash: str
    tokenizer_hash: str
    chat_template_hash: str
    config_hash: str
    engine_version: str
    prompt_text_hash: str
    rendered_prompt_hash: str
    sampling_params_json: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: str
    note: str = ""  # why it was pinned (free text from --note)


@dataclass(slots=True)
class EngineRequestTimingRecord:
    """What the engine measured of a request whose `requests` row a recording proxy writes (vLLM's
    plugin behind `infersight proxy`): joins that row on (replica_id, request_id)."""

    replica_id: str
    request_id: str  # the id of the proxy's row (the plugin maps the engine's id back to it)
    engine_request_id: str  # the engine's own id (vLLM: cmpl-<id>-<prompt index>, chatcmpl-<id>)
    model_name: str
    arrival_time: float
    scheduled_time: float
    first_token_time: float
    finish_time: float
    queue_seconds: float
    prefill_seconds: float
    ttft_seconds: float
    e2e_seconds: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int
    finish_reason: str
    error: str = ""


RECORD_TYPES: dict[str, type] = {
    "replicas": ReplicaRecord,
    "requests": RequestRecord,
    "steps": StepRecord,
    "engine_request_timings": EngineRequestTimingRecord,
    "eval_runs": EvalRunRecord,
    "eval_items": EvalItemRecord,
    "findings": FindingRecord,
    "profiles": ProfileRecord,
    "probe_baselines": ProbeBaselineRecord,
}


# -- the prompt hashes: every writer (engine, proxies, tests) computes them with these ---------------

def text_sha256(text: str) -> str:
    """sha256 (hex) of `text` encoded as UTF-8: a completion's `prompt_text_hash`, and a chat's
    `rendered_prompt_hash` (of the rendered prompt text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # content parts ({"type": "text", "text": ...} or objects with a .text): their text, joined
    return "".join(part.get("text", "") if isinstance(part, dict) else str(getattr(part, "text", ""))
                   for part in content)


def canonical_chat_json(messages: list, add_generation_prompt: bool = True) -> str:
    """A chat request's messages as one canonical JSON text, the input of its `prompt_text_hash`.

    The list of {"content": text, "role": role} objects in the order given (content parts joined
    into one string; any other key, e.g. "name", left out), as `json.dumps(..., sort_keys=True,
    separators=(",", ":"), ensure_ascii=False)` writes it. With `add_generation_prompt` false (the
    prompt does not end with the assistant's turn marker) it is the object
    {"add_generation_prompt": false, "messages": [...]} instead, so that the two renderings of one
    conversation never share a hash.
    """
    plain = [{"content": _content_text(m.get("content") if isinstance(m, dict) else getattr(m, "content", None)),
              "role": str(m.get("role") if isinstance(m, dict) else getattr(m, "role", ""))} for m in messages]
    document: Any = plain if add_generation_prompt else {"add_generation_prompt": False, "messages": plain}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chat_messages_hash(messages: list, add_generation_prompt: bool = True) -> str:
    """A chat request's `prompt_text_hash`: sha256 of `canonical_chat_json(messages, add_generation_prompt)`."""
    return text_sha256(canonical_chat_json(messages, add_generation_prompt))


def record_fields(record_type: type) -> list[str]:
    """Column names of a record type, in declaration order (the DDL's order)."""
    return [f.name for f in dataclasses.fields(record_type)]


def as_row(record: Any) -> tuple:
    """A record as a tuple in column order (cheap: no dict is built)."""
    return tuple(getattr(record, name) for name in record.__slots__)
