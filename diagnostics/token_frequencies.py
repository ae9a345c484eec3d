"""Prompt token-ID frequencies per replica: a tokenizer that differs shows even where no two
replicas saw the same prompt (a load-balanced, sampled fleet).

Rule. Like with like: per model, workload and prompt family (diagnostics.prompt_family: the prompt
head a kind of prompts shares, such as a system prompt or a template preamble, and the prompt-length
bucket), so that a replica whose clients send other prompts (a tenant of its own) is not compared
with its peers' other traffic. Every pair of replicas is compared in each family both served at least
MIN_PER_FAMILY requests of, and only when those add up to MIN_REQUESTS requests a side (the rest are
left out, and counted in the evidence), on a 2 x C table of prompt token-ID counts: the TOP_K IDs
most frequent in the family, with the IDs expected fewer than MIN_EXPECTED times on either side
merged into one "other" cell (with all the rest).
The statistic is Pearson's chi-square of homogeneity (as scipy.stats.chi2_contingency computes it),
but tokens are not independent draws: a request brings all its tokens at once, and a workload that
repeats a few prompts moves many tokens together. So the request is the unit: each replica's
covariance of the ID shares is estimated from its requests (in up to BLOCKS consecutive blocks, so
bursts count as one), and the statistic is referred to the second-order Rao-Scott (Satterthwaite)
distribution it implies: X^2 / c against chi-square with nu degrees of freedom, c = tr(D^2) / tr(D)
(at least 1: never bolder than independent tokens), nu = tr(D)^2 / tr(D^2), D the design-effect
matrix. The families are independent strata: their X^2 / c and nu add up (homogeneity within every
family, not of the pooled mix). Holm over every pair tested in the run. A pair differs when its
Holm-adjusted p < ALPHA and the total variation distance (the families', weighted by their tokens)
is at least MIN_TVD: a real difference that small is the traffic, not a tokenizer (a Lowercase or
NFKC normalizer moves far more token mass).

A distribution is not tokenizer evidence: within one family the clients may still ask about other
things. A replica that differs is a warning (token_distribution_shift) only where the same text
became other token IDs on it (tokenizer_divergence, from client traffic or the prober's rounds);
without that it is an info (token_distribution_traffic) that names the difference as its traffic.
A replica is named (token_distribution_shift, warning) when it differs from more than half of its
peers in the workload. Where that names both sides of a difference (always, with two replicas), the
baseline of diagnostics.baseline.choose_baseline is the reference: only replicas off its side that
differ from a replica on it are named; a split that no baseline side decides is an info tie.

Reads the most recent SAMPLE_ROWS requests of the window (one time slice for every replica, so the
sides see the same hours; a contiguous slice is what spares the scan, a hash sample reads it all).
Probe requests (workload "probe") are left out: the same prompts on every replica, compared one to
one by the divergence check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from diagnostics import prompt_family
from diagnostics.findings import Finding, insufficient
from diagnostics.scope import Scope, requests_in
from evals.stats import TestResult, holm
from telemetry.contract.probes import ACTIVE_WORKLOADS

DIAGNOSTIC = "tokenizer"
KIND = "token_distribution_shift"
TRAFFIC_KIND = "token_distribution_traffic"  # a shift without tokenizer evidence (info)
SAMPLE_ROWS = 50_000
TOP_K = 100
MIN_EXPECTED = 5.0  # per cell and side: the chi-square approximation's usual floor
MIN_REQUESTS = 30  # per replica and workload, in the prompt families both sides served
MIN_PER_FAMILY = 10  # per side, for a prompt family to be compared (fewer: its covariance is too rough)
MIN_TVD = 0.05  # share of the prompt token mass that moved
ALPHA = 0.01  # a diagnostic that runs every hour: a clean pair alarms in 1% of runs at most
BLOCKS = 128  # request blocks per replica and workload for the covariance (fewer requests: one each)
SHOWN = 5  # over- and under-represented IDs shown

_COUNT = "SELECT count() AS n FROM {source}"
_COUNT_COLUMNS = "t.request_id"
_CUT_COLUMNS = "t.arrival_time AS arrival_time"
_CUT = "SELECT quantile({level:Float64})(toFloat64(arrival_time)) AS cut FROM {source}"
_PROMPTS = """
SELECT model_name, workload, family, replica_id, prompt_token_ids
FROM {source}
ORDER BY model_name, workload, family, replica_id, arrival_time
"""
_CLIENT_PROMPTS = """
(SELECT * FROM {source} WHERE notEmpty(prompt_token_ids) AND NOT has({active:Array(String)}, workload))
"""
_COLUMNS = f"{prompt_family.COLUMNS}, t.replica_id AS replica_id, t.arrival_time AS arrival_time"


@dataclass
class Workload:
    """One stratum: a model's workload's prompts of one family (diagnostics.prompt_family)."""
    model: str
    workload: str
    family: str
    replicas: list[str]
    requests: np.ndarray  # (R,)
    ids: np.ndarray  # (K,) the top IDs, most frequent first; cell K is "other"
    blocks: np.ndarray  # (R, BLOCKS, K + 1) token counts per replica, request block and cell

    def counts(self, i: int) -> np.ndarray:
        return self.blocks[i].sum(axis=0)


@dataclass
class PairTest(TestResult):
    model: str
    workload: str
    a: str
    b: str
    cells: int
    chi_square: float  # Pearson's, on the merged table
    scale: float  # c: the Rao-Scott correction divides the statistic by it
    df: float  # nu
    p: float
    tvd: float
    cramers_v: float
    requests: tuple[int, int]
    tokens: tuple[int, int]
    p_holm: float = 1.0
    families: tuple[str, ...] = ()  # the prompt families (strata) both served, combined
    left_out: tuple[int, int] = (0, 0)  # requests in families the other side did not serve (enough of)

    def __post_init__(self):
        self.test = self.test or "Pearson chi-square of homogeneity, second-order Rao-Scott"
        self.statistic, self.p_value, self.effect = self.chi_square / self.scale, self.p, self.tvd
        self.n = sum(self.requests)

    @property
    def differs(self) -> bool:
        return self.p_holm < ALPHA and self.tvd >= MIN_TVD

    def to_dict(self) -> dict:
        return {"replicas": [self.a, self.b], "cells": self.cells, "chi_square": self.chi_square,
                "rao_scott_scale": self.scale, "rao_scott_df": self.df, "p": self.p, "p_holm": self.p_holm,
                "total_variation_distance": self.tvd, "cramers_v": self.cramers_v, "requests": list(self.requests),
                "tokens": list(self.tokens),
                "prompt_families": list(self.families), "requests_left_out": list(self.left_out),
                "test": "Pearson chi-square of homogeneity per prompt family, second-order Rao-Scott (request "
                        "blocks), summed over the families both served; Holm"}


# -- reading ----------------------------------------------------------------------------------------

def sample_scope(store, scope: Scope) -> tuple[Scope, int]:
    """The scope narrowed to its most recent SAMPLE_ROWS requests (or itself), and the requests in it."""
    n = store.query_arrow(_COUNT.replace("{source}", requests_in(_COUNT_COLUMNS, scope=scope)),
                          scope.parameters()).to_pylist()[0]["n"]
    if n <= SAMPLE_ROWS:
        return scope, n
    cut = store.query_arrow(_CUT.replace("{source}", requests_in(_CUT_COLUMNS, scope=scope)),
                            {**scope.parameters(), "level": 1.0 - SAMPLE_ROWS / n}).to_pylist()[0]["cut"]
    return scope.narrowed(start=max(cut, scope.start or 0.0)), n


def _runs(keys: list) -> list[tuple[int, int]]:
    """[lo, hi) of each run of equal keys (the rows are sorted)."""
    edges = [0] + [k for k in range(1, len(keys)) if keys[k] != keys[k - 1]] + [len(keys)]
    return list(zip(edges[:-1], edges[1:]))


def read_workloads(store, scope: Scope) -> list[Workload]:
    """The sampled prompts, counted per (model, workload): one query, the counting in numpy."""
    # probes are the same prompts on every replica: compared one to one (same_text_different_ids), not here;
    # rescore requests repeat served ones (cross-scoring): neither is client traffic
    client = _CLIENT_PROMPTS.replace("{source}", requests_in(_COLUMNS, scope=scope))
    table = store.query_arrow(_PROMPTS.replace("{source}", prompt_family.with_family(client)),
                              {**scope.parameters(), "active": list(ACTIVE_WORKLOADS)})
    if table.num_rows == 0:
        return []
    ids = table.column("prompt_token_ids").combine_chunks()
    return count_workloads(table.column("model_name").to_pylist(), table.column("workload").to_pylist(),
                           table.column("replica_id").to_pylist(), ids.values.to_numpy(),
                           ids.offsets.to_numpy(), table.column("family").to_pylist())


def count_workloads(models: list, workloads: list, replicas: list, flat: np.ndarray,
                    offsets: np.ndarray, families: list | None = None) -> list[Workload]:
    """Prompts (row k: flat[offsets[k]:offsets[k + 1]]), sorted by model, workload, family, replica,
    arrival; one Workload per (model, workload, family)."""
    families = families if families is not None else [prompt_family.UNSHARED] * len(models)
    out = []
    for lo, hi in _runs(list(zip(models, workloads, families))):
        reps = _runs(replicas[lo:hi])
        tokens = flat[offsets[lo]:offsets[hi]]
        pooled = np.bincount(tokens)
        top = np.argsort(-pooled, kind="stable")[:TOP_K]
        top = top[pooled[top] > 0]
        cell_of = np.full(len(pooled), len(top))
        cell_of[top] = np.arange(len(top))
        # each request's replica and block of consecutive requests, then each token's key with its cell
        rep = np.empty(hi - lo, dtype=np.int64)
        block = np.empty(hi - lo, dtype=np.int64)
        for r, (a, b) in enumerate(reps):
            rep[a:b] = r
            block[a:b] = np.arange(b - a) * BLOCKS // (b - a)
        per_token = np.repeat((rep * BLOCKS + block) * (len(top) + 1), np.diff(offsets[lo:hi + 1]))
        blocks = np.bincount(per_token + cell_of[tokens], minlength=len(reps) * BLOCKS * (len(top) + 1))
        out.append(Workload(models[lo], workloads[lo], families[lo], [replicas[lo + a] for a, _ in reps],
                            np.array([b - a for a, b in reps]), top,
                            blocks.reshape(len(reps), BLOCKS, -1).astype(np.float64)))
    return out


# -- the test ---------------------------------------------------------------------------------------

def merge_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cell -> merged cell: ID cells expected at least MIN_EXPECTED times on both sides keep their
    own; every other cell goes to the last ("other")."""
    col, ta, tb = a + b, a.sum(), b.sum()
    expected = np.minimum(col * ta, col * tb) / (ta + tb)
    keep = np.flatnonzero(expected[:-1] >= MIN_EXPECTED)
    target = np.full(len(a), len(keep))
    target[keep] = np.arange(len(keep))
    return target


