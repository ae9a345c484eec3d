"""Probes: the same greedy prompts sent to every replica each round, compared token for token.

The prober sends the probe suite to every replica once a round, each probe "solo" (alone on an
idle replica) and "batched" (inside a burst of filler requests). Their rows carry workload "probe"
and request ids `probe.<round>.<probe>.<mode>.<replica>` (telemetry.contract.probes); fillers are
not compared, nor are aborted or failed probes. Per model:

1. Baseline: diagnostics.baseline.choose_baseline (a pin, else the requested side, else a recorded
   role, else the identity deployed first where the deploys are apart), said in every finding. Where
   it decides nothing (replicas started together, no role, no pin): with 3+ replicas answering and
   one identity held by most of them, that identity is the reference (`majority`); otherwise the
   split is symmetric: one probe_drift finding per pair ("r0 vs r1"), a warning at most, that names
   no side and asks for a `role`.
2. Reference. Under a pin: each probe's pinned prompt and output token IDs, and EVERY replica
   (baseline identity or not) is compared with them, on its latest round. Otherwise, per replica:
   the latest round it shares with a baseline-side replica; in that round the baseline-side
   replica with the most solo answers (then the lowest id) is the reference.
3. Solo answers are compared probe by probe; the same probe with another prompt text hash is
   another version of the suite and is not compared. A probe mismatches when its output token IDs
   differ, or its prompt token IDs do (the same text tokenized or templated differently: the
   evidence then shows the first divergent prompt position).
4. Verdict on k mismatching of n probes, with the Wilson 95% interval [low, high] of k/n:
   critical when k/n >= 0.5 and low > 20% (half the suite, and not by the luck of a handful);
   warning when k >= 2 and low > 2% (more than the rare near-tie flip); info otherwise.
   Against the baseline or the pin the kind is probe_drift. Without a pin, baseline-side replicas
   (one identity) are also compared with each other: a disagreement is probe_nondeterminism, a
   warning from 2 mismatching probes, info for one (a near-tie argmax can flip on other hardware),
   never critical (no side is the wrong one).
5. Batch invariance, per replica over every round: a probe answered solo and batched in one round
   (same prompt IDs) with different outputs is an occurrence. batch_variance is a warning when the
   occurrences span >= 2 probes or >= 2 rounds, info for a single one: fp32 batch effects can
   legitimately flip a near-tie argmax. The batch sizes shown are the most sequences in any step
   of that replica while each request ran.
6. What cannot be decided is an insufficient_data finding that says what is missing: fewer than
   two replicas answering (and no pin), no baseline-side answers, no candidate identity, fewer than
   MIN_PROBES comparable probes, no probe answered in both modes.
7. A check that ran and found nothing says so: `probe_agreement` (the replicas whose answers matched,
   on how many probes, in which round) and `batch_invariant` (the solo/batched pairs all identical),
   both info. Only settled rounds are read: a round whose last answer finished within
   ROUND_SETTLE_SECONDS of the window's end may still be arriving, and is left out (an info says so).

The store hands over hashes of the token IDs for every round; the IDs themselves are read only for
the rounds compared and the examples shown.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from diagnostics import config_keys
from diagnostics.baseline import IDENTITY_FIELDS, Baseline, choose_baseline, identity_key
from diagnostics.findings import Finding, insufficient
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.replicas import IDENTITY, differs_in, identity_differences
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from diagnostics.token_evidence import divergence
from evals.stats import wilson_interval
from telemetry.contract.probes import FILLER_PREFIX, PROBE_ID_REGEX_SQL, PROBE_WORKLOAD

DIAGNOSTIC = "probe"
DRIFT, NONDETERMINISM, BATCH = "probe_drift", "probe_nondeterminism", "batch_variance"
AGREE, BATCH_CLEAN = "probe_agreement", "batch_invariant"  # the info a clean check leaves
# a round whose last answer finished this close to the window's end may still be arriving (the recorders flush
# every second or so; a store that was away replays its spool later): it is left out until it has settled
ROUND_SETTLE_SECONDS = 30.0
MIN_PROBES = 5  # comparable probes a replica needs before a verdict
CRITICAL_RATE, CRITICAL_LOW = 0.5, 0.20
WARNING_MIN, WARNING_LOW = 2, 0.02
MAX_EXAMPLES = 3
# the identity fields that can change a greedy answer, named in summaries (the evidence has all differences)
ANSWER_FIELDS = IDENTITY_FIELDS + ("quantization", "dtype", "speculative_mode", "attention_backend", "device")
FP_NOTE = ("a single flip can be a floating-point effect: fp32 sums in another order (another batch, "
           "another kernel or CPU) can turn a near-tie argmax; repeated flips are not that")

_SOURCE_COLUMNS = ("t.model_name AS model_name, t.replica_id AS replica_id, t.request_id AS request_id, "
                   "t.workload AS workload, t.arrival_time AS arrival_time, t.prompt_token_ids AS prompt_token_ids, "
                   "t.output_token_ids AS output_token_ids, t.prompt_text_hash AS prompt_text_hash, "
                   "t.scheduled_time AS scheduled_time, t.finish_time AS finish_time, t.finish_reason AS finish_reason")

# one answer per (replica, round, probe, mode): the latest, as hashes
_ANSWERS = f"""
SELECT model_name, replica_id, parts[1] AS round_id, parts[2] AS probe_id, parts[3] AS mode,
       argMax(request_id, arrival_time) AS request_id,
       argMax(cityHash64(prompt_token_ids), arrival_time) AS prompt_hash,
       argMax(cityHash64(output_token_ids), arrival_time) AS output_hash,
       argMax(prompt_text_hash, arrival_time) AS text_hash,
       argMax(toFloat64(scheduled_time), arrival_time) AS scheduled,
       argMax(toFloat64(finish_time), arrival_time) AS finished
