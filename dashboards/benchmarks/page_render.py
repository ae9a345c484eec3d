"""How long each dashboard page takes with a large store (the goal: under 2 s at 1M requests).

    python -m dashboards.benchmarks.page_render                  # 1M requests, 2M steps, temp store
    python -m dashboards.benchmarks.page_render --store DIR      # reuse (or fill) a data directory

Seeding is done by ClickHouse itself (INSERT ... SELECT FROM numbers(), in chunks): synthetic
requests with real-sized token-ID arrays and per-token times, spread over the last 24 hours on
8 replicas (r7 slower), and scheduler steps; plus eval runs, findings and a profile. Then every
page is run by streamlit's AppTest against the store: first in a new session (includes the
session's one-time setup) with the default window, then cold (caches cleared) with the whole
store as window, then warm. Each line prints the page's wall time and the CPU time the process
spent on it (chdb's threads included; on a shared, loaded machine the CPU time is the steadier
number), the time its queries took, and how many rows they returned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGES = ["fleet", "requests", "compare", "scheduler", "kv_cache", "evals", "findings", "profiles"]
REPLICAS = 8
SPAN = 24 * 3600.0
CHUNK = 250_000

REQUESTS_COLUMNS = """replica_id, request_id, trace_id, model_name, workload, arrival_time, scheduled_time, first_token_time, finish_time, queue_seconds, prefill_seconds, ttft_seconds, e2e_seconds, prompt_tokens, output_tokens, cached_tokens, prompt_token_ids, output_token_ids, token_times, sampling_params_json, finish_reason, preemptions, prompt_text_hash"""
REQUESTS_SQL = f"""
INSERT INTO requests ({REQUESTS_COLUMNS})
SELECT {REQUESTS_COLUMNS} FROM (
SELECT concat('r', toString(number % {{replicas:UInt32}})) AS replica_id,
       concat('bench-', toString(number)) AS request_id,
       lower(hex(MD5(toString(number)))) AS trace_id,
       'bench-model' AS model_name,
       ['chat', 'agent', 'batch'][1 + number % 3] AS workload,
       {{start:Float64}} + number * {{span:Float64}} / {{total:UInt64}} AS t_arrival,
       if(number % {{replicas:UInt32}} = {{replicas:UInt32}} - 1, 3.0, 1.0) AS slow,
       slow * (0.001 + (cityHash64(number, 1) % 1000) / 20000.0) AS queue_seconds,
       slow * (0.02 + (cityHash64(number, 2) % 1000) / 10000.0) AS prefill_seconds,
       queue_seconds + prefill_seconds AS ttft_seconds,
       toUInt32(8 + cityHash64(number, 3) % 120) AS output_tokens,
       slow * (0.015 + (cityHash64(number, 4) % 100) / 10000.0) AS itl,
       ttft_seconds + (output_tokens - 1) * itl AS e2e_seconds,
       toDateTime64(t_arrival, 6, 'UTC') AS arrival_time,
       toDateTime64(t_arrival + queue_seconds, 6, 'UTC') AS scheduled_time,
       toDateTime64(t_arrival + ttft_seconds, 6, 'UTC') AS first_token_time,
       toDateTime64(t_arrival + e2e_seconds, 6, 'UTC') AS finish_time,
       toUInt32(16 + cityHash64(number, 5) % 240) AS prompt_tokens,
       toUInt32(cityHash64(number, 6) % 16) AS cached_tokens,
       arrayMap(i -> toUInt32(cityHash64(number, i) % 32000), range(prompt_tokens)) AS prompt_token_ids,
       arrayMap(i -> toUInt32(cityHash64(number, i + 100000) % 32000), range(output_tokens)) AS output_token_ids,
       arrayMap(i -> toFloat32(ttft_seconds + i * itl), range(output_tokens)) AS token_times,
       '{{"temperature": 0.7}}' AS sampling_params_json,
       if(number % 50 = 0, 'length', if(number % 997 = 0, 'abort', 'stop')) AS finish_reason,
       toUInt32(number % 401 = 0) AS preemptions,
       lower(hex(MD5(toString(number % 5000)))) AS prompt_text_hash
FROM numbers({{offset:UInt64}}, {{count:UInt64}})
)
"""

STEPS_COLUMNS = """replica_id, step_id, start_time, duration_seconds, phase, num_seqs, num_prefill_seqs, num_decode_seqs, num_tokens, num_prefill_tokens, num_decode_tokens, num_generated_tokens, schedule_seconds, prepare_seconds, forward_seconds, sample_seconds, postprocess_seconds, telemetry_seconds, kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached, prefix_hit_tokens, prefix_query_tokens, evictions, num_waiting, num_running, num_preempted"""
STEPS_SQL = f"""
INSERT INTO steps ({STEPS_COLUMNS})
SELECT {STEPS_COLUMNS} FROM (
SELECT concat('r', toString(number % {{replicas:UInt32}})) AS replica_id,
       intDiv(number, {{replicas:UInt32}}) AS step_id,
       toDateTime64({{start:Float64}} + number * {{span:Float64}} / {{total:UInt64}}, 6, 'UTC') AS start_time,
       0.01 + (cityHash64(number, 1) % 100) / 5000.0 AS duration_seconds,
       ['prefill', 'decode', 'decode', 'decode', 'mixed'][1 + number % 5] AS phase,
       toUInt32(1 + cityHash64(number, 2) % 16) AS num_seqs,
       toUInt32(phase != 'decode') AS num_prefill_seqs,
       num_seqs - num_prefill_seqs AS num_decode_seqs,
       toUInt32(if(phase = 'decode', 0, 64 + cityHash64(number, 3) % 448)) AS num_prefill_tokens,
       num_decode_seqs AS num_decode_tokens,
       num_prefill_tokens + num_decode_tokens AS num_tokens,
       num_seqs AS num_generated_tokens,
       duration_seconds * 0.08 AS schedule_seconds,
       duration_seconds * 0.07 AS prepare_seconds,
       duration_seconds * 0.7 AS forward_seconds,
       duration_seconds * 0.06 AS sample_seconds,
       duration_seconds * 0.05 AS postprocess_seconds,
       duration_seconds * 0.02 AS telemetry_seconds,
       toUInt32(4096) AS kv_blocks_total,
       toUInt32(cityHash64(number, 4) % 4096) AS kv_blocks_used,
       kv_blocks_total - kv_blocks_used AS kv_blocks_free,
       toUInt32(cityHash64(number, 5) % (kv_blocks_free + 1)) AS kv_blocks_cached,
       toUInt32(if(phase = 'decode', 0, cityHash64(number, 6) % 256)) AS prefix_hit_tokens,
       toUInt32(if(phase = 'decode', 0, 256)) AS prefix_query_tokens,
       toUInt32(cityHash64(number, 7) % 3 = 0) AS evictions,
       toUInt32(cityHash64(number, 8) % 32) AS num_waiting,
       num_seqs AS num_running,
       toUInt32(number % 500 = 0) AS num_preempted
FROM numbers({{offset:UInt64}}, {{count:UInt64}})
)
"""


def seed(store, n_requests: int, n_steps: int) -> None:
    from telemetry.contract.records import EvalItemRecord, EvalRunRecord, FindingRecord, ProfileRecord, ReplicaRecord

    start = time.time() - SPAN
    common = {"replicas": REPLICAS, "start": start, "span": SPAN}
    for sql, total, name in ((REQUESTS_SQL, n_requests, "requests"), (STEPS_SQL, n_steps, "steps")):
        t0 = time.perf_counter()
        for offset in range(0, total, CHUNK):
            store.command(sql, {**common, "total": total, "offset": offset, "count": min(CHUNK, total - offset)})
            print(f"  {name}: {min(offset + CHUNK, total):,}/{total:,} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    store.insert_records("replicas", [ReplicaRecord(
        replica_id=f"r{i}", host=f"host-{i // 4}", pid=100 + i, start_time=start, engine_version="0.1.0" if i < 4 else "0.2.0",
        model_name="bench-model", weights_hash="w", tokenizer_hash="t", chat_template_hash="c", config_json="{}",
        config_hash="cfgA" if i < 4 else "cfgB", dtype="bfloat16", quantization="none", speculative_mode="none",
        attention_backend="flashinfer", device=f"cuda:{i % 4}", cpu_affinity=list(range(i * 4, i * 4 + 4)),
        cpu_numa_nodes=[i // 4], mem_policy_nodes=[i // 4], gpu_numa_node=i // 4 if i != 7 else 0,
        numa_mismatch=i == 7) for i in range(REPLICAS)])
    runs = [EvalRunRecord(run_id=f"run-{k}", suite="bench", start_time=start + k, finish_time=start + k + 60,
                          config_json="{}", config_hash=f"cfg{k}", model_name="bench-model", weights_hash="w",
                          quantization=("none", "int4-g128")[k], speculative_mode="none", git_sha="0" * 7,
                          num_items=2000, accuracy=(0.8, 0.77)[k]) for k in range(2)]
    store.insert_records("eval_runs", runs)
    store.insert_records("eval_items", [
        EvalItemRecord(run_id=f"run-{k}", item_id=f"i{j}", suite="bench", task=f"t{j % 5}", scorer="exact",
                       score=float((j + k * (j % 7 == 0)) % 5 != 0), reference="x", output_text=f"answer {j + k * (j % 7 == 0)}",
                       input_token_ids=list(range(j % 50, j % 50 + 40)),
                       output_token_ids=list(range(j % 30, j % 30 + 20 + k * (j % 7 == 0))))
        for k in range(2) for j in range(2000)])
    store.insert_records("findings", [
        FindingRecord(finding_id=f"f{i}", kind=("regression", "lagging_replica", "tokenizer_divergence")[i % 3],
                      severity=("info", "warning", "critical")[i % 3], subject=f"r{i % REPLICAS}",
                      summary=f"finding {i}", window_start=start, window_end=start + SPAN,
                      evidence_json=json.dumps({"token_ids": list(range(20)), "p": 0.001}),
                      first_seen=start + i, last_seen=start + i + 10, diagnostic="bench") for i in range(300)])
    frames = [f"f{i} (engine/mod{i % 40}.py:{i})" for i in range(400)]
    store.insert_records("profiles", [
        ProfileRecord(profile_id="p0", replica_id="r7", pid=107, start_time=start + 100, duration_seconds=30,
                      stack=";".join(frames[(s * 7 + d * 13) % 400] for d in range(2 + s % 25)), samples=1 + s % 97,
                      group=("forward", "scheduler", "sampling", "telemetry")[s % 4]) for s in range(5000)])


def time_pages(store) -> list[tuple]:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboards import data

    data.use_store(store)
    # one untimed visit per page first: the process's one-time imports (plotly, the eval gate's
    # torch) are not what a page visit costs on a running dashboard
    t0 = time.perf_counter()
    for page in PAGES:
        warm = AppTest.from_file(APP, default_timeout=300)
        warm.switch_page(f"views/{page}.py")
        warm.run()
    print(f"warm-up (imports, one visit per page): {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for page in PAGES:
        measurements = []
        at = AppTest.from_file(APP, default_timeout=300)
        at.switch_page(f"views/{page}.py")
        for label, window, clear in (("new session, default window", None, True),
                                     ("cold, whole store", "everything", True),
                                     ("warm, whole store", "everything", False)):
            if window is not None:
                try:
                    at.selectbox(key="window").set_value(window)
                except KeyError:  # a page without a time window (evals, findings, profiles)
                    pass
            if clear:
                st.cache_data.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            at.run()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if at.exception:
                raise RuntimeError(f"{page}: {at.exception[0].value}")
            # the page lists its own queries (and their times) in its "Queries" expander
            log = [df.value for df in at.dataframe if list(df.value.columns) == ["query", "seconds", "rows"]]
            q = log[-1] if log else None
            measurements.append((label, wall, cpu, float(q["seconds"].sum()) if q is not None else float("nan"),
                                 int(q["rows"].sum()) if q is not None else 0, len(q) if q is not None else 0))
        for label, wall, cpu, q, n, count in measurements:
            rows.append((page, label, wall, cpu, q, n, count))
            print(f"{page:10s} {label:28s} wall {wall:6.3f} s  cpu {cpu:6.3f} s  "
                  f"(queries {q:6.3f} s wall, {count:2d} queries, {n:6,d} rows)", flush=True)
    data.use_store(None)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=2_000_000)
    parser.add_argument("--store", default=None, help="data directory (kept); default: a temporary one")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from telemetry.schema import migrate
    from telemetry.store import open_store

    directory = args.store or tempfile.mkdtemp(prefix="infersight-page-bench-")
    store = open_store(directory)
    try:
        migrate(store)
        have = int(store.query_df("SELECT count() AS n FROM requests")["n"][0])
        if have < args.requests:
            print(f"seeding {args.requests:,} requests and {args.steps:,} steps into {directory}", flush=True)
            t0 = time.perf_counter()
            store.command("TRUNCATE TABLE requests")
            store.command("TRUNCATE TABLE steps")
            seed(store, args.requests, args.steps)
            print(f"seeded in {time.perf_counter() - t0:.1f} s", flush=True)
        counts = {t: int(store.query_df(f"SELECT count() AS n FROM {t}")["n"][0]) for t in ("requests", "steps")}
        print(f"store: {counts['requests']:,} requests, {counts['steps']:,} steps; cpu count {os.cpu_count()}, "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        rows = time_pages(store)
        cold = [r for r in rows if r[1] == "cold, whole store"]
        worst = max(cold, key=lambda r: r[2])
        print(f"slowest cold render (whole store): {worst[0]} wall {worst[2]:.3f} s, cpu {worst[3]:.3f} s; "
              f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; under 2 s wall: "
              f"{sum(1 for r in cold if r[2] < 2)}/{len(PAGES)}, under 2 s cpu: {sum(1 for r in cold if r[3] < 2)}/{len(PAGES)}")
    finally:
        store.close()
        if args.store is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
