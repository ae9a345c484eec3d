"""Run inside .venv-vllm by test_vllm_stats_mapping.py: vLLM's own stats objects and config through the
plugin's mapping, the entry point as vLLM loads it, and the plugin switched off. Prints one JSON object."""

from __future__ import annotations

import dataclasses
import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories
from vllm.v1.metrics.stats import (FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerIterationDetails,
                                   SchedulerStats)
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from engine.serving.vllm_adapter.identity import replica_record
from engine.serving.vllm_adapter.stats_records import request_record, step_record


def config(model: str, **kwargs):
    return EngineArgs(model=model, max_model_len=256, dtype="float32", **kwargs).create_engine_config()


def main(model: str) -> dict:
    out: dict = {}
    finished = FinishedRequestStats(finish_reason=FinishReason.LENGTH, request_id="cmpl-a-0", e2e_latency=2.0,
                                    num_prompt_tokens=10, num_generation_tokens=5, queued_time=0.1, prefill_time=0.3,
                                    decode_time=1.5, num_cached_tokens=4, max_tokens_param=5, num_preemptions=1)
    out["finished"] = dataclasses.asdict(request_record(finished, 1000.0, replica_id="r", model_name="m"))
    # aborted while waiting: vLLM leaves its timestamps at 0, so its prefill / decode splits are garbage
    aborted = FinishedRequestStats(finish_reason=FinishReason.ABORT, request_id="chatcmpl-b", e2e_latency=0.5,
                                   num_prompt_tokens=7, num_generation_tokens=0, queued_time=-1e9, prefill_time=-4e8,
                                   decode_time=0.0)
    out["aborted"] = dataclasses.asdict(request_record(aborted, 1000.0, replica_id="r", model_name="m"))

    spec = SpecDecodingStats.new(3)
    spec.observe_draft(3, 2)
    spec.observe_draft(3, 0)
    details = SchedulerIterationDetails(iteration_index=7, num_ctx_requests=1, num_ctx_tokens=100,
                                        num_generation_requests=2, num_generation_tokens=6, elapsed_ms=12.5)
    scheduler = SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25, iteration_details=details,
                               prefix_cache_stats=PrefixCacheStats(requests=1, queries=100, hits=64),
                               spec_decoding_stats=spec)
    iteration = IterationStats()
    iteration.num_generation_tokens, iteration.num_preempted_reqs = 5, 1
    out["step"] = dataclasses.asdict(step_record(scheduler, iteration, replica_id="r", step_id=3, now=1000.0,
                                                 kv_blocks_total=400))
    # without --enable-logging-iteration-details: what the outputs show
    plain = IterationStats()
    plain.num_generation_tokens = 2
    plain.time_to_first_tokens_iter, plain.inter_token_latencies_iter = [0.1], [0.02]
    plain.prompt_token_stats.computed = 9
    out["step_plain"] = dataclasses.asdict(step_record(SchedulerStats(num_running_reqs=2), plain, replica_id="r",
                                                       step_id=4, now=1000.0, kv_blocks_total=400))

    factories = load_stat_logger_plugin_factories()
    out["factories"] = [f"{f.__module__}.{f.__qualname__}" for f in factories]
    ours = [f for f in factories if f.__module__ == "engine.serving.vllm_adapter.plugin"]
    out["subclass"] = bool(ours) and issubclass(ours[0], StatLoggerBase)
    first, second = config(model), config(model, additional_config={"infersight": {"stor": "x"}})
    off = ours[0](first, 0)
    off.log_engine_initialized()
    off.record(scheduler, iteration)
    misconfigured = ours[0](second, 0)
    out["off"] = {"enabled": off.enabled, "recorder": off.recorder is not None, "failures": off.failures,
                  "misconfigured_enabled": misconfigured.enabled}

    # identity: two starts of one configuration share the config hash; the plugin's options never show
    third = config(model, additional_config={"infersight": {"store": "http://w:secret-pw@127.0.0.1:9/db"}})
    rows = [replica_record(c, replica_id="r", engine_version="vllm-x", chat_template=None, chat_template_text=None)
            for c in (first, config(model), third)]
    out["identity"] = {"instance_ids": [first.instance_id, third.instance_id],
                       "config_hashes": [r.config_hash for r in rows],
                       "secret_in_json": any("secret-pw" in r.config_json for r in rows),
                       "model_in_json": json.loads(rows[0].config_json)["model"],
                       "weights_hash": rows[0].weights_hash, "tokenizer_hash": rows[0].tokenizer_hash,
                       "chat_template_hash": rows[0].chat_template_hash, "model_name": rows[0].model_name,
                       "dtype": rows[0].dtype, "device": rows[0].device}
    return out


if __name__ == "__main__":
    result = main(sys.argv[1])
    print("RESULT " + json.dumps(result, default=str))