FROM (SELECT model_name, replica_id, request_id, arrival_time, prompt_token_ids, output_token_ids, prompt_text_hash,
             scheduled_time, finish_time, extractGroups(request_id, {PROBE_ID_REGEX_SQL}) AS parts
      FROM {{source}}
      WHERE workload = '{PROBE_WORKLOAD}' AND finish_reason IN ('stop', 'length'))
WHERE length(parts) = 4 AND NOT startsWith(parts[2], '{FILLER_PREFIX}')
GROUP BY model_name, replica_id, round_id, probe_id, mode
"""

_TOKEN_IDS = """
SELECT replica_id, request_id, argMax(prompt_token_ids, arrival_time) AS prompt_ids,
       argMax(output_token_ids, arrival_time) AS output_ids
FROM requests
WHERE has({ids:Array(String)}, request_id) AND has({replicas:Array(String)}, replica_id)
  AND arrival_time >= toDateTime64({start:Float64}, 6, 'UTC') AND arrival_time < toDateTime64({end:Float64}, 6, 'UTC')
GROUP BY replica_id, request_id
"""

_BATCH_SIZE = """
SELECT maxOrNull(num_seqs) AS batch FROM steps
WHERE replica_id = {replica:String} AND start_time >= toDateTime64({start:Float64}, 6, 'UTC')
  AND start_time <= toDateTime64({end:Float64}, 6, 'UTC')
