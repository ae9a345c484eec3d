"""Identity: replicas serving one model name that differ in what decides their answers are a finding
on their own, even when nothing is slower.

Per model name (replicas of different models are never compared), on the latest start of each replica
in the scope (diagnostics.scope.replicas_in):
- weights_hash differs -> `weights_mismatch` (critical): another checkpoint under the same name; the
  evidence says whether config_hash is equal (same path and options, other tensors at that path);
- tokenizer_hash -> `tokenizer_hash_mismatch` (warning), with the tokenizer files that differ;
- chat_template_hash -> `chat_template_mismatch` (warning), with the template diff (by line and Jinja
  tag, so a one-line template shows the tag that changed) and, from stored chat requests with the same
  messages (prompt_text_hash) rendered differently on the two sides, the first divergent prompt token;
- engine_version -> `engine_version_mismatch` (warning);
- config_json -> `config_mismatch` (warning): every differing key with both values, nested keys dotted
  (generation.eos_token_ids, vllm_config.cache_config.enable_prefix_caching ...). Labels and per-start
  or per-host keys (replica_id, served_model_name, ports, a proxy's upstream URL) and the GPU index of
  `device` are placement, not behaviour: skipped. What the options did in the window, where the records
  show it against the reference replicas (preemptions, a queue at max_num_seqs, CPU throttling ...:
  diagnostics.mechanisms.effects), is said beside the keys. The model / tokenizer path alone says where, not what
  (the content is in the hashes): a path-only difference is the info `model_path_differs`.
A replica whose identity changed across a restart is an `identity_changed` info finding with the time and
the keys, before and after (diagnostics.identity_events); the other diagnostics' findings on it cite it.
Versions and configs are compared only among replicas of one engine (infersight, vllm, a recording
proxy): two engines' versions and options do not compare, their hashes do. An empty value (a proxy
sees no weights) is unknown, not different.

Who is named, per field: with 3+ replicas whose value is known and one most common value held by 2+, every
replica off it; otherwise (two replicas, or no plurality) each replica off the baseline's value
(diagnostics.baseline.choose_baseline: pinned > requested > role > first_served), the baseline's rule and
reason in the evidence. One finding per (replica, kind), its fields listed inside. Where no rule decides
(replicas started together, no role, no pin) the split is ONE symmetric finding on the pair ("r0 vs r1"),
both values side by side, at most a warning: no side is blamed.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from pathlib import Path

from diagnostics import config_keys, identity_events, mechanisms
from diagnostics.baseline import IDENTITY_FIELDS, NO_BASELINE_HINT, choose_baseline, pinned_probes
from diagnostics.findings import Finding
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in
from diagnostics.token_evidence import divergence
from diagnostics.tokenizer import file_differences
from engine.core.tokenization import hash_tokenizer_files
from engine.core.model_files import SECTION as MODEL_FILES
from engine.core.model_files import hash_column
from telemetry.contract.derived import window_sql

DIAGNOSTIC = "identity"
# field -> (kind, severity, what a person calls it)
HASHES = {"weights_hash": ("weights_mismatch", "critical", "other weights"),
          "tokenizer_hash": ("tokenizer_hash_mismatch", "warning", "another tokenizer"),
          "chat_template_hash": ("chat_template_mismatch", "warning", "another chat template")}
MAX_VALUE_CHARS = 500
MAX_EXAMPLES = 3

_RENDERED = f"""
SELECT count() AS compared, countIf(differs) AS differing,
       groupArrayIf({MAX_EXAMPLES})((prompt_text_hash, ref_replica, mine, theirs), differs) AS examples
FROM (
    SELECT prompt_text_hash,
           argMaxIf(prompt_token_ids, arrival_time, replica_id = {{replica:String}}) AS mine,
           argMaxIf(prompt_token_ids, arrival_time, replica_id != {{replica:String}}) AS theirs,
           argMaxIf(replica_id, arrival_time, replica_id != {{replica:String}}) AS ref_replica,
           argMaxIf(rendered_prompt_hash, arrival_time, replica_id = {{replica:String}})
               != argMaxIf(rendered_prompt_hash, arrival_time, replica_id != {{replica:String}}) AS differs
    FROM requests
    WHERE {window_sql('arrival_time')} AND has({{ids:Array(String)}}, replica_id)
      AND rendered_prompt_hash != '' AND prompt_text_hash != ''
    GROUP BY prompt_text_hash
    HAVING countIf(replica_id = {{replica:String}}) > 0 AND countIf(replica_id != {{replica:String}}) > 0
)
"""


# -- reading an identity row ------------------------------------------------------------------------

def _config(r: dict) -> dict:
    return config_keys.document(r.get("config_json") or "{}")


def engine_of(r: dict) -> str:
    """Which engine wrote the row: vLLM's document says so, the proxy's too; infersight's says nothing."""
    c = _config(r)
    return str(c.get("engine") or c.get("recorded_by") or "infersight")


