"""Step model: which replica takes more time for the same work ("same batch shape, more time").

A replica pinned to one CPU beside a busy loop, a noisy neighbour, NUMA misplacement or a slower
build makes every scheduler step slower at the same batch shape; a replica that merely got bigger
batches or longer contexts has slower steps too, and is not at fault. So steps are compared through
a model of their cost, never raw:

1. Per model, step time is linear in the batch shape: one intercept per phase (prefill / decode /
   mixed), prefill tokens, decode tokens, sequences and context tokens (what attention reads).
   Three targets are modelled: the whole step (duration), the forward pass, and host time
   (duration - forward). Idle steps and steps with no tokens are left out.
   A fourth, the gap: the time between the end of a step that left sequences running and the start of
   the next (the loop posting outputs, the HTTP thread holding the GIL, the OS running someone else).
   A replica starved of its CPU by a busy neighbour runs its steps as fast as its peers (pinned, it
   keeps its cache) but waits longer between them (measured: median gap 2.19 vs 0.96 ms, step 3.10 vs
   3.76 ms), so the step targets cannot see it. The gap is modelled on the shape of the step it precedes
   (the requests that arrived in it are that step's prefill; the outputs it streamed, its decode), over
   the steps that follow a running step only (a wait for work is not a gap), with its own fit. Its bar
   is derived, not shared: a gap excess is worth a finding when it adds MIN_RATIO's share to the wall
   time of the same work, so the bar on the gap ratio is 1 + (MIN_RATIO - 1) * (gap + step) / gap at the
   peers' predicted times (gaps that are 20% of the busy time need 1.5x; an engine whose iterations
   leave no gap never fires).
2. ClickHouse aggregates the sufficient statistics of that least-squares fit (X'X, X'y, the sums of
   x and y) per (replica, time block, phase); Python sees those sums, never a step.
3. Leave-one-out: each replica's expected time is predicted by the fit on its PEERS' steps only,
   so a slow replica does not pull the model towards itself (with two replicas, the other one).
   The effect is a ratio of sums: observed seconds / predicted seconds over the replica's steps.
4. Uncertainty: a cluster bootstrap over time blocks (steps within a block share load and
   neighbours, so the block, not the step, is the unit). The block length adapts to the data: about
   TARGET_BLOCKS blocks over the window, each with MIN_STEPS_PER_BLOCK steps of a replica on
   average, between MIN_BLOCK_SECONDS and BLOCK_SECONDS (a 60 s canary gets 3 s blocks, a day 10 s
   ones, widened to at most MAX_BLOCKS). Short blocks are honest only while they are long relative
   to the noise's autocorrelation: while adjacent blocks' residuals (observed / the pooled fit's
   prediction, each replica centred on its own level) have a significantly positive lag-1
   correlation (z > AUTOCORR_Z), blocks are merged in pairs; too few blocks left is "insufficient
   data". What correlation is left (too few blocks to call it significant) widens the bootstrap's
   spread by sqrt((1 + rho) / (1 - rho)), the AR(1) variance of a mean. Blocks are resampled jointly
   across replicas and the peers' model is refitted in every resample, so its uncertainty counts.
   Interval: bootstrap percentiles. Test: one-sided, H0 "ratio <= the target's bar", a normal
   approximation on the bootstrap standard error of log(ratio); Holm over replicas x targets of
   the model.
5. A replica is slow when a target's interval lies above its bar (MIN_RATIO; the gap's derived one, 1.) and its Holm-adjusted p is
   below ALPHA. The finding names the replica, the targets, the effect with its interval, and how
   its identity and placement differ from its peers' (CPU count, CPUs shared, NUMA, version, config), and
   the mechanism its records show in the window against its peers' (diagnostics.mechanisms: a smaller CPU
   quota, host time, KV pressure ...) or that none is recorded.
   Too few blocks or steps is an explicit "insufficient data" finding.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from diagnostics import mechanisms
from diagnostics.findings import Finding, insufficient
from diagnostics.replicas import (
    IDENTITY,
    _explain,  # the same wording as the latency outlier's
    identity_differences,
)
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, steps_in
from evals.stats import (
    CONFIDENCE,
    RESAMPLES,
    autocorrelation_inflation,
    block_counts,
    holm,
    widened_interval,
)
from telemetry.contract.derived import replica_filter_sql, window_sql

DIAGNOSTIC = "steps"
KIND = "slow_steps"
BLOCK_SECONDS = 10.0  # the longest adaptive block; a long window widens it so that it has at most MAX_BLOCKS
MIN_BLOCK_SECONDS = 1.0
TARGET_BLOCKS = 20  # over the window's span: twice MIN_BLOCKS, so half the window busy is enough
MIN_STEPS_PER_BLOCK = 20  # a replica's steps per block, on average
AUTOCORR_Z = 2.0  # adjacent blocks' residuals correlated beyond this z: blocks too short, merged in pairs
MIN_CELL_STEPS = 5  # a (block, replica) cell with fewer steps gives no residual to the autocorrelation
MAX_BLOCKS = 2000
MIN_BLOCKS = 10  # time blocks with steps, per replica
MIN_STEPS = 100  # per replica
MIN_RATIO = 1.10  # the smallest slowdown worth a finding
CRITICAL_RATIO = 1.5  # interval's lower bound at or above this: critical
ALPHA = 0.01
# the batch shape: phase intercepts, then the work
FEATURES = ("prefill", "decode", "mixed", "prefill_tokens", "decode_tokens", "seqs", "context_tokens")
TARGETS = ("step", "forward", "host")
GAP_TARGETS = ("gap", "gap_step")  # the gap model: the gap, and the duration of the step it precedes (for its bar)
MAX_GAP_SECONDS = 2.0  # a longer wait with sequences running is a stall or a restart, not the per-step overhead
LABELS = {"step": "step", "forward": "forward", "host": "host", "gap": "between-step (sequences running)"}
RIDGE = 1e-8  # on the scaled normal equations: collinear columns (decode tokens = sequences) stay solvable

PHASES = FEATURES[:3]  # idle steps (and any other phase) are no batch shape: left out
_K, _T, _P = len(FEATURES), len(TARGETS), len(PHASES)
_G = len(GAP_TARGETS)
_C = _K - _P  # the continuous features
_PAIRS = [(i, j) for i in range(_K) for j in range(i, _K)]
_CPAIRS = [(i, j) for i in range(_C) for j in range(i, _C)]


def _summed(targets: int, prefix: str = "") -> list[tuple[str, str]]:
    """(column, expression summed) of the sufficient statistics over `targets` targets ({prefix}y0..), in the
    order _expand reads them after the count: the one owner of their names."""
    p = prefix
    return ([(f"{p}sc{i}", f"c{i}") for i in range(_C)] + [(f"{p}sy{t}", f"{p}y{t}") for t in range(targets)]
            + [(f"{p}cc{i}_{j}", f"c{i} * c{j}") for i, j in _CPAIRS]
            + [(f"{p}cy{i}_{t}", f"c{i} * {p}y{t}") for i in range(_C) for t in range(targets)])


def _sums_sql(targets: int, prefix: str = "") -> list[str]:
    """The sums of _summed; with a prefix, over the rows where that prefix's condition holds."""
    return [f"sumIf({e}, {prefix}) AS {c}" if prefix else f"sum({e}) AS {c}" for c, e in _summed(targets, prefix)]