def _share_covariance(blocks: np.ndarray, requests: int) -> np.ndarray:
    """Covariance of the cell shares of one side, the request blocks as the unit (ratio estimator)."""
    sizes = blocks.sum(axis=1)
    total = sizes.sum()
    resid = blocks - np.outer(sizes, blocks.sum(axis=0) / total)
    g = min(requests, blocks.shape[0])  # non-empty blocks
    # einsum, not BLAS: ~100 x 128 matrices, where threaded OpenBLAS on a busy host costs ~10x the work
    return g / max(g - 1, 1) * np.einsum("ki,kj->ij", resid, resid) / total**2


def rao_scott(a_blocks: np.ndarray, b_blocks: np.ndarray, n_a: int, n_b: int) -> tuple[float, float]:
    """(c, nu) of the second-order correction for the 2 x C table the blocks sum to."""
    a, b = a_blocks.sum(axis=0), b_blocks.sum(axis=0)
    ta, tb = a.sum(), b.sum()
    p = (a + b) / (ta + tb)
    k = 1 / ta + 1 / tb
    v = (_share_covariance(a_blocks, n_a) + _share_covariance(b_blocks, n_b))[:-1, :-1]
    # the inverse of the multinomial covariance (diag(p) - pp^T) k on all cells but the last is
    # (diag(1 / p) + 1 / p_last) / k: its product with v by broadcasting, no matrix product
    d = (v / p[:-1, None] + v.sum(axis=0)[None, :] / p[-1]) / k
    tr, tr2 = float(np.trace(d)), float((d * d.T).sum())
    if tr <= 0 or tr2 <= 0:
        return 1.0, float(len(p) - 1)
    return max(1.0, tr2 / tr), tr * tr / tr2