def _hash_of(key: str) -> str | None:
    """The hash column whose own finding reports this model file's keys (None: config_mismatch reports it)."""
    if config_keys.section(key) != MODEL_FILES:
        return None
    return hash_column(key.split(".")[1])


def behaviour(r: dict, field: str = "config_json") -> dict:
    """The behaviour keys of a row (config_keys.behaviour) that `field`'s finding reports: config_mismatch
    all but the model files a hash column covers; a hash field those files' keys."""
    keys = config_keys.behaviour(r.get("config_json"))
    wanted = None if field == "config_json" else field
    return {k: v for k, v in keys.items() if _hash_of(k) == wanted}


def _canonical(d: dict) -> str | None:
    return json.dumps(d, sort_keys=True, default=str) if d else None  # {}: no config recorded, unknown


# field -> value of a row (None: unknown); the config fields compare whole documents, keys listed after
VALUES = {
    **{f: (lambda r, f=f: r.get(f) or None) for f in HASHES},
    "engine_version": lambda r: r.get("engine_version") or None,
    "config_json": lambda r: _canonical(behaviour(r)) if r.get("config_json") else None,
    "model_path": lambda r: _canonical({k: _config(r)[k] for k in config_keys.PATH_KEYS if k in _config(r)}),
}


# -- who is named -------------------------------------------------------------------------------------

class Reference:
    """The baseline of one comparison group, chosen once, asked per field."""

    def __init__(self, store, model: str, group: list[dict], request: DiagnosticRequest, pins: dict):
        self.store, self.model, self.group, self.request, self.pins = store, model, group, request, pins
        self._chosen: list = []

    def _baselines(self):
        if not self._chosen:
            first = choose_baseline(self.store, self.model, self.group, self.request, self.pins)
            self._chosen.append(first)
            if first.rule == "pinned":  # a pin may not hold every field (no config): the next rule then
                self._chosen.append(choose_baseline(self.store, self.model, self.group, self.request, {}))
        return self._chosen

    def describe_undecided(self) -> dict:
        """The baseline rule's word where it decided nothing (its reason says why and what to do)."""
        b = next((b for b in self._baselines() if not b.decided), self._baselines()[-1])
        return b.describe()

    def row_for(self, value) -> tuple[dict, dict] | None:
        for b in self._baselines():
            row = next((r for r in self.group if r["replica_id"] in b.replicas), None)
            row = row or {**dict(zip(IDENTITY_FIELDS, b.identity)), "replica_id": None}  # a pin off the window
            if value(row) is not None:
                return row, {"rule": b.rule, "reason": b.reason, "baseline": b.describe()}
        return None


def odd_ones(group: list[dict], value, reference: Reference) -> list[tuple[dict, list[dict], object, dict]]:
    """(replica, reference replicas, reference value, how it was chosen) for each replica off the reference."""
    known = [r for r in group if value(r) is not None]
    counts = Counter(value(r) for r in known)
    if len(counts) < 2:
        return []
    (top, n), (_, second) = counts.most_common(2)
    if len(known) >= 3 and n >= 2 and second < n:
        ref, how = top, {"rule": "majority", "reason": f"{n} of the {len(known)} replicas of the model hold it"}
    else:
        chosen = reference.row_for(value)
        if chosen is None:
            return []
        ref, how = value(chosen[0]), chosen[1]
    refs = [r for r in known if value(r) == ref]
    return [(r, refs, ref, how) for r in known if value(r) != ref]