# -- SQL ----------------------------------------------------------------------------------------------

_STEP_COLUMNS = ("t.replica_id AS replica_id, t.start_time AS start_time, t.phase AS phase, "
                 "t.num_tokens AS num_tokens, t.num_prefill_tokens AS prefill_tokens, "
                 "t.num_decode_tokens AS decode_tokens, t.num_seqs AS seqs, t.num_context_tokens AS context_tokens, "
                 "t.duration_seconds AS duration, t.forward_seconds AS forward_s, t.num_running AS num_running, "
                 "t.step_id AS step_id")
# the scope's steps without the identity join; each replica's model then comes from its latest start
_STEPS_WITHOUT_IDENTITY = (f"(SELECT {_STEP_COLUMNS}, '' AS model_name FROM steps AS t "
                           f"WHERE {window_sql('t.start_time')} AND {replica_filter_sql('t.replica_id')})")

# per phase, so the phase intercepts' products need no columns of their own (see _expand); the gap
# model's sums (prefix g) over the steps that follow a running step, in the same pass (step_id breaks
# ties of start_time in the engine's order)
_AGGREGATED_COLUMNS = ("prefill_tokens", "decode_tokens", "seqs", "context_tokens")
_AGGREGATED_TARGETS = ("duration", "forward_s", "greatest(duration - forward_s, 0)")
_AGGREGATED_INNER = ", ".join([f"toFloat64({c}) AS c{i}" for i, c in enumerate(_AGGREGATED_COLUMNS)]
                              + [f"{y} AS y{t}" for t, y in enumerate(_AGGREGATED_TARGETS)]
                              + ["greatest(toFloat64(start_time) - previous_end, 0) AS gy0", "duration AS gy1",
                                 f"previous_running > 0 AND toFloat64(start_time) - previous_end < {MAX_GAP_SECONDS} "
                                 f"AS g"])