def pearson_chi_square(table: np.ndarray) -> float:
    """scipy.stats.chi2_contingency(table, correction=False).statistic, without its per-call cost
    (milliseconds, and the pairs grow with the square of the replicas)."""
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


def _merged(blocks: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Column c of blocks added into column target[c]."""
    out = np.zeros((blocks.shape[0], target.max() + 1))
    np.add.at(out.T, target, blocks.T)
    return out


def pair_test(w: Workload, i: int, j: int) -> PairTest | None:
    target = merge_map(w.counts(i), w.counts(j))
    a_blocks, b_blocks = _merged(w.blocks[i], target), _merged(w.blocks[j], target)
    table = np.array([a_blocks.sum(axis=0), b_blocks.sum(axis=0)])
    if table[:, -1].sum() == 0:  # nothing merged into other: drop the empty cell
        table, a_blocks, b_blocks = table[:, :-1], a_blocks[:, :-1], b_blocks[:, :-1]
    if table.shape[1] < 2:
        return None
    x2 = pearson_chi_square(table)
    c, nu = rao_scott(a_blocks, b_blocks, int(w.requests[i]), int(w.requests[j]))
    shares = table / table.sum(axis=1, keepdims=True)
    return PairTest(w.model, w.workload, w.replicas[i], w.replicas[j], table.shape[1], x2, c, nu,
                    float(special.chdtrc(nu, x2 / c)), float(0.5 * np.abs(shares[0] - shares[1]).sum()),
                    float(np.sqrt(x2 / table.sum())), (int(w.requests[i]), int(w.requests[j])),
                    (int(table[0].sum()), int(table[1].sum())), families=(w.family,))


def combined(parts: list[PairTest], left_out: tuple[int, int]) -> PairTest:
    """One pair's per-family tests as one: each family's X^2 / c is approximately chi-square on its nu
    df and the families are independent, so their sum is chi-square on the summed df (homogeneity
    within every family, not of the pooled mix). The TVD: the families' TVDs weighted by their tokens."""
    first = parts[0]
    scaled = sum(t.chi_square / t.scale for t in parts)
    x2, df = sum(t.chi_square for t in parts), sum(t.df for t in parts)
    tokens = np.array([sum(t.tokens) for t in parts], dtype=float)
    return PairTest(first.model, first.workload, first.a, first.b, sum(t.cells for t in parts), x2,
                    x2 / scaled if scaled > 0 else 1.0, df, float(special.chdtrc(df, scaled)),
                    float(np.dot(tokens, [t.tvd for t in parts]) / tokens.sum()),
                    float(np.sqrt(x2 / tokens.sum())),
                    (sum(t.requests[0] for t in parts), sum(t.requests[1] for t in parts)),
                    (sum(t.tokens[0] for t in parts), sum(t.tokens[1] for t in parts)),
                    families=tuple(f for t in parts for f in t.families), left_out=left_out)


@dataclass
class Group:
    """A model's workload over all its prompt families: who served how many requests."""
    model: str
    workload: str
    strata: list[Workload]

    @property
    def replicas(self) -> list[str]:
        return sorted({r for w in self.strata for r in w.replicas})

    def requests(self, rid: str) -> int:
        return sum(int(w.requests[w.replicas.index(rid)]) for w in self.strata if rid in w.replicas)


def groups_of(workloads: list[Workload]) -> list[Group]:
    out: dict[tuple, Group] = {}
    for w in workloads:
        out.setdefault((w.model, w.workload), Group(w.model, w.workload, [])).strata.append(w)
    return list(out.values())


def _pair(g: Group, a: str, b: str) -> PairTest | None:
    """a against b in the families both served MIN_PER_FAMILY requests of, combined; None when they
    share fewer than MIN_REQUESTS requests a side there."""
    parts = []
    for w in g.strata:
        if a in w.replicas and b in w.replicas:
            i, j = w.replicas.index(a), w.replicas.index(b)
            if min(w.requests[i], w.requests[j]) >= MIN_PER_FAMILY and (t := pair_test(w, i, j)):
                parts.append(t)
    if not parts or min(sum(t.requests[0] for t in parts), sum(t.requests[1] for t in parts)) < MIN_REQUESTS:
        return None
    left = (g.requests(a) - sum(t.requests[0] for t in parts), g.requests(b) - sum(t.requests[1] for t in parts))
    return combined(parts, left)


def pair_tests(workloads: list[Workload]) -> tuple[list[PairTest], list[tuple[Group, list[str]]]]:
    """Every pair of replicas of every (model, workload) that served enough of the same prompt
    families, Holm-adjusted together; and the groups where no pair did (with their replicas)."""
    tests, short = [], []
    for g in groups_of(workloads):
        reps = g.replicas
        found = [t for x, a in enumerate(reps) for b in reps[x + 1:] if (t := _pair(g, a, b))]
        if found:
            tests += found
        elif len(reps) >= 2:
            short.append((g, reps))  # no pair compared: each is short of requests its peers' families share
    for t, p in zip(tests, holm(tests)):
        t.p_holm = p
    return tests, short


def named(tests: list[PairTest], baseline_side: set[str]) -> tuple[dict[str, list[PairTest]], dict[str, list]]:
    """replica -> the tests it differs in, for the replicas named; or, for a split no baseline side
    decides, the same for the replicas in it (info ties)."""
    peers: dict[str, set] = {}
    differs: dict[str, list[PairTest]] = {}
    for t in tests:
        peers.setdefault(t.a, set()).add(t.b)
        peers.setdefault(t.b, set()).add(t.a)
        if t.differs:
            differs.setdefault(t.a, []).append(t)
            differs.setdefault(t.b, []).append(t)
    out = {r: ts for r, ts in differs.items() if len(ts) > len(peers[r]) / 2}
    if not any(t.differs and t.a in out and t.b in out for t in tests):
        return out, {}  # a majority decided
    # a split (replicas named on both sides of a difference): the baseline side is the reference
    kept = {r: [t for t in ts if ({t.a, t.b} - {r}) & baseline_side] for r, ts in out.items()
            if r not in baseline_side}
    kept = {r: ts for r, ts in kept.items() if ts}
    return (kept, {}) if kept else ({}, out)


# -- findings ---------------------------------------------------------------------------------------

def shifts(store, scope: Scope, toks: dict, baselines: dict, tokenizer_evidence: dict | None = None) -> list[Finding]:
    """token_distribution_shift findings (and insufficient / tie / traffic infos); `baselines`: model ->
    Baseline; `tokenizer_evidence`: replica -> what shows its tokenizer differs (the same text became
    other token IDs). Without that, a difference is the replica's traffic: an info, never a warning."""
    sampled, in_window = sample_scope(store, scope)
    workloads = read_workloads(store, sampled)
    tests, short = pair_tests(workloads)
    findings = [insufficient(KIND, f"{g.model} workload={g.workload}", DIAGNOSTIC, scope,
                             f"fewer than two replicas of {g.model} served {MIN_REQUESTS} requests of workload "
                             f"{g.workload!r} in prompt families a peer served too, in the sample "
                             f"(too few: {', '.join(few)})", model_name=g.model,
                             workload=g.workload, min_requests=MIN_REQUESTS, min_per_family=MIN_PER_FAMILY,
                             requests={r: g.requests(r) for r in g.replicas})
                for g, few in short]
    by_key = {(g.model, g.workload): g for g in groups_of(workloads)}
    groups: dict[tuple, list[PairTest]] = {}
    for t in tests:
        groups.setdefault((t.model, t.workload), []).append(t)
    sample = {"requests_in_window": in_window, "read_from": sampled.start, "max_rows": SAMPLE_ROWS}
    for key, ts in sorted(groups.items()):
        base = baselines.get(key[0])
        names, ties = named(ts, set(base.replicas) if base else set())
        for rid, differing in sorted({**names, **ties}.items()):
            findings.append(_finding(by_key[key], rid, differing, ts, base, toks.get(rid), scope, rid in ties,
                                     sample, (tokenizer_evidence or {}).get(rid)))
    return findings


def _token_rows(g: Group, rid: str, refs: list[str], families: set, tok) -> tuple[list[dict], list[dict], dict]:
    """The IDs most over- and under-represented on `rid` against its reference replicas pooled, over
    the prompt families compared."""
    mine: dict[int, float] = {}
    theirs: dict[int, float] = {}
    other = np.zeros(2)
    for w in g.strata:
        if w.family not in families or rid not in w.replicas:
            continue
        for side, acc, who in ((0, mine, [rid]), (1, theirs, [r for r in refs if r in w.replicas])):
            for r in who:
                c = w.counts(w.replicas.index(r))
                for token, v in zip(w.ids.tolist(), c[:-1]):
                    acc[token] = acc.get(token, 0.0) + v
                other[side] += c[-1]
    ids = sorted(set(mine) | set(theirs))
    a = np.array([mine.get(x, 0.0) for x in ids] + [other[0]])
    b = np.array([theirs.get(x, 0.0) for x in ids] + [other[1]])
    a, b = a / max(a.sum(), 1.0), b / max(b.sum(), 1.0)
    diff = (a - b)[:-1]  # the ID cells, not "other"

    def row(k):
        entry = {"id": ids[k], "replica_share": float(a[k]), "reference_share": float(b[k]),
                 "difference": float(diff[k])}
        if tok is not None:
            entry["text"] = tok.piece(ids[k])
        return entry

    order = np.argsort(diff, kind="stable")
    over = [row(k) for k in order[::-1][:SHOWN] if diff[k] > 0]
    under = [row(k) for k in order[:SHOWN] if diff[k] < 0]
    return over, under, {"replica_share": float(a[-1]), "reference_share": float(b[-1])}


def _finding(g: Group, rid, differing, tests, base, tok, scope, tie: bool, sample: dict,
             tokenizer_evidence: str | None) -> Finding:
    refs = sorted({x for t in differing for x in (t.a, t.b)} - {rid})
    strongest = min(differing, key=lambda t: (t.p_holm, -t.tvd))
    families = {f for t in differing for f in t.families}
    over, under, other = _token_rows(g, rid, refs, families, tok)

    def listed(rows):
        return ", ".join(f"{e['id']} {e['text']!r}" if "text" in e else str(e["id"]) for e in rows[:3]) or "-"

    summary = (f"{rid}: prompt token-ID frequencies in workload {g.workload!r} of {g.model} differ from "
               f"{', '.join(refs)}'s in the same {len(strongest.families)} prompt families (chi-square "
               f"{strongest.chi_square:.1f} / {strongest.scale:.2f} on {strongest.df:.1f} df, "
               f"p_holm={strongest.p_holm:.2g}, TVD {strongest.tvd:.2f}); fewer: {listed(under)}; "
               f"more: {listed(over)}")
    evidence = {"model_name": g.model, "workload": g.workload, "replica": rid, "reference_replicas": refs,
                "peers": sorted({x for t in tests for x in (t.a, t.b)} - {rid}),
                "tests": [t.to_dict() for t in differing], "over_represented": over, "under_represented": under,
                "other_ids": other, "baseline": base.describe() if base else None, "sample": sample,
                "tokenizer_evidence": tokenizer_evidence,
                "cause": "tokenizer" if tokenizer_evidence else "traffic",
                "thresholds": {"alpha_holm": ALPHA, "min_tvd": MIN_TVD, "min_requests": MIN_REQUESTS,
                               "min_per_family": MIN_PER_FAMILY, "min_expected_per_cell": MIN_EXPECTED,
                               "top_k": TOP_K},
                "method": "per pair of replicas and prompt family (diagnostics.prompt_family: shared prompt "
                          "head and length bucket) both served, a 2 x C table of prompt token-ID counts (top "
                          "IDs, rare ones merged into other); Pearson chi-square, second-order Rao-Scott with "
                          "the request (block) as the unit, summed over the families, Holm over all pairs, TVD "
                          "floor; named when it differs from most of its peers, or from the baseline side "
                          "where they split; a warning only with tokenizer evidence (the same text, other IDs)"}
    subject = f"{rid} workload={g.workload}"
    if tie:
        return Finding("token_distribution_tie", "info", subject, "no baseline side decides: " + summary,
                       DIAGNOSTIC, scope, evidence, id_kind=KIND)
    if not tokenizer_evidence:
        # the same kind of prompt, other tokens, but no text that became other IDs: what its clients
        # sent differs (other topics, languages, users), which a tokenizer check cannot blame on it
        return Finding(TRAFFIC_KIND, "info", subject,
                       summary + "; no prompt text became different token IDs on it: read as a difference in "
                                 "its traffic, not its tokenizer", DIAGNOSTIC, scope, evidence, id_kind=KIND)
    return Finding(KIND, "warning", subject, f"{summary}; tokenizer evidence: {tokenizer_evidence}",
                   DIAGNOSTIC, scope, evidence)