def undecided(group: list[dict], value, reference: Reference) -> list[list[dict]]:
    """The sides of a split that neither a majority nor a baseline decides (one list of replicas per value,
    the largest first), [] where one of them does or nothing differs."""
    known = [r for r in group if value(r) is not None]
    counts = Counter(value(r) for r in known)
    if len(counts) < 2:
        return []
    (_, n), (_, second) = counts.most_common(2)
    if (len(known) >= 3 and n >= 2 and second < n) or reference.row_for(value) is not None:
        return []
    sides: dict = {}
    for r in sorted(known, key=lambda r: r["replica_id"]):
        sides.setdefault(value(r), []).append(r)
    return sorted(sides.values(), key=lambda side: (-len(side), side[0]["replica_id"]))


def _names(side: list[dict]) -> str:
    return ", ".join(r["replica_id"] for r in side)


def _who(refs: list[dict], how: dict) -> str:
    ids = ", ".join(r["replica_id"] for r in refs) or "the pinned probe round"
    if how["rule"] == "majority":
        return f"{len(refs)} other replica(s) ({ids})"
    return f"the baseline ({ids}; {how['rule']})"


def _short(value) -> str:
    return str(value)[:12] if value is not None else "-"


# -- evidence -------------------------------------------------------------------------------------------

def _shown(value):
    text = json.dumps(value, default=str)
    return value if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "… (truncated)"


def config_differences(mine: dict, theirs: dict) -> list[dict]:
    """Every differing key with both values, most specific first (config_keys.rank)."""
    return [{"key": k, "replica": _shown(mine.get(k)), "reference": _shown(theirs.get(k))}
            for k in sorted(set(mine) | set(theirs), key=config_keys.rank) if mine.get(k) != theirs.get(k)]


def _finest(field: str, me: dict, ref: dict | None, ev: dict, mine, theirs) -> str:
    """A hash field's difference said by the model files' keys under it where they differ (`add_bos_token
    true vs false in tokenizer_config.json`), by the hash only where nothing finer does."""
    diffs = config_differences(behaviour(me, field), behaviour(ref, field)) if ref is not None else []
    if diffs and any(not _is_digest(d["key"]) for d in diffs):
        diffs = [d for d in diffs if not _is_digest(d["key"])]  # a file's hash where its keys say more
    if diffs:
        ev["file_keys"] = diffs
        return config_keys.explain(diffs)
    return f"{field} {_short(mine)} vs {_short(theirs)}"


def _is_digest(key: str) -> bool:
    return key.endswith((".sha256", ".bytes"))


def _tokenizer_dirs(source: TokenizerSource, me: dict, ref: dict | None) -> dict:
    """The differing tokenizer files, where both directories here still hold what each replica recorded."""
    dirs = (source.directory(me), source.directory(ref) if ref else None)
    if not all(d and Path(d).is_dir() for d in dirs):
        return {"file_differences_unavailable": "model directories not on this host (--model-dir NAME=DIR)"}
    for d, r in zip(dirs, (me, ref)):
        if r.get("tokenizer_hash") and hash_tokenizer_files(d) != r["tokenizer_hash"]:
            return {"file_differences_unavailable": f"{d} changed since {r['replica_id']} started"}
    return {"file_differences": file_differences(*dirs), "directories": {"replica": dirs[0], "reference": dirs[1]}}


def template_lines(text: str) -> list[str]:
    """Lines, each cut before every Jinja tag: a template written on one line still diffs by tag."""
    return [part for line in text.splitlines() for part in re.split(r"(?=\{[{%#])", line) if part]


def _template(source: TokenizerSource, r: dict):
    """(tokenizer, template text) of the replica, the text only where it is the one the replica recorded."""
    tok = source.for_replica(r)
    if tok is None or tok.chat_template_hash != r.get("chat_template_hash"):
        return tok, None
    return tok, tok.chat_template


def rendered_divergence(store, scope: Scope, me: dict, refs: list[dict], source: TokenizerSource) -> dict:
    """The same chat messages on both sides, rendered differently: where their prompt tokens first differ."""
    params = {**scope.parameters(), "replica": me["replica_id"],
              "ids": [me["replica_id"], *(r["replica_id"] for r in refs)]}
    row = store.query_arrow(_RENDERED, params).to_pylist()[0]
    by_id = {r["replica_id"]: r for r in refs}
    examples = []
    for e in row["examples"]:
        text_hash, ref_id, mine, theirs = e.values() if isinstance(e, dict) else e
        d = divergence(mine, theirs, source.for_replica(me), source.for_replica(by_id[ref_id]), "replica", "reference")
        examples.append({"prompt_text_hash": text_hash, "reference_replica": ref_id, **d})
    return {"chats_compared": row["compared"], "chats_rendered_differently": row["differing"], "examples": examples}


