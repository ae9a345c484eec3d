"""Regression: is a candidate population slower than a baseline one, and did latency creep up over time?

Populations are scopes (versions, config hashes, replicas or time windows). Request latencies
(TTFT, inter-token latency, end-to-end, queue time) are compared within strata of workload and
prompt-length bucket, per-step host time and throughput within strata of step phase and batch
size, so that a different traffic mix is not mistaken for a slower engine. The unit of comparison
is the request for request metrics and, for step metrics, the time block: the median of one
replica's steps of the stratum in each BLOCK_SECONDS window. Consecutive steps are autocorrelated
(they share a batch, a load level, a host's state), so a thousand steps are not a thousand
observations; blocks nearly are. Each stratum gets Mann-Whitney U and Kolmogorov-Smirnov,
Holm-adjusted over all strata and metrics together (one family: a run tests them all), Cliff's
delta, and the ratio of medians with a bootstrap confidence interval. ClickHouse does the heavy
lifting: counts, block medians, quantiles and a uniform sample per stratum (groupArraySample);
Python only sees samples.

Change points: requests are split by a hash of request_id into a placement half and a confirmation
half. Per time bucket, the median of each placement request's latency relative to its stratum's
median is segmented with ruptures (PELT); a level shift up counts only when the confirmation half,
which played no part in placing it, shows it too (MWU + KS, Bonferroni over the change points, and
the ratio of medians' bootstrap 95% interval at or above min_shift, not only its point). Placement
on noise finds the noise's own extremes; data that did not choose them does not confirm them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from diagnostics import change_attribution, mechanisms
from diagnostics.request_strata import PROMPT_BUCKET
from diagnostics.findings import Finding, insufficient
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, requests_in, steps_in
from evals.stats import DELTA_LARGE, DELTA_SMALL, MIN_SAMPLES, Comparison, change_points, compare_samples, holm
from telemetry.contract import derived
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

DIAGNOSTIC = "regression"
# per stratum and side, drawn in ClickHouse; aggregate-function parameters must be literals in the SQL
# text (ClickHouse does not bind them), so these two constants are the only numbers written into SQL
SAMPLE_SIZE = 1000
SEED = 1
ALPHA = 0.01
MIN_RATIO = 1.05  # a slowdown smaller than 5% is not worth a finding, however significant
BLOCK_SECONDS = 10  # step metrics: one value (the median) per replica, stratum and block of this length

BATCH_BUCKET = ("multiIf(t.num_tokens < 2, 'tokens 1', t.num_tokens < 8, 'tokens 2-7', t.num_tokens < 64, "
                "'tokens 8-63', t.num_tokens < 512, 'tokens 64-511', 'tokens>=512')")

# metric -> (table, SQL expression over `t.`, higher is worse). Request metrics are one value per
# request (the unit of resampling), so ITL here is each request's mean of its per-gap ITLs
# (telemetry.contract.derived), not the per-gap ITL the dashboards' p50 / p99 charts show.
METRICS = {
    "ttft": ("requests", "t.ttft_seconds", True),
    "itl": ("requests", derived.mean_itl_sql("t.token_times"), True),
    "e2e": ("requests", "t.e2e_seconds", True),
    "queue": ("requests", "t.queue_seconds", True),
    "step_host": ("steps", "greatest(t.duration_seconds - t.forward_seconds, 0)", True),
    "step_throughput": ("steps", "t.num_tokens / greatest(t.duration_seconds, 1e-9)", False),
}
LABELS = {"ttft": "time to first token", "itl": "inter-token latency (mean per request)", "e2e": "end-to-end latency",
          "queue": "queue time", "step_host": "per-step host time (outside the forward pass)",
          "step_throughput": "step throughput (tokens/s)"}

# -- SQL ------------------------------------------------------------------------------------------

_REQUEST_METRICS = tuple(m for m, (table, _, _) in METRICS.items() if table == "requests")
_STEP_METRICS = tuple(m for m, (table, _, _) in METRICS.items() if table == "steps")

# per stratum of workload and prompt length: a sample of requests
_REQUEST_COLUMNS = (f"t.model_name AS model_name, t.workload AS workload, {PROMPT_BUCKET} AS bucket, "
                    f"t.finish_reason AS finish_reason, t.first_token_time AS first_token_time, "
                    + ", ".join(f"{METRICS[m][1]} AS {m}" for m in _REQUEST_METRICS))
_REQUEST_SAMPLES = (f"SELECT model_name, workload AS group_a, bucket AS group_b, count() AS n, "
                    f"groupArraySample({SAMPLE_SIZE}, {SEED})(({', '.join(_REQUEST_METRICS)})) AS sample "
                    f"FROM {{source}} WHERE finish_reason NOT IN ('abort', 'error') "
                    f"AND first_token_time > toDateTime64(0, 6, 'UTC') "
                    f"GROUP BY model_name, group_a, group_b")

# per stratum of phase and batch size: a sample of block medians ({prefix}: the side's parameter prefix)
_STEP_COLUMNS = (f"t.replica_id AS replica_id, t.start_time AS start_time, t.phase AS phase, "
                 f"{BATCH_BUCKET} AS bucket, " + ", ".join(f"{METRICS[m][1]} AS {m}" for m in _STEP_METRICS))
_STEP_BLOCKS = (f"SELECT model_name, phase, bucket, {', '.join(f'median({m}) AS block_{m}' for m in _STEP_METRICS)} "
                f"FROM {{source}} WHERE phase != 'idle' "
                f"GROUP BY model_name, phase, bucket, replica_id, "
                f"intDiv(toUnixTimestamp64Milli(start_time), {{{{prefix}}block_ms:Int64}})")
_STEP_SAMPLES = (f"SELECT model_name, phase AS group_a, bucket AS group_b, count() AS n, "
                 f"groupArraySample({SAMPLE_SIZE}, {SEED})(({', '.join(f'block_{m}' for m in _STEP_METRICS)})) "
                 f"AS sample FROM ({_STEP_BLOCKS}) GROUP BY model_name, group_a, group_b")

# versions present in a scope
_VERSIONS_COLUMNS = "t.model_name AS model_name, t.arrival_time AS arrival_time"
_VERSIONS = """
SELECT model_name, engine_version, min(arrival_time) AS first_seen, count() AS n
FROM {source}
GROUP BY model_name, engine_version
ORDER BY model_name, first_seen
"""

# change points
CREEP_METRICS = ("ttft", "itl", "e2e")
_STRATUM = "concat(model_name, '|', workload, '|', bucket)"

# one pass: each stratum's medians (per metric), its size and time span
_STRATUM_MEDIANS = f"""
SELECT {_STRATUM} AS stratum, count() AS n, min(arrival_time) AS lo, max(arrival_time) AS hi,
       {", ".join(f"medianIf({m}, isFinite({m})) AS med_{m}" for m in CREEP_METRICS)}
