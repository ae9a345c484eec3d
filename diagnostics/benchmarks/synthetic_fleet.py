"""A large synthetic fleet history, generated inside ClickHouse (INSERT ... SELECT FROM numbers()).

Eight replicas of one model over the last hours, with faults for the diagnostics to find:
r3's tokenizer splits 2% of prompt texts differently, r5 runs int4 (its greedy outputs differ on
30% of prompts), r7 is 1.6x slower, versions 0.1.0 (r0-r3) and 0.2.0 (r4-r7, 1.15x slower TTFT),
speculative decoding on r6 with a worse acceptance at later positions, and two eval runs.
Rows are generated in chunks so memory stays bounded; all values are bound parameters.
"""

from __future__ import annotations

import hashlib
import json
import time

from telemetry.contract.records import ReplicaRecord

REPLICAS = [f"r{i}" for i in range(8)]
PROMPT_POOL = 20_011  # distinct prompt texts; prime, so each text reaches every replica (n % 8)
VOCAB = 500  # ids stay inside the tiny tokenizers' vocabulary

# one request per number; the replica is n % 8, the prompt n % PROMPT_POOL
_REQUESTS = """
INSERT INTO requests (replica_id, request_id, trace_id, model_name, workload, arrival_time, scheduled_time,
    first_token_time, finish_time, queue_seconds, prefill_seconds, ttft_seconds, e2e_seconds, prompt_tokens,
    output_tokens, cached_tokens, prompt_token_ids, output_token_ids, token_times, sampling_params_json,
    finish_reason, error, preemptions, spec_proposed, spec_accepted, prompt_text_hash, prompt_text, output_text)
SELECT replica_id, concat('req-', toString(n)), '', 'tiny', workload,
       arrival, arrival + toIntervalMicrosecond(toUInt64(queue * 1e6)),
       arrival + toIntervalMicrosecond(toUInt64(ttft * 1e6)), arrival + toIntervalMicrosecond(toUInt64(e2e * 1e6)),
       queue, ttft - queue, ttft, e2e, length(prompt), length(output), 0, prompt, output,
       arrayMap(k -> toFloat32(ttft + k * itl), range(length(output))),
       '{"temperature": 0.0, "max_tokens": 16, "stop": [], "stop_token_ids": [], "ignore_eos": true}',
       'length', '', 0, if(replica_id = 'r6', 48, 0), if(replica_id = 'r6', 24, 0),
       hex(cityHash64(pid)), '', ''
FROM (
    SELECT number AS n, concat('r', toString(n % 8)) AS replica_id, n % {pool:UInt64} AS pid,
           ['chat', 'agent', 'batch'][1 + (pid % 3)] AS workload,
           toDateTime64({t0:Float64} + n * {spacing:Float64}, 6, 'UTC') AS arrival,
           multiIf(replica_id = 'r7', 1.6, replica_id IN ('r4', 'r5', 'r6'), 1.15, 1.0) AS slow,
           16 + (pid * 7) % (if(workload = 'batch', 400, 120)) AS plen,
           arrayMap(k -> toUInt32(16 + (pid * 31 + k * 17) % ({vocab:UInt64} - 16)), range(plen)) AS base_prompt,
           if(replica_id = 'r3' AND pid % 50 = 0, arrayPushBack(arrayPopBack(base_prompt), toUInt32(7)),
              base_prompt) AS prompt,
           arrayMap(k -> toUInt32(16 + (pid * 13 + k * 29) % ({vocab:UInt64} - 16)), range(16)) AS base_output,
           if(replica_id = 'r5' AND pid % 10 < 3, arrayMap(x -> toUInt32((x + 1) % {vocab:UInt64}), base_output),
              base_output) AS output,
           0.001 * (1 + (cityHash64(n, 1) % 1000) / 1000.0) AS queue,
           slow * (0.01 + plen * 0.0002) * exp(((cityHash64(n, 2) % 1000) / 1000.0 - 0.5) * 0.6) AS ttft,
           slow * 0.008 * exp(((cityHash64(n, 3) % 1000) / 1000.0 - 0.5) * 0.4) AS itl,
           ttft + 15 * itl AS e2e
    FROM numbers({offset:UInt64}, {count:UInt64})
)
"""