_AGGREGATE = f"""
SELECT model_name, replica_id, intDiv(toUnixTimestamp64Micro(start_time), {{block_us:UInt64}}) AS block,
       indexOf({{phases:Array(String)}}, phase) - 1 AS phase_index, count() AS n, {', '.join(_sums_sql(_T))},
       countIf(g) AS gn, {', '.join(_sums_sql(_G, "g"))}
FROM (SELECT model_name, replica_id, start_time, phase, {_AGGREGATED_INNER}
      FROM (SELECT *, lagInFrame(toFloat64(start_time) + duration, 1, 0.) OVER w AS previous_end,
                   lagInFrame(num_running, 1, 0) OVER w AS previous_running
            FROM {{source}}
            WINDOW w AS (PARTITION BY replica_id ORDER BY start_time, step_id
                         ROWS BETWEEN 1 PRECEDING AND CURRENT ROW))
      WHERE has({{phases:Array(String)}}, phase) AND num_tokens > 0)
GROUP BY model_name, replica_id, block, phase
"""

_SPAN_SQL = """
SELECT toFloat64(min(start_time)) AS first, toFloat64(max(start_time)) AS last, count() AS n,
       uniqExact(replica_id) AS replicas
FROM steps WHERE {window} AND {replicas} AND num_tokens > 0
"""


def _source(scope: Scope) -> str:
    """The scope's steps. A scope that filters on no identity (version, config, model) skips the
    identity join (a pass over the rows): each replica's model then comes from its latest start."""
    if scope.versions or scope.config_hashes or scope.models:
        return steps_in(_STEP_COLUMNS)
    return _STEPS_WITHOUT_IDENTITY


def _aggregate_sql(source: str) -> str:
    return _AGGREGATE.replace("{source}", source)


# -- the statistics: per (replica, block) sums -> leave-one-out fits -> ratios ---------------------

# what ClickHouse returns per (replica, block, phase): n, sums of the continuous features and the targets,
# their products
def _part_columns(targets: int, prefix: str = "") -> list[str]:
    return [f"{prefix}n"] + [c for c, _ in _summed(targets, prefix)]


_PART_COLUMNS = _part_columns(_T)
_GAP_PART_COLUMNS = _part_columns(_G, "g")