"""


@dataclass(frozen=True)
class Answer:
    replica_id: str
    round_id: str
    probe_id: str
    mode: str
    request_id: str
    prompt_hash: int
    output_hash: int
    text_hash: str
    scheduled: float
    finished: float


@dataclass
class Side:
    """What one side of a comparison answered: probe_id -> (prompt IDs, output IDs, text hash)."""
    name: str  # a replica id, or "pin"
    round_id: str
    probes: dict
    row: dict | None  # identity row (a replica's, or the pin's) for tokenizers and identity differences


def severity(k: int, n: int) -> str:
    low, _ = wilson_interval(k, n)
    if k / n >= CRITICAL_RATE and low > CRITICAL_LOW:
        return "critical"
    if k >= WARNING_MIN and low > WARNING_LOW:
        return "warning"
    return "info"


def _round_order(round_id: str) -> int:
    return int(round_id[1:])


# -- reading -------------------------------------------------------------------------------------

def answers(store, scope: Scope) -> dict[str, dict]:
    """model -> replica -> mode -> round -> probe -> Answer."""
    sql = _ANSWERS.replace("{source}", requests_in(_SOURCE_COLUMNS, scope=scope))
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in store.query_arrow(sql, scope.parameters()).to_pylist():
        a = Answer(r["replica_id"], r["round_id"], r["probe_id"], r["mode"], r["request_id"], r["prompt_hash"],
                   r["output_hash"], r["text_hash"], r["scheduled"], r["finished"])
        out[r["model_name"]][a.replica_id][a.mode].setdefault(a.round_id, {})[a.probe_id] = a
    return out


def token_ids(store, scope: Scope, wanted: list[Answer]) -> dict[tuple[str, str], tuple[list, list]]:
    """(replica, request id) -> (prompt IDs, output IDs) of the answers wanted, in one scan."""
    if not wanted:
        return {}
    params = {**scope.parameters(), "ids": sorted({a.request_id for a in wanted}),
              "replicas": sorted({a.replica_id for a in wanted})}
    rows = store.query_arrow(_TOKEN_IDS, params).to_pylist()
    return {(r["replica_id"], r["request_id"]): (list(r["prompt_ids"]), list(r["output_ids"])) for r in rows}


def batch_size(store, replica: str, a: Answer) -> int | None:
    # the step that first schedules a request starts at its scheduled_time: a millisecond of slack
    rows = store.query_arrow(_BATCH_SIZE, {"replica": replica, "start": a.scheduled - 1e-3,
                                           "end": a.finished}).to_pylist()
    return rows[0]["batch"] if rows else None


# -- comparing -----------------------------------------------------------------------------------

def _side(name: str, round_id: str, solo: dict, ids: dict, row: dict | None) -> Side:
    probes = {}
    for probe, a in solo.items():
        if (a.replica_id, a.request_id) in ids:
            prompt, output = ids[(a.replica_id, a.request_id)]
            probes[probe] = (prompt, output, a.text_hash)
    return Side(name, round_id, probes, row)


def _pin_side(b: Baseline) -> Side:
    probes = {p: (list(pin["prompt_token_ids"]), list(pin["output_token_ids"]), pin["prompt_text_hash"])
              for p, pin in b.pins.items()}
    latest = max(b.pins.values(), key=lambda p: p["pinned_time"])
    return Side("pin", latest["round_id"], probes, latest)


def _token(entries: list[dict], pos: int) -> str:
    e = next((e for e in entries if e["position"] == pos), None)
    if e is None:
        return "(end)"
    return f"{e['id']} {e['text']!r}" if "text" in e else str(e["id"])


def _at(div: dict, what: str, mine: str, ref: str) -> str:
    pos = div["first_divergence"]
    return (f"first divergent {what} token {pos}: {_token(div['replica_tokens_at_divergence'], pos)} on {mine} "
            f"vs {_token(div['reference_tokens_at_divergence'], pos)} on {ref}")


def compare(me: Side, ref: Side, source: TokenizerSource) -> dict:
    """Probe by probe: compared, mismatching, prompt-tokenization mismatches, skipped, examples."""
    compared, mismatched, prompts, skipped, examples = [], [], [], [], []
    tok = source.for_replica(me.row) if me.row else None
    ref_tok = (source.for_replica(ref.row) if ref.row else None) or tok
    for probe in sorted(me.probes.keys() & ref.probes.keys()):
        (mp, mo, mh), (rp, ro, rh) = me.probes[probe], ref.probes[probe]
        if mh and rh and mh != rh:  # another text under the same name: the suite changed in between
            skipped.append(probe)
            continue
        compared.append(probe)
        if mp == rp and mo == ro:
            continue
        mismatched.append(probe)
        if mp != rp:
            prompts.append(probe)
        if len(examples) < MAX_EXAMPLES:
            ex = {"probe_id": probe, "round_id": me.round_id, "reference": ref.name, "reference_round": ref.round_id,
                  **divergence(mo, ro, tok, ref_tok, "replica", "reference")}
            if mp != rp:
                ex["prompt_divergence"] = divergence(mp, rp, tok, ref_tok, "replica", "reference")
            examples.append(ex)
    return {"compared": compared, "mismatched": mismatched, "prompt_mismatched": prompts, "skipped": skipped,
            "examples": examples}


# -- verdicts ------------------------------------------------------------------------------------

def _identity_diffs(me: Side, ref: Side) -> list[dict]:
    if me.row is None or ref.row is None:
        return []
    if ref.name == "pin":  # a pin carries the answer-changing fields only
        return [{"field": f, "replica": me.row.get(f), "pin": ref.row.get(f)} for f in IDENTITY_FIELDS
                if str(me.row.get(f, "")) != str(ref.row.get(f, ""))]
    return identity_differences(me.row, [ref.row])


def _answer_key(field: str) -> bool:
    """A config key that can change a greedy answer: the model's files, generation defaults, engine options
    (not the serve flags nor the placement; not a replica-row column)."""
    return field not in IDENTITY and field != "cpus_shared_with" and \
        config_keys.section(field) not in ("serve_options", "placement")


def verdict(scope: Scope, kind: str, me: Side, ref: Side, b: Baseline, c: dict, how: str = "") -> Finding | None:
    """`how`: "" (against the baseline or pin), "majority" (no baseline; most replicas' identity), or
    "symmetric" (no side decides: one finding on the pair, at most a warning)."""
    n, k, j = len(c["compared"]), len(c["mismatched"]), len(c["prompt_mismatched"])
    symmetric = how == "symmetric"
    subject = me.name if kind == DRIFT and not symmetric else " vs ".join(sorted((me.name, ref.name)))
    if n < MIN_PROBES:
        return insufficient(kind, subject, DIAGNOSTIC, scope,
                            f"{me.name} answered {n} probes comparable with {ref.name} in round {me.round_id} "
                            f"(need {MIN_PROBES})", compared=n, mismatched=k, baseline=b.describe())
    if not k:
        return None
    low, high = wilson_interval(k, n)
    sev = severity(k, n) if kind == DRIFT else ("warning" if k >= WARNING_MIN else "info")
    if symmetric and sev == "critical":
        sev = "warning"  # no side is known to be the wrong one
    what = (f"{ref.name} and {me.name} disagree" if symmetric else
            "greedy probe answers differ from " + ("the pin" if ref.name == "pin" else
                                                  f"the majority's {ref.name}" if how == "majority" else
                                                  f"baseline {ref.name}")
            if kind == DRIFT else f"nondeterminism on one identity: {me.name} and {ref.name} answer differently")
    notes = []
    prompt_ex = next((e for e in c["examples"] if "prompt_divergence" in e), None)
    if j:
        notes.append(f"prompt tokenization differs on {j} of them (the tokenizer or chat template differs"
                     + (f"; {_at(prompt_ex['prompt_divergence'], 'prompt', me.name, ref.name)}" if prompt_ex else "")
                     + ")")
    output_ex = next((e for e in c["examples"] if e["first_divergence"] is not None), None)
    if output_ex:
        notes.append(_at(output_ex, "output", me.name, ref.name) + f" (probe {output_ex['probe_id']})")
    diffs = _identity_diffs(me, ref)
    named = [d for d in diffs if d["field"] in ANSWER_FIELDS or _answer_key(d["field"])]
    if named:
        notes.append(f"{me.name} differs in {differs_in(named)}")
    said = (f"no baseline: {b.reason}" if symmetric else
            f"baseline: majority ({ref.name}'s identity; {b.label()})" if how == "majority" else
            f"baseline: {b.label()}")
    summary = (f"{subject}: {what} on {k} of {n} probes ({k / n:.0%}, 95% CI {low:.0%}-{high:.0%}, "
               f"round {me.round_id})" + "".join(f"; {x}" for x in notes) + f"; {said}")
    evidence = {"replica": me.name, "reference": ref.name, "model_name": b.model_name, "round_id": me.round_id,
                "reference_round": ref.round_id, "baseline": b.describe(), "probes_compared": c["compared"],
                "mismatched_probes": c["mismatched"], "prompt_mismatched_probes": c["prompt_mismatched"],
                "probes_not_comparable": c["skipped"], "compared": n, "mismatched": k, "rate": k / n,
                "rate_ci": [low, high], "identity_differences": diffs, "examples": c["examples"],
                "symmetric": symmetric, "reference_rule": how or b.rule,
                "rule": ("critical: k/n >= 0.5 and Wilson low > 20%; warning: k >= 2 and Wilson low > 2%; else info"
                         if kind == DRIFT else "warning from 2 mismatching probes, info for one; " + FP_NOTE)}
    return Finding(kind, sev, subject, summary, DIAGNOSTIC, scope, evidence)


# -- per model -----------------------------------------------------------------------------------

def _reference(rid: str, by: dict, base_side: list[str]) -> tuple[str, str] | None:
    """(reference replica, round): the latest round `rid` shares with a baseline-side replica, and
    in it the one with the most solo answers (then the lowest id)."""
    mine = set(by[rid]["solo"])
    shared = [(_round_order(r), r, b) for b in base_side if b != rid for r in mine & set(by[b]["solo"])]
    if not shared:
        return None
    latest = max(shared)[1]
    ref = min((b for _, r, b in shared if r == latest), key=lambda b: (-len(by[b]["solo"][latest]), b))
    return ref, latest


def stand_in(answering: list[str], identity: dict) -> tuple[list[str], str]:
    """Where no baseline decides: (the replicas of the reference identity, "majority" | "symmetric"). The
    most common identity is the reference; it decides (`majority`) with 3+ replicas answering and 2+ holding it,
    more than any other; else it only orders the comparison, and each finding is on the pair (`symmetric`)."""
    known = sorted(r for r in answering if r in identity)
    counts = Counter(identity_key(identity[r]) for r in known)
    if not counts:
        return [], "symmetric"
    first = {}  # identity -> its lowest replica id (ties: the lower id first)
    for r in known:
        first.setdefault(identity_key(identity[r]), r)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], first[kv[0]]))
    top, n = ranked[0]
    majority = len(known) >= 3 and n >= 2 and (len(ranked) == 1 or ranked[1][1] < n)
    return [r for r in known if identity_key(identity[r]) == top], "majority" if majority else "symmetric"


def drift(store, scope: Scope, model: str, by: dict, identity: dict, b: Baseline | None,
          source: TokenizerSource) -> list[Finding]:
    answering = sorted(r for r in by if by[r].get("solo"))
    if b is None:
        return [insufficient(DRIFT, model, DIAGNOSTIC, scope, f"no replica identity recorded for {model}'s probes",
                             replicas=answering)]
    if not answering:
        return [insufficient(DRIFT, model, DIAGNOSTIC, scope, f"no solo probe answers for {model}")]
    # (kind, replica, its round, reference replica or "pin", how the reference was chosen: see verdict)
    plans: list[tuple[str, str, str, str, str]] = []
    out: list[Finding] = []
    if b.rule == "pinned":
        for rid in answering:
            rounds = [r for r, probes in by[rid]["solo"].items() if probes.keys() & b.pins.keys()]
            if rounds:
                plans.append((DRIFT, rid, max(rounds, key=_round_order), "pin", ""))
            else:
                out.append(insufficient(DRIFT, rid, DIAGNOSTIC, scope, f"{rid} answered none of the pinned probes",
                                        baseline=b.describe()))
    else:
        if len(answering) < 2:
            return [insufficient(DRIFT, model, DIAGNOSTIC, scope,
                                 f"probes answered only by {answering[0]} (need a second replica, or a pinned round)",
                                 replicas=answering, baseline=b.describe())]
        how = ""
        base_side = [r for r in answering if r in identity and b.is_baseline(identity[r])]
        if not b.decided:
            base_side, how = stand_in(answering, identity)
        if not base_side:
            return [insufficient(DRIFT, model, DIAGNOSTIC, scope,
                                 f"no baseline-side replica ({b.label()}) answered a probe: "
                                 f"{', '.join(answering)} cannot be judged", replicas=answering,
                                 baseline=b.describe())]
        if len(base_side) == len(answering):
            out.append(insufficient(DRIFT, model, DIAGNOSTIC, scope,
                                    f"every replica answering probes ({', '.join(answering)}) has the baseline "
                                    f"identity: no candidate (they are compared with each other)",
                                    replicas=answering, baseline=b.describe()))
        pairs = set()
        for rid in answering:
            found = _reference(rid, by, base_side)
            kind = NONDETERMINISM if rid in base_side else DRIFT
            if found is None:
                if kind == DRIFT or len(base_side) > 1:
                    out.append(insufficient(kind, rid, DIAGNOSTIC, scope,
                                            f"{rid} shares no probe round with the baseline side "
                                            f"({', '.join(r for r in base_side if r != rid)})", baseline=b.describe()))
                continue
            ref, round_ = found
            if kind == NONDETERMINISM:  # each pair of baseline replicas once
                if frozenset((rid, ref)) in pairs:
                    continue
                pairs.add(frozenset((rid, ref)))
            plans.append((kind, rid, round_, ref, how if kind == DRIFT else ""))
    wanted = [a for _, rid, round_, ref, _ in plans for who in ((rid,) if ref == "pin" else (rid, ref))
              for a in by[who]["solo"][round_].values()]
    ids = token_ids(store, scope, wanted)
    agreeing = []  # (replica, reference, round, probes compared) of the comparisons that found no difference
    for kind, rid, round_, ref, how in plans:
        me = _side(rid, round_, by[rid]["solo"][round_], ids, identity.get(rid))
        other = _pin_side(b) if ref == "pin" else _side(ref, round_, by[ref]["solo"][round_], ids, identity.get(ref))
        c = compare(me, other, source)
        f = verdict(scope, kind, me, other, b, c, how)
        if f is not None:
            out.append(f)
        elif len(c["compared"]) >= MIN_PROBES:
            agreeing.append((rid, ref, round_, len(c["compared"])))
    if agreeing:  # the check ran and these agreed: say so
        pairs = "; ".join(f"{rid} = {ref} on {n} of {n} probes (round {round_})" for rid, ref, round_, n in agreeing)
        out.append(Finding(AGREE, "info", model, f"{model}: greedy probe answers agree: {pairs}", DIAGNOSTIC, scope,
                           {"model_name": model, "baseline": b.describe(),
                            "agreeing": [{"replica": rid, "reference": ref, "round_id": round_, "compared": n}
                                         for rid, ref, round_, n in agreeing]}))
    return out


def batch_variance(store, scope: Scope, model: str, by: dict, identity: dict,
                   source: TokenizerSource) -> list[Finding]:
    found: dict[str, tuple[int, list]] = {}
    for rid in sorted(by):
        solo, batched = by[rid].get("solo", {}), by[rid].get("batched", {})
        pairs, hits = 0, []
        for round_ in sorted(solo.keys() & batched.keys(), key=_round_order):
            for probe in sorted(solo[round_].keys() & batched[round_].keys()):
                s, m = solo[round_][probe], batched[round_][probe]
                if s.prompt_hash != m.prompt_hash:  # another input (the suite changed): not this question
                    continue
                pairs += 1
                if s.output_hash != m.output_hash:
                    hits.append((s, m))
        if pairs:
            found[rid] = (pairs, hits)
    if not found:
        return [insufficient(BATCH, model, DIAGNOSTIC, scope,
                             f"no probe of {model} was answered both solo and batched in one round "
                             f"(replicas with probes: {', '.join(sorted(by))})")]
    examples = [pair for _, hits in found.values() for pair in hits[:MAX_EXAMPLES]]
    ids = token_ids(store, scope, [a for pair in examples for a in pair])
    out = []
    for rid, (pairs, hits) in found.items():
        if hits:
            out.append(_batch_finding(store, scope, model, rid, pairs, hits, ids, identity.get(rid), source))
    clean = sorted(rid for rid, (_, hits) in found.items() if not hits)
    if clean:  # the check ran and found nothing: say so (silence would not tell it from not running)
        n = sum(found[rid][0] for rid in clean)
        out.append(Finding(BATCH_CLEAN, "info", model,
                           f"{model}: batch-invariant on {', '.join(clean)}: {n} of {n} solo/batched probe pairs "
                           f"identical", DIAGNOSTIC, scope,
                           {"model_name": model, "replicas": clean, "pairs_compared": n,
                            "pairs_by_replica": {rid: found[rid][0] for rid in clean}}))
    return out


def _batch_finding(store, scope, model, rid, pairs, hits, ids, row, source) -> Finding:
    probes = sorted({s.probe_id for s, _ in hits})
    rounds = sorted({s.round_id for s, _ in hits}, key=_round_order)
    sev = "warning" if len(probes) >= 2 or len(rounds) >= 2 else "info"
    tok = source.for_replica(row) if row else None
    examples = []
    for s, m in hits[:MAX_EXAMPLES]:
        if (rid, s.request_id) not in ids or (rid, m.request_id) not in ids:
            continue
        examples.append({"probe_id": s.probe_id, "round_id": s.round_id,
                         "solo_batch_size": batch_size(store, rid, s), "batched_batch_size": batch_size(store, rid, m),
                         **divergence(ids[(rid, m.request_id)][1], ids[(rid, s.request_id)][1], tok, tok,
                                      "batched", "solo")})
    first = examples[0] if examples else None
    where = ""
    if first and first["first_divergence"] is not None:
        pos = first["first_divergence"]
        where = (f"; probe {first['probe_id']}, first divergent output token {pos}: "
                 f"{_token(first['solo_tokens_at_divergence'], pos)} solo (batch of {first['solo_batch_size']}) vs "
                 f"{_token(first['batched_tokens_at_divergence'], pos)} batched "
                 f"(batch of {first['batched_batch_size']})")
    summary = (f"{rid}: the same probe answered solo and batched differs on {len(hits)} of {pairs} pairs "
               f"({len(probes)} probe(s) in {len(rounds)} round(s)){where}"
               + ("" if sev == "warning" else "; a single occurrence (see the evidence: fp32 near ties)"))
    evidence = {"replica": rid, "model_name": model, "pairs_compared": pairs, "occurrences": len(hits),
                "probes": probes, "rounds": rounds,
                "occurrence_list": [{"probe_id": s.probe_id, "round_id": s.round_id} for s, _ in hits],
                "examples": examples, "note": FP_NOTE,
                "rule": "warning when the occurrences span >= 2 probes or >= 2 rounds; one occurrence is info"}
    return Finding(BATCH, sev, rid, summary, DIAGNOSTIC, scope, evidence)


def settled(by_model: dict, end: float) -> tuple[dict, dict[str, list[str]]]:
    """The answers without the rounds still arriving (last answer finished within ROUND_SETTLE_SECONDS of `end`):
    (answers, model -> the rounds left out)."""
    left_out: dict[str, list[str]] = {}
    for model, by in by_model.items():
        last: dict[str, float] = {}
        for modes in by.values():
            for rounds in modes.values():
                for round_, probes_ in rounds.items():
                    last[round_] = max([last.get(round_, 0.0), *(a.finished for a in probes_.values())])
        fresh = sorted(r for r, t in last.items() if t > end - ROUND_SETTLE_SECONDS)
        if fresh:
            left_out[model] = fresh
            for modes in by.values():
                for rounds in modes.values():
                    for r in fresh:
                        rounds.pop(r, None)
    return by_model, left_out


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    source = TokenizerSource(dict(request.model_dirs))
    rows = replicas_in(store, scope)
    findings: list[Finding] = []
    by_model, arriving = settled(answers(store, scope), min(scope.bounds()[1], time.time()))
    for model, rounds in sorted(arriving.items()):
        findings.append(Finding("probe_round_arriving", "info", model,
                                f"{model}: probe round(s) {', '.join(rounds)} still arriving: left out until they "
                                f"settle ({ROUND_SETTLE_SECONDS:g} s after their last answer)", DIAGNOSTIC, scope,
                                {"model_name": model, "rounds": rounds}))
    for model, by in sorted(by_model.items()):
        mine = [r for r in rows if r["model_name"] == model]
        identity = {r["replica_id"]: r for r in mine}
        b = choose_baseline(store, model, mine, request)
        findings += drift(store, scope, model, by, identity, b, source)
        findings += batch_variance(store, scope, model, by, identity, source)
    return findings