def _first_token(ex: dict) -> str:
    pos = ex["first_divergence"]
    sides = []
    for side in ("replica", "reference"):
        at = next((t for t in ex.get(f"{side}_tokens_at_divergence", []) if t["position"] == pos), None)
        sides.append("end" if at is None else f"{at['id']}" + (f" {at['text']!r}" if "text" in at else ""))
    return f"the same messages first render differently at token {pos}: {sides[0]} vs {sides[1]}"


# -- the rules -------------------------------------------------------------------------------------------

def _reference(refs: list[dict], how: dict) -> dict:
    """Who the replica is compared with and why; under a baseline rule, the baseline as it describes itself."""
    out = {"reference_replicas": [r["replica_id"] for r in refs],
           "reference": {"rule": how["rule"], "reason": how["reason"]}}
    return {**out, "baseline": how["baseline"]} if "baseline" in how else out


def _evidence(model: str, field: str, group: list[dict], me: dict, refs: list[dict], ref_value, how: dict) -> dict:
    value = VALUES[field]
    return {"model_name": model, "field": field, "replica": me["replica_id"], "value": value(me),
            "reference_value": ref_value, "fleet": {r["replica_id"]: value(r) for r in group},
            **_reference(refs, how)}


def hash_findings(store, scope, model, group, reference, source) -> list[Finding]:
    findings = []
    for field, (kind, severity, what) in HASHES.items():
        for me, refs, ref_value, how in odd_ones(group, VALUES[field], reference):
            ev = _evidence(model, field, group, me, refs, ref_value, how)
            ref = refs[0] if refs else None
            summary = (f"{me['replica_id']} serves {model} with {what} than {_who(refs, how)}: "
                       + _finest(field, me, ref, ev, me[field], ref_value))
            if field == "weights_hash":
                same = ref is not None and ref["config_hash"] == me["config_hash"]
                ev.update(config_hash={"replica": me["config_hash"], "reference": ref and ref["config_hash"]},
                          config_hash_equal=same)
                summary += (" under the same config hash: same path and options, other tensors" if same else "")
                summary += " (a different checkpoint under the same name)"
            elif ref is not None:
                ev.update(_tokenizer_dirs(source, me, ref))
            if field == "chat_template_hash":
                summary += _template_evidence(store, scope, me, refs, source, ev)
            findings.append(Finding(kind, severity, me["replica_id"], summary, DIAGNOSTIC, scope, ev))
    return findings


def _template_evidence(store, scope, me, refs, source, ev) -> str:
    mine = _template(source, me)[1]
    theirs = _template(source, refs[0])[1] if refs else None
    if mine is not None and theirs is not None:
        ev["template_diff"] = list(difflib.unified_diff(template_lines(theirs), template_lines(mine), "reference",
                                                        me["replica_id"], lineterm=""))
    else:
        ev["template_diff_unavailable"] = "the templates the replicas recorded are not on this host (--model-dir)"
    ev["rendered"] = rendered_divergence(store, scope, me, refs, source) if refs else {"examples": []}
    shown = [e for e in ev["rendered"]["examples"] if e["first_divergence"] is not None]
    return f"; {_first_token(shown[0])}" if shown else ""


def engine_findings(scope, model, group, reference) -> list[Finding]:
    findings = []
    for me, refs, ref_value, how in odd_ones(group, VALUES["engine_version"], reference):
        ev = _evidence(model, "engine_version", group, me, refs, ref_value, how)
        summary = (f"{me['replica_id']} serves {model} with {engine_of(me)} {me['engine_version']}, "
                   f"{_who(refs, how)} with {ref_value}")
        findings.append(Finding("engine_version_mismatch", "warning", me["replica_id"], summary, DIAGNOSTIC, scope, ev))
    for me, refs, _, how in odd_ones(group, VALUES["config_json"], reference):
        theirs = behaviour(refs[0]) if refs else {}
        diffs = config_differences(behaviour(me), theirs)
        # whole documents are not shown: the differing keys say it
        ev = {"model_name": model, "field": "config_json", "replica": me["replica_id"], **_reference(refs, how),
              "differences": diffs, "keys": [d["key"] for d in diffs],
              "config_hash": {"replica": me["config_hash"], "reference": refs[0]["config_hash"] if refs else None}}
        summary = (f"{me['replica_id']} serves {model} with other options than {_who(refs, how)}: "
                   + (config_keys.explain(diffs) or "config hash " f"{_short(me['config_hash'])} vs "
                      f"{_short(refs[0]['config_hash'] if refs else None)}"))
        findings.append(Finding("config_mismatch", "warning", me["replica_id"], summary, DIAGNOSTIC, scope, ev))
    for me, refs, ref_value, how in odd_ones(group, VALUES["model_path"], reference):
        ev = _evidence(model, "model_path", group, me, refs, ref_value, how)
        paths = ", ".join(f"{k} {v}" for k, v in json.loads(VALUES["model_path"](me)).items())
        summary = (f"{me['replica_id']} loads {model} from another path ({paths}) than {_who(refs, how)}: "
                   f"whether the content differs is the hashes' to say")
        findings.append(Finding("model_path_differs", "info", me["replica_id"], summary, DIAGNOSTIC, scope, ev))
    return findings