_STEPS = """
INSERT INTO steps (replica_id, step_id, start_time, duration_seconds, phase, num_seqs, num_prefill_seqs,
    num_decode_seqs, num_tokens, num_prefill_tokens, num_decode_tokens, num_generated_tokens, schedule_seconds,
    prepare_seconds, forward_seconds, sample_seconds, postprocess_seconds, telemetry_seconds, kv_blocks_total,
    kv_blocks_used, kv_blocks_free, kv_blocks_cached, prefix_hit_tokens, prefix_query_tokens, evictions,
    num_waiting, num_running, num_preempted, spec_proposed, spec_accepted, spec_accepted_per_pos)
SELECT replica_id, intDiv(n, 8), toDateTime64({t0:Float64} + n * {spacing:Float64}, 6, 'UTC'),
       forward + host, if(n % 10 = 0, 'prefill', 'decode'), seqs, if(n % 10 = 0, seqs, 0), if(n % 10 = 0, 0, seqs),
       tokens, if(n % 10 = 0, tokens, 0), if(n % 10 = 0, 0, tokens), seqs,
       host * 0.3, host * 0.3, forward, host * 0.2, host * 0.15, host * 0.05, 1024, 300, 724, 50, 0, 0, 0, 1, seqs, 0,
       if(spec, 4 * seqs, 0), if(spec, accepted, 0),
       if(spec, [toUInt32(seqs * 0.8), toUInt32(seqs * if(late, 0.3, 0.6)), toUInt32(seqs * if(late, 0.2, 0.4)),
                 toUInt32(seqs * if(late, 0.1, 0.2))], [])
FROM (
    SELECT number AS n, concat('r', toString(n % 8)) AS replica_id, 1 + n % 16 AS seqs,
           if(n % 10 = 0, seqs * 200, seqs) AS tokens,
           0.004 + tokens * 0.00002 AS forward,
           multiIf(replica_id = 'r7', 2.0, 1.0) * 0.002 * exp(((cityHash64(n, 4) % 1000) / 1000.0 - 0.5) * 0.5) AS host,
           replica_id IN ('r6', 'r2') AS spec, replica_id = 'r6' AS late,
           toUInt32(seqs * if(late, 1.4, 2.0)) AS accepted
    FROM numbers({offset:UInt64}, {count:UInt64})
)
"""

_EVAL_ITEMS = """
INSERT INTO eval_items (run_id, item_id, suite, task, scorer, score, reference, output_text, input_token_ids,
    output_token_ids, output_logprobs, latency_seconds)
SELECT run, concat('item-', toString(number)), 'arith', 'add', 'exact',
       if(run = 'cand' AND number % 5 = 0, 0.0, if(number % 10 = 9, 0.0, 1.0)), '42', '',
       [toUInt32(1), toUInt32(number % {vocab:UInt64})],
       if(run = 'cand' AND number % 5 = 0, [toUInt32(3), toUInt32(4)], [toUInt32(3), toUInt32(5)]), [], 0.05
FROM numbers({items:UInt64}) ARRAY JOIN ['base', 'cand'] AS run
"""


def replica_records(t0: float, model_dir: str, tokenizer_hash: str, chat_template_hash: str) -> list[ReplicaRecord]:
    out = []
    for i, rid in enumerate(REPLICAS):
        config = {"model": model_dir, "quantization": "int4" if rid == "r5" else "none",
                  "speculative_mode": "draft" if rid in ("r2", "r6") else "none", "num_speculative_tokens": 4}
        config_json = json.dumps(config, sort_keys=True)
        out.append(ReplicaRecord(
            replica_id=rid, host="bench", pid=1, start_time=t0 - 60, engine_version="0.1.0" if i < 4 else "0.2.0",
            model_name="tiny", weights_hash="w", tokenizer_hash=tokenizer_hash, chat_template_hash=chat_template_hash,
            config_json=config_json, config_hash=hashlib.sha256(config_json.encode()).hexdigest()[:16],
            dtype="float32", quantization=config["quantization"], speculative_mode=config["speculative_mode"],
            attention_backend="torch", device="cpu", cpu_affinity=[0] if rid == "r7" else [0, 1],
            cpu_numa_nodes=[0], mem_policy_nodes=[0]))
    return out


def eval_runs(t0: float, items: int):
    from telemetry.contract.records import EvalRunRecord

    return [EvalRunRecord(run_id=run, suite="arith", start_time=t0 + k, finish_time=t0 + k + 60, config_json="{}",
                          config_hash=cfg, model_name="tiny", weights_hash="w", quantization=q, speculative_mode="none",
                          git_sha="bench", num_items=items, accuracy=acc)
            for k, (run, cfg, q, acc) in enumerate((("base", "cfg-fp32", "none", 0.9),
                                                    ("cand", "cfg-int4", "int4", 0.72)))]


def generate(store, n_requests: int = 1_000_000, n_steps: int = 1_000_000, hours: float = 6.0,
             model_dir: str = "", tokenizer_hash: str = "", chat_template_hash: str = "", chunk: int = 250_000,
             progress=print) -> float:
    """Fill `store` (migrated); returns t0, the start of the generated history."""
    t0 = time.time() - hours * 3600
    store.insert_records("replicas", replica_records(t0, model_dir, tokenizer_hash, chat_template_hash))
    for table, sql, total in (("requests", _REQUESTS, n_requests), ("steps", _STEPS, n_steps)):
        spacing = hours * 3600 / total
        for offset in range(0, total, chunk):
            count = min(chunk, total - offset)
            store.command(sql, {"t0": t0, "spacing": spacing, "offset": offset, "count": count,
                                "pool": PROMPT_POOL, "vocab": VOCAB})
            progress(f"{table}: {offset + count:,} / {total:,}")
    store.command(_EVAL_ITEMS, {"items": 500, "vocab": VOCAB})
    store.insert_records("eval_runs", eval_runs(t0, 500))
    return t0