FROM {{source}}
WHERE finish_reason NOT IN ('abort', 'error')
GROUP BY stratum
"""

# one pass: per time bucket, each metric's median relative to its stratum's median over the placement
# half (the series PELT segments), and a sample of the confirmation half (what tests the shift)
_SERIES = f"""
SELECT toUInt32(intDiv(toUnixTimestamp64Micro(arrival_time) - {{t0:Int64}}, {{width:Int64}})) AS bucket_index,
       {", ".join(f"countIf(isFinite(rel_{m}) AND NOT confirm) AS n_{m}, "
                  f"medianIf(rel_{m}, isFinite(rel_{m}) AND NOT confirm) AS level_{m}" for m in CREEP_METRICS)},
       groupArraySampleIf(200, 1)(({", ".join(f"rel_{m}" for m in CREEP_METRICS)}), confirm) AS sample
FROM (
    SELECT arrival_time, indexOf({{keys:Array(String)}}, {_STRATUM}) AS i, cityHash64(request_id) % 2 = 1 AS confirm,
           {", ".join(f"{m} / arrayElement({{med_{m}:Array(Float64)}}, i) AS rel_{m}" for m in CREEP_METRICS)}
    FROM {{source}}
    WHERE finish_reason NOT IN ('abort', 'error') AND has({{keys:Array(String)}}, {_STRATUM})
)
GROUP BY bucket_index
ORDER BY bucket_index
"""

_CREEP_COLUMNS = (f"t.model_name AS model_name, t.workload AS workload, {PROMPT_BUCKET} AS bucket, "
                  f"t.finish_reason AS finish_reason, t.arrival_time AS arrival_time, "
                  f"t.request_id AS request_id, " + ", ".join(f"{METRICS[m][1]} AS {m}" for m in CREEP_METRICS))
_CREEP_SOURCE = f"(SELECT * FROM {{source}} WHERE workload NOT IN {ACTIVE_WORKLOADS_SQL})"
# served traffic with each request's replica, stratum and one metric's {value}
_ATTRIBUTION_COLUMNS = (f"t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
                        f"{PROMPT_BUCKET} AS bucket, t.finish_reason AS finish_reason, "
                        f"t.arrival_time AS arrival_time, {{value}} AS value")
_ATTRIBUTION_SOURCE = (f"(SELECT replica_id, {_STRATUM} AS stratum, arrival_time, value FROM {{source}} "
                       f"WHERE workload NOT IN {ACTIVE_WORKLOADS_SQL} AND finish_reason NOT IN ('abort', 'error'))")


def _request_sample_sql(prefix: str, scope: Scope) -> str:
    return _REQUEST_SAMPLES.replace("{source}", requests_in(_REQUEST_COLUMNS, prefix, scope))


def _step_sample_sql(prefix: str) -> str:
    """Per stratum: a sample of block medians (one per replica and BLOCK_SECONDS window), not of steps."""
    return _STEP_SAMPLES.replace("{prefix}", prefix).replace("{source}", steps_in(_STEP_COLUMNS, prefix))


def _samples(store, scope: Scope, table: str) -> dict[tuple, dict]:
    """(model, group_a, group_b) -> {"n": count, metric: np.ndarray} for one side."""
    sql = _request_sample_sql("s_", scope) if table == "requests" else _step_sample_sql("s_")
    names = [m for m, (t, _, _) in METRICS.items() if t == table]
    out = {}
    params = {**scope.parameters("s_"), "s_block_ms": BLOCK_SECONDS * 1000}
    for row in store.query_arrow(sql, params).to_pylist():
        values = np.array([list(v.values()) if isinstance(v, dict) else list(v) for v in row["sample"]],
                          dtype=np.float64).reshape(-1, len(names))
        entry = {"n": int(row["n"])}
        for i, m in enumerate(names):
            entry[m] = values[:, i]
        out[(row["model_name"], row["group_a"], row["group_b"])] = entry
    return out


def unit_of(metric: str) -> str:
    """What one sampled value (and n) of a metric is."""
    return "request" if METRICS[metric][0] == "requests" else f"{BLOCK_SECONDS}-second block median of one replica"


@dataclass
class StratumResult:
    metric: str
    model: str
    stratum: str
    n_baseline: int
    n_candidate: int
    comparison: Comparison
    samples: tuple = field(default=(), repr=False)  # (baseline, candidate) values tested
    p_adjusted: float = 1.0
    verdict: str = "no change"  # "regression" | "improvement" | "no change"

    def row(self) -> dict:
        c = self.comparison
        return {"metric": self.metric, "model": self.model, "stratum": self.stratum, "unit": unit_of(self.metric),
                "n_baseline": self.n_baseline, "n_candidate": self.n_candidate,
                "median_baseline": c.median_baseline, "median_candidate": c.median_candidate,
                "ratio": c.ratio, "ratio_ci": c.ratio_ci, "cliffs_delta": round(c.cliffs_delta, 4),
                "mwu_p": c.mwu_p, "ks_p": c.ks_p, "p_adjusted": self.p_adjusted, "verdict": self.verdict}


@dataclass
class RegressionResult:
    """What the dashboard's Compare page shows: a headline, a table, the evidence."""

    baseline: Scope
    candidate: Scope
    strata: list[StratumResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # strata too small on either side

    @property
    def regressed(self) -> bool:
        return any(f.severity != "info" for f in self.findings)

    @property
    def summary(self) -> str:
        bad = [f for f in self.findings if f.severity != "info"]
        if bad:
            return "; ".join(f.summary for f in bad)
        if not self.strata:
            return (f"insufficient data: no stratum has {MIN_SAMPLES}+ samples on both sides "
                    f"({self.candidate.label()} vs {self.baseline.label()})")
        better = [f for f in self.findings if f.kind == "improvement"]
        if better:
            return "no regression; " + "; ".join(f.summary for f in better)
        return (f"no significant regression of {self.candidate.label()} against {self.baseline.label()} "
                f"({len(self.strata)} stratum comparisons)")

    @property
    def table(self) -> list[dict]:
        return [s.row() for s in self.strata]

    @property
    def evidence(self) -> dict:
        return {"baseline": self.baseline.describe(), "candidate": self.candidate.describe(),
                "alpha": ALPHA, "min_ratio": MIN_RATIO, "strata": self.table, "skipped": self.skipped}


def _severity(c: Comparison, higher_is_worse: bool) -> str:
    ratio = c.ratio if c.ratio is not None else np.inf
    worse = ratio if higher_is_worse else (1 / ratio if ratio > 0 else np.inf)
    return "critical" if worse >= 1.5 and abs(c.cliffs_delta) >= DELTA_LARGE else "warning"


def _direction(c: Comparison, higher_is_worse: bool) -> str | None:
    """"regression" / "improvement" when the effect is clear in both size and direction."""
    if abs(c.cliffs_delta) < DELTA_SMALL:
        return None
    up = c.cliffs_delta > 0
    if c.ratio is not None:  # the medians must move too, by at least MIN_RATIO
        if up and c.ratio < MIN_RATIO or (not up) and c.ratio > 1 / MIN_RATIO:
            return None
    elif c.difference == 0:
        return None
    return "regression" if up == higher_is_worse else "improvement"


def compare(store, baseline_scope: Scope, candidate_scope: Scope, *, metrics=tuple(METRICS),
            seed: int = 0) -> list[Finding]:
    """Findings for every metric on which the candidate differs from the baseline (see `analyse`); a regression
    cites what the candidate's records show against the baseline's (diagnostics.mechanisms) or that none is."""
    findings = analyse(store, baseline_scope, candidate_scope, metrics=metrics, seed=seed).findings
    if any(f.kind == "regression" for f in findings):
        found = mechanisms.between(store, candidate_scope, baseline_scope, "on the baseline")
        findings = [mechanisms.said(f, found) if f.kind == "regression" else f for f in findings]
    return findings


def analyse(store, baseline_scope: Scope, candidate_scope: Scope, *, metrics=tuple(METRICS),
            seed: int = 0) -> RegressionResult:
    result = RegressionResult(baseline_scope, candidate_scope)
    tables = {METRICS[m][0] for m in metrics}
    pending: list[StratumResult] = []
    for table in sorted(tables):
        base = _samples(store, baseline_scope, table)
        cand = _samples(store, candidate_scope, table)
        for key in sorted(set(base) | set(cand)):
            model, a, b = key
            stratum = f"{a or '-'} / {b}"
            for metric in metrics:
                if METRICS[metric][0] != table:
                    continue
                if key not in base or key not in cand:
                    continue
                c = compare_samples(base[key][metric], cand[key][metric], bootstrap=False)
                if c is None:
                    result.skipped.append({"metric": metric, "model": model, "stratum": stratum,
                                           "n_baseline": base[key]["n"], "n_candidate": cand[key]["n"]})
                    continue
                pending.append(StratumResult(metric, model, stratum, base[key]["n"], cand[key]["n"], c,
                                             (base[key][metric], cand[key][metric])))
    for s, p in zip(pending, holm([s.comparison.p_value for s in pending])):
        s.p_adjusted = p
        direction = _direction(s.comparison, METRICS[s.metric][2]) if p < ALPHA else None
        if direction:
            s.verdict = direction
    result.strata = pending
    result.findings = _findings(result, metrics, seed)
    return result


def _fmt(metric: str, value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    return f"{value:.0f} tok/s" if metric == "step_throughput" else f"{value * 1000:.1f} ms"


def _findings(result: RegressionResult, metrics, seed: int) -> list[Finding]:
    base, cand = result.baseline, result.candidate
    versus = f"{cand.label()} vs {base.label()}"
    findings = []
    for metric in metrics:
        rows = [s for s in result.strata if s.metric == metric]
        subject = f"{metric}: {versus}"
        if not rows:
            findings.append(insufficient("regression", subject, DIAGNOSTIC, cand,
                                         f"no stratum of {LABELS[metric]} has {MIN_SAMPLES}+ samples "
                                         f"on both sides", skipped=[k for k in result.skipped if k["metric"] == metric],
                                         baseline=base.describe()))
            continue
        for verdict in ("regression", "improvement"):
            hit = [s for s in rows if s.verdict == verdict]
            if not hit:
                continue
            worst = max(hit, key=lambda s: abs(s.comparison.cliffs_delta))
            # the bootstrap only where it is reported: the interval of the headline stratum's effect
            worst.comparison = compare_samples(*worst.samples, bootstrap=True, seed=seed)
            c = worst.comparison
            ratio = f"{c.ratio:.2f}x" if c.ratio is not None else f"{c.difference * 1000:+.1f} ms"
            ci = f" (95% CI {c.ratio_ci[0]:.2f}-{c.ratio_ci[1]:.2f})" if c.ratio_ci else ""
            summary = (f"{LABELS[metric]} {verdict}: {cand.label()} vs {base.label()} median "
                       f"{_fmt(metric, c.median_baseline)} -> {_fmt(metric, c.median_candidate)} = {ratio}{ci} "
                       f"in {worst.stratum}" + (f" of {worst.model}" if worst.model else "")
                       + f" ({len(hit)}/{len(rows)} strata; unit: {unit_of(metric)}; Holm p={worst.p_adjusted:.1e}; "
                         f"MWU p={c.mwu_p:.1e}, KS p={c.ks_p:.1e}, "
                         f"Cliff's delta {c.cliffs_delta:+.2f})")
            severity = _severity(c, METRICS[metric][2]) if verdict == "regression" else "info"
            kind = "regression" if verdict == "regression" else "improvement"
            evidence = {"metric": metric, "metric_label": LABELS[metric], "verdict": verdict,
                        "baseline": base.describe(), "candidate": cand.describe(),
                        "worst_stratum": worst.row(), "strata": [s.row() for s in rows],
                        "unit": unit_of(metric),
                        "tests": "Mann-Whitney U + Kolmogorov-Smirnov per stratum, Holm-adjusted over all strata "
                                 "and metrics; effect: Cliff's delta, ratio of medians (bootstrap 95% CI)",
                        "controlled_for": "workload and prompt-length bucket" if METRICS[metric][0] == "requests"
                        else "step phase and batch-size bucket; autocorrelation (time blocks as the unit)",
                        "alpha": ALPHA, "min_ratio": MIN_RATIO}
            findings.append(Finding(kind, severity, subject, summary, DIAGNOSTIC, cand, evidence))
    return findings


def compare_groups(store, *, baseline_replicas: list[str], candidate_replicas: list[str], start: float | None,
                   end: float | None) -> RegressionResult:
    """The dashboard's Compare page: two sets of replicas over one window (read only)."""
    window = Scope(start=start, end=end)
    return analyse(store, window.narrowed(replicas=tuple(baseline_replicas), name="A"),
                   window.narrowed(replicas=tuple(candidate_replicas), name="B"))


# -- versions present in a scope ------------------------------------------------------------------


def _version_order(version: str) -> tuple:
    """PEP 440 versions in version order, then anything else in text order."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def engine_of(version: str) -> str:
    """The engine a version string belongs to: "vllm" for "vllm-0.32.0", infersight's own for a bare version."""
    name, sep, rest = version.partition("-")
    return name if sep and name.isalpha() and rest[:1].isdigit() else "infersight"


def version_pairs(store, scope: Scope) -> list[tuple[Scope, Scope]]:
    """(previous, next) version scopes of each model and engine, in order of first appearance (then version
    order); two engines serving one model are not two versions of each other."""
    sql = _VERSIONS.replace("{source}", requests_in(_VERSIONS_COLUMNS))
    by_model: dict[tuple, list] = {}
    for r in store.query_arrow(sql, scope.parameters()).to_pylist():
        if r["engine_version"]:  # versions are ordered within one engine: vllm-0.32.0 does not follow 0.1.0
            by_model.setdefault((r["model_name"], engine_of(r["engine_version"])), []).append(r)
    pairs = []
    for (model, _), rows in by_model.items():
        rows.sort(key=lambda r: (r["first_seen"], _version_order(r["engine_version"])))
        versions = [r["engine_version"] for r in rows]
        for old, new in zip(versions, versions[1:]):
            base = scope.narrowed(models=(model,), versions=(old,), name=f"version={old}")
            cand = scope.narrowed(models=(model,), versions=(new,), name=f"version={new}")
            pairs.append((base, cand))
    return pairs


# -- change points ----------------------------------------------------------------------------------


def _creep_source(scope: Scope) -> str:
    """Served traffic only: probes and rescores (telemetry.contract.probes.ACTIVE_WORKLOADS) come in rounds, alone
    or in a burst of fillers on purpose, so their latency level follows the prober, not the engine."""
    return _CREEP_SOURCE.replace("{source}", requests_in(_CREEP_COLUMNS, scope=scope))


def _attribution_source(scope: Scope, metric: str) -> str:
    """Served traffic with each request's replica, stratum and `metric` (change_attribution's source)."""
    columns = _ATTRIBUTION_COLUMNS.replace("{value}", METRICS[metric][1])
    return _ATTRIBUTION_SOURCE.replace("{source}", requests_in(columns, scope=scope))


def _positive(x) -> float:
    return float(x) if x is not None and np.isfinite(x) and x > 0 else float("nan")


def creep(store, scope: Scope, metrics=CREEP_METRICS, buckets: int = 120, min_per_bucket: int = 5,
          min_shift: float = 1.2) -> list[Finding]:
    """Level shifts up over time in each metric (relative to its stratum's median), placed on one half of
    the requests and confirmed on the other: on the fleet's requests pooled, then, for a metric where the
    pool shows none, on each replica's own (Bonferroni over the replicas): one replica's step among peers
    that did not step makes the pool's bucket medians bimodal, and no step of the pool. Each step found is
    attributed (diagnostics.change_attribution)."""
    found = _creep(store, scope, metrics, buckets, min_per_bucket, min_shift, ALPHA, scope)
    stepped = {f.evidence.get("metric") for f in found if f.severity != "info"}
    ids = change_attribution.served_replicas(store, _attribution_source(scope, metrics[0]), scope.parameters())
    rest = tuple(m for m in metrics if m not in stepped)
    if len(ids) > 1 and rest:
        for rid in ids:
            found += [f for f in _creep(store, scope.narrowed(replicas=(rid,)), rest, buckets, min_per_bucket,
                                        min_shift, ALPHA / len(ids), scope) if f.severity != "info"]
    return found


def _creep(store, scope: Scope, metrics, buckets: int, min_per_bucket: int, min_shift: float, alpha: float,
           fleet: Scope) -> list[Finding]:
    """`creep` on `scope`'s requests, each step attributed among `fleet`'s replicas."""
    source = _creep_source(scope)
    strata = [r for r in store.query_arrow(_STRATUM_MEDIANS.replace("{source}", source),
                                           scope.parameters()).to_pylist() if r["n"] >= min_per_bucket]
    total = sum(r["n"] for r in strata)
    if total < 2 * buckets * min_per_bucket // 4:
        return [insufficient("latency_change_point", f"{metric}: {scope.label()}", DIAGNOSTIC, scope,
                             f"{total} requests: too few for a change-point series", requests=total)
                for metric in metrics]
    lo = min(r["lo"] for r in strata).timestamp()
    hi = max(r["hi"] for r in strata).timestamp()
    width_us = max(1, int((hi - lo) * 1e6 / buckets) + 1)
    params = {**scope.parameters(), "t0": int(lo * 1e6), "width": width_us, "keys": [r["stratum"] for r in strata],
              **{f"med_{m}": [_positive(r[f"med_{m}"]) for r in strata] for m in CREEP_METRICS}}
    rows = store.query_arrow(_SERIES.replace("{source}", source), params).to_pylist()
    findings = []
    for metric in metrics:
        k = CREEP_METRICS.index(metric)
        series = []
        for r in rows:
            sample = np.array([list(t.values())[k] if isinstance(t, dict) else t[k] for t in r["sample"]], float)
            series.append({"bucket_index": r["bucket_index"], "n": r[f"n_{metric}"], "level": r[f"level_{metric}"],
                           "sample": sample[np.isfinite(sample)]})
        series = [s for s in series if s["n"] >= min_per_bucket and s["level"] and s["level"] > 0]
        subject = f"{metric}: {scope.label()}"
        if len(series) < 12:
            findings.append(insufficient("latency_change_point", subject, DIAGNOSTIC, scope,
                                         f"{len(series)} time buckets with {min_per_bucket}+ placement-half requests "
                                         f"(need 12)",
                                         buckets=len(series)))
            continue
        finding = _shift_finding(metric, scope, series, lo, width_us, min_shift, alpha)
        if finding:
            at = finding.evidence["change_at"]
            change_attribution.attribute(store, fleet, finding, _attribution_source(fleet, metric),
                                         fleet.parameters(), min_shift)
            whose = finding.evidence["attribution"].get("replica")
            side = scope.narrowed(replicas=(whose,)) if whose else scope  # its own records explain it
            findings.append(mechanisms.said(finding, mechanisms.between(
                store, side.narrowed(start=at), side.narrowed(end=at), "before the change")))
    return findings


def _shift_finding(metric: str, scope: Scope, series: list[dict], t0: float, width_us: int,
                   min_shift: float, alpha: float = ALPHA) -> Finding | None:
    levels = np.log([s["level"] for s in series])  # placement half
    cps = change_points(levels)  # each then tested on the confirmation half's samples
    bounds = [0, *cps, len(series)]
    segments = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    confirmed = []  # (point ratio, bounds, before, after) of the steps the hold-out confirms
    for (a0, a1), (b0, b1) in zip(segments, segments[1:]):
        before = np.concatenate([s["sample"] for s in series[a0:a1]])
        after = np.concatenate([s["sample"] for s in series[b0:b1]])
        c = compare_samples(before, after, bootstrap=False)
        if c is None or c.ratio is None or c.ratio < min_shift or c.p_value * max(1, len(cps)) >= alpha:
            continue
        confirmed.append((c.ratio, (a0, a1, b0, b1), before, after))
    # the largest confirmed step whose interval, not only its point, clears the bar, as in every latency rule
    # here (a host's noise on a shared 2-core machine stepped whole fleets 1.2-1.36x with intervals down to
    # 1.02); bootstrapped largest first, so only until one clears (a stable sort: ties keep segment order)
    best = None
    for _, bounds, before, after in sorted(confirmed, key=lambda x: x[0], reverse=True):
        c = compare_samples(before, after, bootstrap=True)
        if c.ratio_ci is not None and c.ratio_ci[0] >= min_shift:
            best = (bounds, c)
            break
    if best is None:
        return None
    (a0, a1, b0, b1), c = best
    at = t0 + series[b0]["bucket_index"] * width_us / 1e6
    when = datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")
    ci = f" (95% CI {c.ratio_ci[0]:.2f}-{c.ratio_ci[1]:.2f})"
    severity = "critical" if c.ratio >= 2 else "warning"
    summary = (f"{LABELS[metric]} stepped up {c.ratio:.2f}x{ci} at {when} (relative to each workload/prompt-length "
               f"stratum's median; MWU p={c.mwu_p:.1e}, KS p={c.ks_p:.1e})")
    evidence = {"metric": metric, "change_at": at, "change_at_iso": when,
                "before_from": t0 + series[a0]["bucket_index"] * width_us / 1e6,
                "after_to": t0 + (series[b1 - 1]["bucket_index"] + 1) * width_us / 1e6,
                "bucket_seconds": width_us / 1e6, "change_points": len(bounds) - 2,
                "levels": [{"t": t0 + s["bucket_index"] * width_us / 1e6, "relative_median": s["level"], "n": s["n"]}
                           for s in series],
                "comparison": c.to_dict(),
                "method": "ruptures PELT (l2 cost, KernelCPD linear) on log bucket medians of latency relative to "
                          "its stratum median over the placement half of requests (cityHash64(request_id) % 2 = 0); "
                          "confirmed by MWU + KS on the other half only (Bonferroni over the change points), its ratio "
                          f"of medians' 95% bootstrap interval at or above {min_shift:g}x",
                "confirmation": "hold-out half: requests with cityHash64(request_id) % 2 = 1"}
    return Finding("latency_change_point", severity, f"{metric}: {scope.label()}", summary, DIAGNOSTIC, scope,
                   evidence)


def run(store, request: DiagnosticRequest) -> list[Finding]:
    """`infersight diagnose regression`: the given comparison, else version to version; plus change points."""
    scope, baseline, candidate = request.scope, request.baseline, request.candidate
    findings = []
    if baseline is not None and candidate is not None:
        findings += compare(store, baseline, candidate)
    else:
        for base, cand in version_pairs(store, scope):
            findings += compare(store, base, cand)
    findings += creep(store, candidate if candidate is not None else scope)
    return findings
