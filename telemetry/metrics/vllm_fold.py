"""The `vllm:*` series infersight had no family for, fed from the observer's fold.

MetricsObserver folds step and finished-request records in batches (observer.py); for a replica
that exports vLLM's names it hands each record here too, in the same loop. Per finished request:
a few bisects and one regex over its sampling parameters; per step: one bisect. Nothing per token.
Definitions are vLLM's (vllm/v1/metrics/stats.py), from the fields of the records:
- time per output token: decode time / (output tokens - 1), 0 for a single token;
- inference time: first scheduled to the last token (the finish);
- iteration tokens: prompt tokens computed + tokens generated in a step;
- prefill KV computed: prompt tokens less the cached ones;
- request parameters n and max_tokens, and the most tokens any of the n choices generated, once per
  request: a request with n choices is n engine requests `<id>-<k>` (engine/serving/server/choices.py).
"""

from __future__ import annotations

import json
import re

from telemetry.contract.derived import decode_seconds
from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord
from telemetry.metrics.vllm_names import VllmFamilies

# the request parameters in a record's sampling_params_json, a JSON object: a regex is ~1 us where
# json.loads is ~9 us, on the engine thread. Inside a JSON string every quote is escaped, so the pattern
# matches keys only; with one object in the text (one "{"), they are the top level's. Anything else
# (a nested object: logit_bias, response_format) is parsed.
_PARAM = re.compile(r'"(best_of|max_tokens|n)":\s*(\d+)\s*[,}]')
_KEYS = ("best_of", "max_tokens", "n")


def request_params(sampling_params_json: str) -> tuple[int, int | None, int]:
    """(n, max_tokens or None, engine requests the client's request became: best_of, else n)."""
    if sampling_params_json.count("{") == 1:
        found = {key: int(value) for key, value in _PARAM.findall(sampling_params_json)}
    else:
        try:
            params = json.loads(sampling_params_json)
        except ValueError:
            params = None
        params = params if isinstance(params, dict) else {}
        found = {k: v for k in _KEYS if type(v := params.get(k)) is int and v >= 0}
    n = found.get("n") or 1
    return n, found.get("max_tokens"), max(n, found.get("best_of") or n)


class VllmFold:
    """One replica's bound children of the vLLM-only families (one writer: the folding thread)."""

    def __init__(self, families: VllmFamilies, replica_id: str, model: str):
        self.families = f = families
        self.replica_id, self.model = replica_id, model
        key = (replica_id, model)
        self._tpot = f.tpot.labels(*key)
        self._inference = f.inference.labels(*key)
        self._iteration_tokens = f.iteration_tokens.labels(*key)
        self._params_n = f.params_n.labels(*key)
        self._params_max_tokens = f.params_max_tokens.labels(*key)
        self._max_generated = f.max_num_generation_tokens.labels(*key)
        self._num_preemptions = f.num_preemptions.labels(*key)
        self._prefill_kv_computed = f.prefill_kv_computed.labels(*key)
        self._cached = f.prompt_tokens_cached.labels(model, f.engine(replica_id))
        self._choices: dict[str, list[int]] = {}  # parent request id -> [choices finished, most tokens]
        self._cache_info: tuple | None = None
        self._config: dict = {}

    def replica_start(self, record: ReplicaRecord) -> None:
        try:
            self._config = json.loads(record.config_json or "{}")
        except ValueError:
            self._config = {}
        max_model_len = self._config.get("max_model_len")
        if isinstance(max_model_len, int) and max_model_len > 0:
            self.families.set_max_model_len(self.replica_id, self.model, max_model_len)

    def step(self, r: StepRecord) -> None:
        if r.phase != "idle":
            self._iteration_tokens.observe(r.num_prefill_tokens + r.num_generated_tokens)
        if self._cache_info is None and r.kv_blocks_total:
            self._set_cache_info(r.kv_blocks_total)

    def finished(self, r: RequestRecord) -> None:
        if r.first_token_time > 0 and r.finish_time > 0:
            decode = decode_seconds(r.first_token_time, r.finish_time)
            self._tpot.observe(decode / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0)
            if r.scheduled_time > 0:
                self._inference.observe(max(0.0, r.finish_time - r.scheduled_time))
        self._num_preemptions.observe(r.preemptions)
        self._prefill_kv_computed.observe(max(0, r.prompt_tokens - max(r.cached_tokens, 0)))
        if r.cached_tokens > 0:
            self._cached.inc(r.cached_tokens)
        n, max_tokens, engine_requests = request_params(r.sampling_params_json)
        if max_tokens:
            self._params_max_tokens.observe(max_tokens)
        self._request_done(r.request_id, n, engine_requests, r.output_tokens)

    def _request_done(self, request_id: str, n: int, engine_requests: int, output_tokens: int) -> None:
        """n and the most tokens generated are the client's request's: observed when its last choice ends."""
        if engine_requests > 1:
            parent = request_id.rpartition("-")[0] or request_id
            seen = self._choices.setdefault(parent, [0, 0])
            seen[0] += 1
            seen[1] = max(seen[1], output_tokens)
            if seen[0] < engine_requests:
                return
            del self._choices[parent]
            output_tokens = seen[1]
        self._params_n.observe(n)
        self._max_generated.observe(output_tokens)

    def _set_cache_info(self, num_blocks: int) -> None:
        c = self._config
        labels = {"block_size": str(c.get("block_size")), "cache_dtype": str(c.get("dtype", "auto")),
                  "enable_prefix_caching": str(bool(c.get("enable_prefix_caching", True))),
                  "engine": self.families.engine(self.replica_id), "num_gpu_blocks": str(num_blocks),
                  "kv_cache_memory_bytes": str(c.get("kv_cache_memory_bytes"))}
        self._cache_info = tuple(sorted(labels.items()))
        self.families.cache_config_info.labels(**labels).set(1)