def _expand(phase: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Per-phase partial sums (N, len(_part_columns(T))) -> full stats vectors (N, D): n, sum x (K), sum y (T),
    X'X upper triangle, X'y (K x T), with x = (one-hot phase, continuous features)."""
    t_ = (part.shape[1] - 1 - _C - len(_CPAIRS)) // (1 + _C)
    n, sc, sy = part[:, 0], part[:, 1:1 + _C], part[:, 1 + _C:1 + _C + t_]
    o = 1 + _C + t_
    cc = np.zeros((len(part), _C, _C))
    for c, (i, j) in enumerate(_CPAIRS):
        cc[:, i, j] = cc[:, j, i] = part[:, o + c]
    cy = part[:, o + len(_CPAIRS):].reshape(-1, _C, t_)
    e = np.eye(_P)[phase]  # (N, P)
    xtx = np.zeros((len(part), _K, _K))
    xtx[:, :_P, :_P] = e[:, :, None] * e[:, None, :] * n[:, None, None]
    xtx[:, :_P, _P:] = e[:, :, None] * sc[:, None, :]
    xtx[:, _P:, :_P] = np.swapaxes(xtx[:, :_P, _P:], 1, 2)
    xtx[:, _P:, _P:] = cc
    xty = np.concatenate([e[:, :, None] * sy[:, None, :], cy], axis=1)
    sx = np.concatenate([e * n[:, None], sc], axis=1)
    upper = np.stack([xtx[:, i, j] for i, j in _PAIRS], axis=1)
    return np.concatenate([n[:, None], sx, sy, upper, xty.reshape(len(part), -1)], axis=1)


def _targets_of(s: np.ndarray) -> int:
    """How many targets a stats vector (..., D) carries: D = 1 + K + T + len(_PAIRS) + K * T."""
    return (s.shape[-1] - 1 - _K - len(_PAIRS)) // (1 + _K)


def _unpack(s: np.ndarray):
    """Stacked stats vectors (..., D) -> n, sum x (..., K), sum y (..., T), X'X (..., K, K), X'y (..., K, T)."""
    t_ = _targets_of(s)
    n = s[..., 0]
    sx = s[..., 1:1 + _K]
    sy = s[..., 1 + _K:1 + _K + t_]
    o = 1 + _K + t_
    tri = s[..., o:o + len(_PAIRS)]
    xtx = np.zeros(s.shape[:-1] + (_K, _K))
    for c, (i, j) in enumerate(_PAIRS):
        xtx[..., i, j] = xtx[..., j, i] = tri[..., c]
    xty = s[..., o + len(_PAIRS):].reshape(s.shape[:-1] + (_K, t_))
    return n, sx, sy, xtx, xty


def _fit(xtx: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """Least squares from normal equations (..., K, K), (..., K, T) -> coefficients (..., K, T).
    Columns are scaled to unit diagonal (absent ones, e.g. no mixed steps, get coefficient 0) and a
    tiny ridge keeps exactly collinear columns solvable; predictions in the data's span are exact."""
    d = np.sqrt(np.clip(np.diagonal(xtx, axis1=-2, axis2=-1), 0, None))
    scale = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    a = xtx * scale[..., :, None] * scale[..., None, :] + RIDGE * np.eye(_K)
    b = np.linalg.solve(a, xty * scale[..., :, None])
    return b * scale[..., :, None]


def _ratios(per_replica: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """per_replica (..., R, D) summed stats -> observed, predicted seconds and their ratio (..., R, T),
    each replica predicted by the fit on all the others (leave-one-out)."""
    peers = per_replica.sum(axis=-2, keepdims=True) - per_replica
    _, _, _, xtx, xty = _unpack(peers)
    beta = _fit(xtx, xty)
    _, sx, sy, _, _ = _unpack(per_replica)
    predicted = np.einsum("...k,...kt->...t", sx, beta)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(predicted > 0, sy / np.where(predicted > 0, predicted, 1.0), np.nan)
    return sy, predicted, ratio


def block_bootstrap(blocks: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """blocks (B, R, D) per time block and replica -> ratios (resamples, R, T): time blocks drawn with
    replacement, the same draw for every replica, the peers' model refitted in each."""
    b = blocks.shape[0]
    counts = block_counts(b, np.random.default_rng(seed), resamples)
    sums = (counts @ blocks.reshape(b, -1)).reshape((resamples,) + blocks.shape[1:])
    return _ratios(sums)[2]


def _blocks(block: np.ndarray, replica: np.ndarray, sums: np.ndarray, merge: int) -> np.ndarray:
    """(B, R, D) array: the sums of each replica (index) in each time block, `merge` blocks made one."""
    keys, index = np.unique(block // merge, return_inverse=True)
    n_replicas = int(replica.max()) + 1
    cell = index * n_replicas + replica
    size = len(keys) * n_replicas
    out = np.column_stack([np.bincount(cell, weights=sums[:, d], minlength=size) for d in range(sums.shape[1])])
    return out.reshape(len(keys), n_replicas, sums.shape[1])


def _without_feature(blocks: np.ndarray, k: int) -> np.ndarray:
    """The stats with feature k zeroed (its sums and products): the fit then leaves it out."""
    out = blocks.copy()
    t_ = _targets_of(blocks)
    out[..., 1 + k] = 0.0
    o = 1 + _K + t_
    for c, (i, j) in enumerate(_PAIRS):
        if k in (i, j):
            out[..., o + c] = 0.0
    out[..., o + len(_PAIRS) + k * t_:o + len(_PAIRS) + (k + 1) * t_] = 0.0
    return out


# -- the diagnostic --------------------------------------------------------------------------------

def block_length(store, scope: Scope) -> float:
    """Seconds per time block for the scope's steps (module doc, 4): about TARGET_BLOCKS over its span,
    MIN_STEPS_PER_BLOCK steps of a replica each, within [MIN_BLOCK_SECONDS, BLOCK_SECONDS]. Sized
    from every replica's busy steps in the window (a cheap pass; the model filter does not matter here)."""
    sql = _SPAN_SQL.replace("{window}", window_sql("start_time")).replace("{replicas}", replica_filter_sql())
    row = store.query_arrow(sql, scope.parameters()).to_pylist()[0]
    if not row["n"]:
        return BLOCK_SECONDS
    span = max(row["last"] - row["first"], 0.0)
    per_replica = row["n"] / max(row["replicas"], 1)
    wanted = max(span / TARGET_BLOCKS, MIN_STEPS_PER_BLOCK * span / per_replica)
    return float(min(BLOCK_SECONDS, max(MIN_BLOCK_SECONDS, wanted)))


def run(store, request: DiagnosticRequest, *, block_seconds: float | None = None,
        report: list | None = None) -> list[Finding]:
    """`block_seconds`: a fixed block length (no adaptation, no merging for autocorrelation); `report`:
    a list that gets every (replica, target) test, slow or not (what the rule measured)."""
    scope = request.scope
    fixed = block_seconds is not None
    block_seconds = block_seconds if fixed else block_length(store, scope)
    params = {**scope.parameters(), "block_us": int(block_seconds * 1e6), "phases": list(PHASES)}
    table = store.query_arrow(_aggregate_sql(_source(scope)), params)
    if table.num_rows == 0:
        return []
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    replica_ids = np.asarray(table.column("replica_id").to_pylist(), dtype=object)
    models = np.asarray(table.column("model_name").to_pylist(), dtype=object)
    unknown = models == ""  # read without the identity join: the replica's latest start names its model
    ids, inverse = np.unique(replica_ids[unknown], return_inverse=True)
    models[unknown] = np.asarray([identity.get(r, {}).get("model_name", "") for r in ids], dtype=object)[inverse]
    block = table.column("block").to_numpy().astype(np.int64)
    phase = table.column("phase_index").to_numpy().astype(np.int64)
    sums = _expand(phase, np.column_stack([table.column(c).to_numpy().astype(float) for c in _PART_COLUMNS]))
    gap_sums = _expand(phase, np.column_stack([table.column(c).to_numpy().astype(float) for c in _GAP_PART_COLUMNS]))
    # a step means something else in another engine (vLLM's iteration vs infersight's step): replicas
    # are compared with peers of their model on the same engine; builds of one engine are compared
    families = np.asarray([engine_family(identity.get(r, {}).get("engine_version", "")) for r in replica_ids],
                          dtype=object)
    findings: list[Finding] = []
    for model, family in sorted(set(zip(models, families))):
        rows = (models == model) & (families == family)
        replicas, replica = np.unique(replica_ids[rows], return_inverse=True)
        findings += _model_findings(model, list(replicas), block[rows], replica, sums[rows], gap_sums[rows],
                                    identity, scope, block_seconds, adapt=not fixed, report=report)
    return [mechanisms.cite(store, scope, f, identity) if f.kind == KIND else f for f in findings]


def engine_family(engine_version: str) -> str:
    """The engine a version string names: "vllm-0.32.0" -> "vllm"; infersight's own ("0.1.0") -> "infersight"."""
    name = engine_version.split("-", 1)[0]
    return name if name[:1].isalpha() else "infersight"


def _model_findings(model: str, replicas: list[str], block: np.ndarray, replica: np.ndarray, sums: np.ndarray,
                    gap_sums: np.ndarray, identity: dict, scope: Scope, block_seconds: float, adapt: bool = True,
                    report: list | None = None) -> list[Finding]:
    # an engine that leaves context at 0 (vLLM's stat logger): no context slope to share, in either fit
    reports_context = np.bincount(replica, weights=sums[:, 1 + FEATURES.index("context_tokens")]) > 0
    shape = _blocked(block, replica, sums, block_seconds, adapt, reports_context)
    gaps = _blocked(block, replica, gap_sums, block_seconds, adapt, reports_context)
    findings, tested = _eligible(model, replicas, shape["blocks"], shape["width"], scope)
    if not tested:
        return findings
    tests = _tests(shape, tested)
    tests.update(_gap_tests(gaps, tested))
    for r, p_holm in zip(tests.values(), holm([r["p"] for r in tests.values()]) if tests else []):
        r["p_holm"] = float(p_holm)  # Holm over replicas x targets, the gap's included
        r["slow"] = bool(r["ci"][0] > r["bar"] and p_holm < ALPHA)
    if report is not None:
        report += [{"model": model, "replica": replicas[i], "target": t, **r} for (i, t), r in tests.items()]
    for i in tested:
        targets = {t: r for (j, t), r in tests.items() if j == i}
        if any(r["slow"] for r in targets.values()):
            findings.append(_finding(model, replicas, i, targets, shape, gaps, identity, scope, len(tests)))
    return findings


def _blocked(block: np.ndarray, replica: np.ndarray, sums: np.ndarray, block_seconds: float, adapt: bool,
             reports_context: np.ndarray) -> dict:
    """One model's (B, R, D) time blocks (module doc, 4): at most MAX_BLOCKS, merged in pairs while adjacent
    blocks' residuals correlate; with the block width and the correlation left."""
    span = int(block.max() - block.min()) + 1
    merge = max(1, int(np.ceil(span / MAX_BLOCKS)))  # a long window: wider blocks, never more than MAX_BLOCKS

    def blocks_of(m: int) -> np.ndarray:
        b = _blocks(block, replica, sums, m)
        return b if reports_context.all() else _without_feature(b, FEATURES.index("context_tokens"))

    blocks = blocks_of(merge)
    rho, z = lag1_autocorrelation(blocks, np.unique(block // merge))
    while adapt and z > AUTOCORR_Z and len(blocks) >= MIN_BLOCKS:  # too short for the noise: merge in pairs
        merge *= 2
        blocks = blocks_of(merge)
        rho, z = lag1_autocorrelation(blocks, np.unique(block // merge))
    return {"blocks": blocks, "width": block_seconds * merge, "rho": rho, "z": z,
            "widen": autocorrelation_inflation(rho)}


def lag1_autocorrelation(blocks: np.ndarray, keys: np.ndarray) -> tuple[float, float]:
    """Lag-1 correlation of adjacent blocks' step-time residuals and its z (rho * sqrt(pairs)).
    Residual: a (block, replica) cell's observed / predicted step seconds - 1 under the fit on every
    replica's steps, centred on the replica's own mean (its level is the effect under test, not noise)."""
    _, _, _, xtx, xty = _unpack(blocks.sum(axis=(0, 1)))
    beta = _fit(xtx, xty)[:, 0]
    n, sx, sy, _, _ = _unpack(blocks)
    predicted = sx @ beta
    ok = (n >= MIN_CELL_STEPS) & (predicted > 0)
    e = np.where(ok, sy[..., 0] / np.where(ok, predicted, 1.0) - 1.0, 0.0)
    counts = ok.sum(axis=0)
    e = np.where(ok, e - e.sum(axis=0) / np.maximum(counts, 1), 0.0)
    adjacent = (np.diff(keys) == 1)[:, None] & ok[1:] & ok[:-1]
    pairs = int(adjacent.sum())
    den = float((e[ok] ** 2).sum())
    if pairs < 2 or den <= 0:
        return 0.0, 0.0
    rho = float((e[1:] * e[:-1])[adjacent].sum()) / den
    return rho, rho * float(np.sqrt(pairs))


def _eligible(model: str, replicas: list[str], blocks: np.ndarray, width: float, scope: Scope):
    """The replicas with enough steps and blocks (and peers that have enough) to be tested; an
    insufficient-data finding for each of the others."""
    steps = blocks[:, :, 0].sum(axis=0)
    nblocks = (blocks[:, :, 0] > 0).sum(axis=0)
    findings, tested = [], []
    for i, rid in enumerate(replicas):
        peer_steps = int(steps.sum() - steps[i])
        peer_blocks = int((blocks[:, :, 0].sum(axis=1) - blocks[:, i, 0] > 0).sum())
        if len(replicas) < 2:
            what = f"{rid} is the only replica of {model} with steps: a step-time model needs at least one peer"
        elif nblocks[i] < MIN_BLOCKS or steps[i] < MIN_STEPS:
            what = (f"{int(steps[i])} steps in {int(nblocks[i])} time blocks of {width:g} s on {rid} "
                    f"(need {MIN_STEPS} steps in {MIN_BLOCKS} blocks)")
        elif peer_blocks < MIN_BLOCKS or peer_steps < MIN_STEPS:
            what = (f"the peers of {rid} have {peer_steps} steps in {peer_blocks} time blocks of {width:g} s "
                    f"(need {MIN_STEPS} steps in {MIN_BLOCKS} blocks to fit their step-time model)")
        else:
            tested.append(i)
            continue
        findings.append(insufficient(KIND, rid, DIAGNOSTIC, scope, what, model_name=model, steps=int(steps[i]),
                                     blocks=int(nblocks[i]), peer_steps=peer_steps, block_seconds=width,
                                     min_steps=MIN_STEPS, min_blocks=MIN_BLOCKS))
    return findings, tested


def _tests(shape: dict, tested: list[int]) -> dict[tuple[int, str], dict]:
    """(replica, target) -> ratio, interval, bar and p (unadjusted) of the step targets.
    Forward and host time are compared among the replicas whose engine splits the step into them only (one that
    reports the whole step as forward would read as a peer with no host time)."""
    blocks = shape["blocks"]
    splits = blocks[:, :, 1 + _K + TARGETS.index("host")].sum(axis=0) > 0
    groups = ([(list(range(_T)), np.arange(blocks.shape[1]))] if splits.all() else
              [([0], np.arange(blocks.shape[1])), ([1, 2], np.flatnonzero(splits))])
    out = {}
    for targets, members in groups:
        if len(members) >= 2:
            mine = [i for i in tested if i in members]
            out.update(_group_tests(blocks[:, members], members, targets, mine, shape["widen"], TARGETS,
                                    lambda predicted: MIN_RATIO, shape["width"]))
    return out


def gap_bar(predicted_gap: float, predicted_step: float) -> float:
    """The gap ratio worth a finding (module doc, 1): the one that adds MIN_RATIO's share to the wall time
    of the same work, at the peers' predicted gap and step seconds."""
    return 1.0 + (MIN_RATIO - 1.0) * (predicted_gap + predicted_step) / predicted_gap


def _gap_tests(gaps: dict, tested: list[int]) -> dict[tuple[int, str], dict]:
    """The gap target's tests (unadjusted), for the replicas with enough gaps, whose peers have enough."""
    blocks = gaps["blocks"]
    n = blocks[:, :, 0]
    enough = ((n > 0).sum(axis=0) >= MIN_BLOCKS) & (n.sum(axis=0) >= MIN_STEPS)
    mine = [i for i in tested if enough[i] and (n.sum(axis=1) - n[:, i] > 0).sum() >= MIN_BLOCKS
            and n.sum() - n[:, i].sum() >= MIN_STEPS]
    if not mine:
        return {}
    out = _group_tests(blocks, np.arange(blocks.shape[1]), [0], mine, gaps["widen"], GAP_TARGETS,
                       lambda predicted: gap_bar(predicted[0], max(predicted[1], 0.0)), gaps["width"])
    for r in out.values():  # the peers' predicted share of the busy time that set the bar (gap_bar, inverted)
        r["gap_share"] = (MIN_RATIO - 1.0) / (r["bar"] - 1.0) if r["bar"] > 1.0 else None
    return out


def _group_tests(blocks: np.ndarray, members: np.ndarray, targets: list[int], tested: list[int], widen: float,
                 names: tuple, bar, width: float) -> dict:
    """The tests of `targets` among `members` (indices into the model's replicas), unadjusted; `bar(predicted
    seconds of every target)` the ratio H0 sits at."""
    observed, predicted, ratio = _ratios(blocks.sum(axis=0))
    boot = block_bootstrap(blocks)
    out = {}
    for i in tested:
        m = int(np.flatnonzero(members == i)[0])
        for t in targets:
            if not (observed[m, t] > 0 and predicted[m, t] > 0 and np.isfinite(ratio[m, t])):
                continue
            b = boot[:, m, t]
            logs = np.log(b[np.isfinite(b) & (b > 0)])
            if len(logs) < 2:
                continue
            threshold = float(bar(predicted[m]))
            excess = np.log(ratio[m, t]) - np.log(threshold)  # H0: ratio <= the bar
            se = widen * float(np.std(logs, ddof=1))
            z = excess / se if se > 0 else np.copysign(np.inf, excess)
            # percentiles widened about the estimate by the residual correlation
            lo, hi = np.exp(widened_interval(np.log(ratio[m, t]), logs, widen, CONFIDENCE))
            out[(i, names[t])] = {"ratio": float(ratio[m, t]), "ci": [float(lo), float(hi)],
                                  "p": float(stats.norm.sf(z)), "bar": threshold, "block_seconds": width,
                                  "steps": int(blocks[:, m, 0].sum()),
                                  "observed_seconds": float(observed[m, t]),
                                  "predicted_seconds": float(predicted[m, t])}
    return out


def _mean_shape(blocks: np.ndarray, cols) -> dict:
    total = blocks[:, cols].sum(axis=(0, 1))
    n, sx = total[0], total[1:1 + _K]
    return {f: float(v / n) if n else None for f, v in zip(FEATURES, sx)}


def _finding(model, replicas, i, targets, shape, gaps, identity, scope, family) -> Finding:
    rid = replicas[i]
    blocks, width = shape["blocks"], shape["width"]
    peers = [p for p in replicas if p != rid]
    slow = {t: r for t, r in targets.items() if r["slow"]}
    name, worst = max(slow.items(), key=lambda kv: kv[1]["ci"][0] / kv[1]["bar"])
    me = identity.get(rid, {"replica_id": rid})
    diffs = identity_differences(me, [identity.get(p, {"replica_id": p}) for p in peers])
    severity = "critical" if worst["ci"][0] >= max(CRITICAL_RATIO, worst["bar"]) else "warning"
    others = ", ".join(f"{t} {r['ratio']:.2f}x" for t, r in targets.items() if t != name)
    share = (f", gaps {worst['gap_share']:.0%} of the peers' busy time (bar {worst['bar']:.2f}x)"
             if worst.get("gap_share") is not None else "")
    summary = (f"{rid} takes {worst['ratio']:.2f}x [{worst['ci'][0]:.2f}, {worst['ci'][1]:.2f}] the {LABELS[name]} "
               f"time its {len(peers)} peer(s) of {model} take for the same batch shapes{share}"
               + (f" ({others})" if others else "")
               + f"; block bootstrap over {worst['block_seconds']:g} s time blocks, Holm p={worst['p_holm']:.1e}; "
               + _explain(diffs))
    peer_cols = [replicas.index(p) for p in peers]
    evidence = {
        "model_name": model, "replica": rid, "peers": peers, "targets": targets, "slow_targets": sorted(slow),
        "unit": f"time blocks of {width:g} s (resampled jointly across replicas)",
        "block_seconds": width,
        "block_autocorrelation": {"lag1": shape["rho"], "z": shape["z"], "merged_while_z_above": AUTOCORR_Z,
                                  "spread_widened_by": shape["widen"]},
        "gap_blocks": {"block_seconds": gaps["width"], "lag1": gaps["rho"], "z": gaps["z"],
                       "spread_widened_by": gaps["widen"], "gaps": int(gaps["blocks"][:, i, 0].sum())},
        "steps": int(blocks[:, i, 0].sum()), "blocks": int((blocks[:, i, 0] > 0).sum()),
        "peer_steps": int(blocks[:, peer_cols, 0].sum()),
        "mean_shape": {"replica": _mean_shape(blocks, [i]), "peers": _mean_shape(blocks, peer_cols)},
        "identity_differences": diffs,
        "identity": {k: me.get(k) for k in (*IDENTITY, "cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes")},
        "test": (f"one-sided, H0 ratio <= the target's bar ({MIN_RATIO} for step, forward and host; for the gap, "
                 f"the ratio that adds {MIN_RATIO - 1:.0%} to the wall time of the same work): normal approximation "
                 f"on the block-bootstrap standard error of log(ratio), {RESAMPLES} resamples; {CONFIDENCE:.0%} "
                 f"percentile interval; Holm over {family} (replica, target) tests of {model}"),
        "controlled_for": ("batch shape: phase, prefill tokens, decode tokens, sequences, context tokens (a linear "
                           "step-time model fitted on the peers' steps only, leave-one-out; the gap before a step on "
                           "that step's shape, over steps that follow one that left sequences running); time: blocks "
                           "drawn jointly for every replica"),
        "method": "observed seconds / seconds the peers' step-time model predicts, summed over the replica's steps",
    }
    return Finding(KIND, severity, rid, summary, DIAGNOSTIC, scope, evidence)