def symmetric_findings(scope, model, group, reference, fields) -> list[Finding]:
    """One finding per field whose split no rule decides: the sides and their values (config: the keys)."""
    findings = []
    for field in fields:
        sides = undecided(group, VALUES[field], reference)
        if not sides:
            continue
        kind, what = ((HASHES[field][0], HASHES[field][2]) if field in HASHES else
                      ("config_mismatch", "other options") if field == "config_json" else
                      ("engine_version_mismatch", "another engine version"))
        first = sides[0][0]
        subject = " vs ".join(_names(side) for side in sides)
        ev = {"model_name": model, "field": field, "symmetric": True,
              "sides": [{"replicas": [r["replica_id"] for r in side], "value": VALUES[field](side[0])
                         if field != "config_json" else None} for side in sides],
              "baseline": reference.describe_undecided()}
        other = sides[1][0]
        if field == "config_json":
            diffs = config_differences(behaviour(first), behaviour(other))
            ev.update(differences=[{"key": d["key"], first["replica_id"]: d["replica"],
                                    other["replica_id"]: d["reference"]} for d in diffs],
                      keys=[d["key"] for d in diffs])
            detail = config_keys.explain(diffs) or f"config_hash {_short(first['config_hash'])} vs " \
                                                   f"{_short(other['config_hash'])}"
        else:
            detail = _finest(field, first, other, ev, VALUES[field](first), VALUES[field](other))
        summary = (f"{' and '.join(_names(side) for side in sides)} serve {model} with {what} ({detail}); "
                   f"no baseline: {NO_BASELINE_HINT}")
        findings.append(Finding(kind, "warning", subject, summary, DIAGNOSTIC, scope, ev))
    return findings


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    source = TokenizerSource(dict(request.model_dirs))
    by_model: dict[str, list[dict]] = {}
    for r in replicas_in(store, scope):
        by_model.setdefault(r["model_name"], []).append(r)
    findings: list[Finding] = identity_events.findings(scope, identity_events.events(store, scope))
    for model, group in by_model.items():
        if len(group) < 2:
            continue
        before = len(findings)
        pins = pinned_probes(store, model)
        reference = Reference(store, model, group, request, pins)
        findings += hash_findings(store, scope, model, group, reference, source)
        findings += symmetric_findings(scope, model, group, reference, HASHES)
        by_engine: dict[str, list[dict]] = {}
        for r in group:
            by_engine.setdefault(engine_of(r), []).append(r)
        for same_engine in by_engine.values():
            if len(same_engine) > 1:
                reference = Reference(store, model, same_engine, request, pins)
                findings += [mechanisms.effects(store, scope, f, {r["replica_id"]: r for r in same_engine})
                             if f.kind == "config_mismatch" else f
                             for f in engine_findings(scope, model, same_engine, reference)]
                findings += symmetric_findings(scope, model, same_engine, reference, ("engine_version", "config_json"))
        if len(findings) == before:  # the check ran and found nothing: say so
            ids = sorted(r["replica_id"] for r in group)
            findings.append(Finding("identity_consistent", "info", model,
                                    f"{model}: {', '.join(ids)} share one identity (weights, tokenizer, chat "
                                    f"template, engine version, config keys)", DIAGNOSTIC, scope,
                                    {"model_name": model, "replicas": ids,
                                     "fields": [*HASHES, "engine_version", "config_json"]}))
    return findings
