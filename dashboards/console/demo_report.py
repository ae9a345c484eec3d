"""The demo's report: what the store knows about a run, in SQL over the sidecar.

Every number here comes from the `requests` and `steps` tables the replicas
wrote through their recorders, not from the load generator, so the report
shows what an operator would see after the fact.
"""

from __future__ import annotations

from telemetry.contract import derived, outcomes

# latencies as the dashboards define them (telemetry.contract.derived): ITL per gap between
# consecutive output tokens, so "itl p99" here is the Streamlit and the Grafana "ITL p99"
PER_REPLICA = f"""
SELECT replica_id,
       count() AS requests,
       {outcomes.outcome_counts_sql()},
       sum(prompt_tokens) AS prompt_tok,
       sum(output_tokens) AS output_tok,
       sum(cached_tokens) / greatest(sum(prompt_tokens), 1) AS prefix_hit_rate,
       {derived.TTFT_QUANTILES_SQL} AS ttft,
       {derived.ITL_PER_GAP_QUANTILES_SQL} AS itl,
       {derived.quantiles_sql("e2e_seconds", outcomes.ENGINE_HAD_SQL)} AS e2e
FROM requests
WHERE request_id LIKE {{prefix:String}}
GROUP BY replica_id ORDER BY replica_id
"""

PER_WORKLOAD = f"""
SELECT workload, count() AS requests, sum(output_tokens) AS output_tok,
       sum(cached_tokens) / greatest(sum(prompt_tokens), 1) AS prefix_hit_rate,
       {derived.TTFT_QUANTILES_SQL} AS ttft
FROM requests
WHERE request_id LIKE {{prefix:String}}
GROUP BY workload ORDER BY workload
"""

STEPS = """
SELECT replica_id, count() AS steps,
       max(kv_blocks_used / greatest(kv_blocks_total, 1)) AS kv_peak,
       avg(kv_blocks_used / greatest(kv_blocks_total, 1)) AS kv_mean,
       sum(prefix_hit_tokens) / greatest(sum(prefix_query_tokens), 1) AS prefix_hit_rate,
       sum(num_preempted) AS preemptions,
       avg(1 - forward_seconds / greatest(duration_seconds, 1e-9)) AS host_share
FROM steps
WHERE start_time >= {since:Float64} AND replica_id IN {replicas:Array(String)}
GROUP BY replica_id ORDER BY replica_id
"""

def collect(store, run_id: str, replicas: list[str], since: float) -> dict:
    prefix = {"prefix": run_id + "-%"}
    return {
        "replicas": store.query_df(PER_REPLICA, prefix),
        "workloads": store.query_df(PER_WORKLOAD, prefix),
        "steps": store.query_df(STEPS, {"since": since, "replicas": replicas}),
    }


def _ms(values, i: int) -> str:
    try:
        return f"{float(values[i]) * 1000:.1f}"
    except (TypeError, IndexError, ValueError):
        return "-"


def _share(part, whole) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header] + rows]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])


def format_report(data: dict) -> str:
    reps, steps = data["replicas"], data["steps"].set_index("replica_id")
    q = derived.QUANTILE_NAMES
    rows = []
    for _, r in reps.iterrows():
        rid = r["replica_id"]
        s = steps.loc[rid] if rid in steps.index else None
        n = r["requests"]
        rows.append([rid, int(n), _share(r["answered"], n), _share(r["rejected"], n), _share(r["shed"], n),
                     _share(r["failed"] + r["timed_out"], n),
                     int(r["prompt_tok"]), int(r["output_tok"]),
                     *(_ms(r["ttft"], i) for i in range(len(q))), *(_ms(r["itl"], i) for i in range(len(q))),
                     _ms(r["e2e"], q.index("p90")), f"{r['prefix_hit_rate']:.0%}",
                     "-" if s is None else f"{s['kv_mean']:.0%}/{s['kv_peak']:.0%}",
                     "-" if s is None else f"{s['host_share']:.0%}"])
    out = ["per replica (from the store; latencies in ms; itl per gap between consecutive tokens; availability: "
           "the share of every request received that was answered, rejected, shed or failed)",
           _table(["replica", "req", "answered", "rejected", "shed", "failed", "prompt tok", "output tok",
                   f"ttft {q[0]}", *q[1:], f"itl {q[0]}",
                   *q[1:], "e2e p90", "prefix hit", "kv mean/peak", "host share"], rows)]
    w = data["workloads"]
    if len(w):
        out += ["", "per workload",
                _table(["workload", "req", "output tok", "prefix hit", f"ttft {q[0]}", *q[1:]],
                       [[r["workload"] or "-", int(r["requests"]), int(r["output_tok"]),
                         f"{r['prefix_hit_rate']:.0%}", *(_ms(r["ttft"], i) for i in range(len(q)))]
                        for _, r in w.iterrows()])]
    return "\n".join(out)
