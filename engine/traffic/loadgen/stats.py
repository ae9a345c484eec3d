"""Percentiles per workload and replica, and the tables the load generator prints."""

from __future__ import annotations

from collections import defaultdict

from engine.traffic.loadgen.client import RequestResult
from telemetry.contract import derived

# the quantile set every view shows (telemetry.contract.derived), plus p95: the calibration SLOs are p95s
LEVELS = tuple(sorted(set(derived.QUANTILES) | {0.95}))
PERCENTILES = tuple(round(q * 100) for q in LEVELS)


def percentiles(values: list[float]) -> dict:
    """{"p50": ..., "p90": ..., "p95": ..., "p99": ...} (None without values), interpolated as derived.quantiles does."""
    if not values:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": q for p, q in zip(PERCENTILES, derived.quantiles(values, LEVELS))}


def summarize(results: list[RequestResult], wall_seconds: float) -> dict:
    """{"all": {...}, "by_workload": {w: {...}}, "by_replica": {r: {...}}, "by_workload_replica": {"w/r": ...}}."""
    groups: dict[str, dict[str, list[RequestResult]]] = {
        "by_workload": defaultdict(list), "by_replica": defaultdict(list), "by_workload_replica": defaultdict(list)}
    for r in results:
        groups["by_workload"][r.workload].append(r)
        groups["by_replica"][r.replica].append(r)
        groups["by_workload_replica"][f"{r.workload}/{r.replica}"].append(r)
    out = {"all": _group(results, wall_seconds)}
    for name, group in groups.items():
        out[name] = {key: _group(rs, wall_seconds) for key, rs in sorted(group.items())}
    return out


def _group(results: list[RequestResult], wall_seconds: float) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall_seconds if wall_seconds > 0 else None,
        "ttft": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "itl": percentiles([x for r in ok for x in r.itl]),
        "e2e": percentiles([r.e2e for r in ok if r.e2e is not None]),
        "server_ttft": percentiles([r.server["ttft_seconds"] for r in ok if r.server]),
        "server_queue": percentiles([r.server["queue_seconds"] for r in ok if r.server]),
    }


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def format_table(summary: dict, section: str = "by_workload_replica") -> str:
    """A fixed-width table: one row per group, the percentiles of TTFT, ITL, e2e in milliseconds."""
    header = ["group", "req", "err", "tok/s"] + [f"{m} p{p}" for m in ("ttft", "itl", "e2e") for p in PERCENTILES]
    rows = []
    for key, g in list(summary[section].items()) + [("all", summary["all"])]:
        tps = g["output_tokens_per_s"]
        rows.append([key, str(g["requests"]), str(g["errors"]), "-" if tps is None else f"{tps:.1f}"]
                    + [_ms(g[m][f"p{p}"]) for m in ("ttft", "itl", "e2e") for p in PERCENTILES])
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    lines.insert(1, "-" * len(lines[0]))
    return "latencies in ms (client side)\n" + "\n".join(lines)
