"""Derived quantities, each defined once: in Python over record fields and in ClickHouse SQL
over the columns of the `requests` / `replicas` tables, the two forms agreeing exactly.

The engine, the Prometheus observer, diagnostics, the Streamlit dashboard, the Grafana
deep dives and the demo report all take their definitions from here, so that "ITL p99"
is one number wherever it is shown. Standard library only (it is part of the contract).

Inter-token latency (ITL) comes in two units; names say which:
- per gap (`itl_gaps`, `ITL_GAPS_SQL`, `itl_per_gap_quantiles_sql`): the time between an
  output token and the one before it. `token_times` are offsets from arrival, so a request
  with n tokens has n - 1 gaps; its first token has none (its latency is TTFT), and a
  request with fewer than two tokens contributes no gap. A gap is never negative (a wall
  clock stepping back reads 0); tokens accepted together (speculative decoding) give 0.
  This is what Prometheus' `infersight_inter_token_latency_seconds` histogram observes
  (and vLLM's), so every "ITL p50 / p99" chart shows per-gap quantiles.
- per request (`mean_itl`, `mean_itl_sql`): the mean of one request's gaps (nan with no
  gap). The regression and lagging-replica diagnostics compare these, because the request,
  never a token, is their unit of resampling; the engine returns it as `mean_itl_seconds`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# -- quantile sets -------------------------------------------------------------------------------

QUANTILES = (0.5, 0.9, 0.99)
QUANTILE_NAMES = tuple(f"p{round(q * 100)}" for q in QUANTILES)  # ("p50", "p90", "p99")


def _levels(levels: Sequence[float]) -> str:
    # ClickHouse takes quantile levels as literals in the text (they cannot be bound parameters)
    return ", ".join(f"{float(q):g}" for q in levels)


def quantiles(values: Iterable[float], levels: Sequence[float] = QUANTILES) -> list[float]:
    """Linear interpolation between order statistics (numpy's default, R7): what ClickHouse's
    `quantilesExactInclusive` returns for any number of values; nan when empty."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return [math.nan] * len(levels)
    out = []
    for q in levels:
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def quantiles_sql(expr: str, condition: str | None = None, levels: Sequence[float] = QUANTILES) -> str:
    """Exact quantiles of `expr` (or of the rows meeting `condition`): an Array(Float64) in the order of
    `levels`. Exact, not ClickHouse's `quantiles`: that one samples a reservoir of 8192 values, so two
    views of a large window would show two different p99s."""
    if condition is None:
        return f"quantilesExactInclusive({_levels(levels)})({expr})"
    return f"quantilesExactInclusiveIf({_levels(levels)})({expr}, {condition})"


# -- inter-token latency --------------------------------------------------------------------------

def itl_gaps(token_times: Sequence[float]) -> list[float]:
    """Per-gap ITL of one request: n token times (offsets or instants) give n - 1 gaps."""
    return [b - a if b > a else 0.0 for a, b in zip(token_times, token_times[1:])]


def mean_itl(token_times: Sequence[float], empty: float = math.nan) -> float:
    """Per-request mean ITL: the mean of its gaps; `empty` (nan, as in SQL) with fewer than two tokens."""
    gaps = itl_gaps(token_times)
    return sum(gaps) / len(gaps) if gaps else empty


def itl_gaps_sql(token_times: str = "token_times") -> str:
    """Array(Float64) of a row's per-gap ITLs (arrayDifference starts with a 0 for the first element:
    popped, since the first token has no gap)."""
    return f"arrayMap(g -> greatest(g, 0.), arrayPopFront(arrayDifference({token_times})))"


def mean_itl_sql(token_times: str = "token_times") -> str:
    """A row's per-request mean ITL, nan with fewer than two tokens."""
    return f"if(length({token_times}) > 1, arrayAvg({itl_gaps_sql(token_times)}), nan)"


def itl_per_gap_quantiles_sql(token_times: str = "token_times", levels: Sequence[float] = QUANTILES) -> str:
    """Quantiles over every gap of every request in the group (the -Array combinator: no ARRAY JOIN,
    so it sits beside per-request aggregates); nan when the group has no gap."""
    return f"quantilesExactInclusiveArray({_levels(levels)})({itl_gaps_sql(token_times)})"


ITL_GAPS_SQL = itl_gaps_sql()
MEAN_ITL_SQL = mean_itl_sql()
ITL_PER_GAP_QUANTILES_SQL = itl_per_gap_quantiles_sql()

# -- TTFT and its split, decode time, time per output token ---------------------------------------
# Lifecycle instants are epoch seconds, 0.0 for a stage the request never reached; the record's
# duration columns (queue_seconds, prefill_seconds, ttft_seconds, e2e_seconds) are computed here.
# A duration its writer could not measure is UNKNOWN (nan), never 0: a recording proxy sees neither
# the upstream's queue nor its prefill, nor when the first token of a whole (non-streamed) response
# came. Every percentile keeps such rows out (`known`, `known_sql`: ClickHouse's quantile functions skip
# nan as well, numpy's do not, and a comparison with nan is false, so a filter on a duration must say
# what it does with them); the engine's own measure of a proxied request, where its plugin wrote one,
# is `engine_timed_sql` below.

UNKNOWN = math.nan


def known(seconds: float) -> bool:
    """Was this duration measured (not UNKNOWN)?"""
    return math.isfinite(seconds)


def known_sql(column: str) -> str:
    return f"isFinite({column})"


def ttft_split(arrival: float, scheduled: float, first_token: float) -> tuple[float, float, float]:
    """(queue, prefill, ttft) seconds: arrival -> first scheduled -> first token; queue + prefill = ttft
    when both stages were reached, 0.0 for a stage that was not."""
    queue = scheduled - arrival if scheduled else 0.0
    prefill = first_token - scheduled if first_token and scheduled else 0.0
    ttft = first_token - arrival if first_token else 0.0
    return queue, prefill, ttft


def e2e_seconds(arrival: float, finish: float) -> float:
    return finish - arrival


def decode_seconds(first_token: float, finish: float) -> float:
    """First token to finish (0.0 without a first token)."""
    return max(0.0, finish - first_token) if first_token else 0.0


def tpot(e2e: float, ttft: float, output_tokens: int) -> float:
    """Time per output token after the first (vLLM's TPOT): end-to-end minus TTFT over n - 1 tokens.
    Unlike the mean ITL it includes the time from the last token to the finish; nan with n < 2."""
    return (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else math.nan


# SQL over the `requests` columns: TTFT is a request that got its first token (output_tokens > 0;
# the engine sets first_token_time exactly then) and whose writer saw when (TTFT_KNOWN_SQL: a proxied
# whole response got its tokens at an unknown time); the duration columns hold ttft_split's values
HAS_FIRST_TOKEN_SQL = "output_tokens > 0"
TTFT_KNOWN_SQL = f"{HAS_FIRST_TOKEN_SQL} AND {known_sql('ttft_seconds')}"
TTFT_QUANTILES_SQL = quantiles_sql("ttft_seconds", TTFT_KNOWN_SQL)
TPOT_SQL = "if(output_tokens > 1, (e2e_seconds - ttft_seconds) / (output_tokens - 1), nan)"


def prefix_hit_rate(cached_tokens: int, prompt_tokens: int) -> float:
    """A request's prefix-cache hit rate: prompt tokens served from the cache over prompt tokens (nan
    without a prompt)."""
    return cached_tokens / prompt_tokens if prompt_tokens > 0 else math.nan


def output_fraction(output_tokens: int, max_tokens: int | None) -> float:
    """Output length relative to the request's budget (max_tokens when set, else the raw count), so
    workloads with other budgets compare; 1.0 means it ran to max_tokens."""
    return output_tokens / max_tokens if max_tokens and max_tokens > 0 else float(output_tokens)


PREFIX_HIT_RATE_SQL = "if(prompt_tokens > 0, cached_tokens / prompt_tokens, nan)"
# a regular expression, not a JSON parse (3x cheaper over a million rows); 0: not set (null, absent)
MAX_TOKENS_SQL = r"""toUInt64OrZero(extract(sampling_params_json, '"max_tokens":\\s*(\\d+)'))"""
OUTPUT_FRACTION_SQL = (f"if({MAX_TOKENS_SQL} > 0, output_tokens / {MAX_TOKENS_SQL}, toFloat64(output_tokens))")

# -- the engine's own timing of a proxied request ----------------------------------------------------
# A recording proxy writes a request's row (token IDs, its own view of the times: no queue, no
# prefill split); the engine behind it (vLLM's plugin) writes `engine_request_timings` under the
# same (replica_id, request_id). Joined, a request has both: `t` the request row, `e` the engine's.
ENGINE_TIMING_JOIN_SQL = ("LEFT JOIN engine_request_timings AS e "
                          "ON e.replica_id = t.replica_id AND e.request_id = t.request_id")
ENGINE_TIMED_COLUMNS = ("queue_seconds", "prefill_seconds", "ttft_seconds", "e2e_seconds", "cached_tokens",
                        "preemptions")


def engine_timed_sql(column: str) -> str:
    """`column` as the engine measured it where it did (a joined timing row), else the request row's."""
    if column not in ENGINE_TIMED_COLUMNS:
        raise ValueError(f"{column!r} is not an engine-timed column; those are {ENGINE_TIMED_COLUMNS}")
    return f"if(e.request_id != '', e.{column}, t.{column})"


# -- time window and replica filters ---------------------------------------------------------------


def in_window(t: float, start: float, end: float) -> bool:
    """The window is half-open: [start, end)."""
    return start <= t < end


def window_sql(column: str, prefix: str = "") -> str:
    """[{start}, {end}) over a DateTime64 column; the bounds are bound as Float64 epoch seconds."""
    return (f"{column} >= toDateTime64({{{prefix}start:Float64}}, 6, 'UTC') "
            f"AND {column} < toDateTime64({{{prefix}end:Float64}}, 6, 'UTC')")


def selected(value: str, chosen: Sequence[str]) -> bool:
    """A list filter (replicas, versions, models ...): an empty list selects everything."""
    return not chosen or value in chosen


def selected_sql(column: str, parameter: str) -> str:
    """`selected` over a bound Array(String) parameter."""
    p = f"{{{parameter}:Array(String)}}"
    return f"(empty({p}) OR has({p}, {column}))"


def replica_filter_sql(column: str = "replica_id", prefix: str = "") -> str:
    return selected_sql(column, f"{prefix}replicas")


REPLICA_FILTER_SQL = replica_filter_sql()

# -- the latest start of each replica ----------------------------------------------------------------


def _field(r: Any, key: str) -> Any:
    return r[key] if isinstance(r, Mapping) else getattr(r, key)


def latest_starts(replicas: Iterable[Any]) -> dict[str, Any]:
    """replica_id -> its ReplicaRecord (or row mapping) with the greatest start_time."""
    latest: dict[str, Any] = {}
    for r in replicas:
        rid = _field(r, "replica_id")
        if rid not in latest or _field(r, "start_time") > _field(latest[rid], "start_time"):
            latest[rid] = r
    return latest


def latest_starts_sql(columns: Sequence[str], where: str | None = None) -> str:
    """One row per replica: `started` (its latest start_time) and `columns` as of that start.

    The filter runs in a subquery on the raw rows (the aliases shadow the column names, so
    `where` over them outside would be over aggregates); append HAVING / ORDER BY freely.
    The start time is called `started`: `max(start_time) AS start_time` would be read back
    inside the argMax calls."""
    cols = "".join(f",\n       argMax({c}, start_time) AS {c}" for c in columns)
    source = "replicas" if where is None else f"(SELECT * FROM replicas WHERE {where})"
    return f"SELECT replica_id, max(start_time) AS started{cols}\nFROM {source}\nGROUP BY replica_id"
