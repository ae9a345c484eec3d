"""Tokenizer: the same text must become the same tokens on every replica of a model, and back.

Checks, each with the token IDs and decoded strings as evidence (tokenizer and chat-template hashes
that differ are the identity diagnostic's, diagnostics/identity.py):
- divergence: the same prompt text or chat messages (prompt_text_hash) became different prompt
  token IDs on replicas of one model, whatever the requests' sampling (the replica in the minority
  is named; with no majority, as between two replicas, the one off the baseline side of
  diagnostics.baseline; first divergence decoded; a chat whose rendered_prompt_hash differs too
  is the template's divergence; severity: divergence_severity);
- token frequencies, where identical prompts are rare: diagnostics.token_frequencies;
- round trip: decode(encode(x)) != x on stored prompt texts and on a Unicode torture corpus;
- streaming: the streamed output text != the full decode of the output token IDs;
- double BOS at the start of a prompt (client prompts; the prober's special-token probe apart);
- special-token strings in user text encoded as special tokens: in text prompts anywhere after the
  first token; in chat prompts where the chat template writes none (template_transitions);
- token IDs outside the model's vocabulary (critical), or inside it but without text in the tokenizer (info).
An outcome of the Unicode corpus or the probe's double BOS that every replica of a model shares is
the model's: one fleet-level info (diagnostics.shared_outcomes).
The SQL checks scan the scope once each, on per-request summaries of the token-ID arrays that
ClickHouse materializes at insert (hash, first IDs, largest and smallest IDs: migration 0009), and
read the arrays themselves only for the requests a check must look into (the queries:
diagnostics/tokenizer_sql.py); the checks that need a tokenizer load the replica's own (see
diagnostics.replica_tokenizers) and say so when it is not available.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from diagnostics import shared_outcomes, token_frequencies
from diagnostics.baseline import baselines_by_model
from diagnostics.findings import Finding
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from diagnostics.token_evidence import divergence, tokens
from diagnostics.tokenizer_sql import (
    DIVERGENCE,
    DIVERGENCE_COLUMNS,
    EXAMPLE_ROWS,
    OUTPUTS,
    PLAIN_FILTERS,
    PROMPTS,
    SPECIAL_SCAN,
    STORED_TEXTS,
    TEXT_PROMPTS,
    TOKEN_COUNTS,
    WINDOW_FILTERS,
)
from diagnostics.unicode_corpus import corpus
from engine.core.tokenization import Tokenizer
from evals.stats import first_divergence
from telemetry.contract.probes import ACTIVE_WORKLOADS

DIAGNOSTIC = "tokenizer"
MAX_EXAMPLES = 3
TEXT_SAMPLE_ROWS = 200_000  # text prompts whose token IDs are hashed / scanned for specials, at most
ROUNDTRIP_SAMPLE = 200  # stored prompts re-tokenized per replica
STREAM_SAMPLE = 300  # outputs re-decoded per replica
# same text, different IDs: the severity rule (divergence_severity)
MIN_TEXTS = 2
CRITICAL_TEXTS = 3
CRITICAL_RATE = 0.1


# -- identity -------------------------------------------------------------------------------------

def _file_hashes(directory: str) -> dict[str, str]:
    from engine.core.tokenization import TOKENIZER_FILES

    out = {}
    for name in TOKENIZER_FILES:
        p = Path(directory) / name
        if p.is_file():
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return out


def _json_sections(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def file_differences(dir_a: str, dir_b: str) -> list[dict]:
    """Tokenizer files that differ between two model directories, and for tokenizer.json the
    sections that differ (normalizer, pre_tokenizer, ...), shown when small."""
    a, b = _file_hashes(dir_a), _file_hashes(dir_b)
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) == b.get(name):
            continue
        entry = {"file": name, "replica_sha256": a.get(name), "reference_sha256": b.get(name)}
        if name in ("tokenizer.json", "tokenizer_config.json"):
            ja, jb = _json_sections(Path(dir_a) / name), _json_sections(Path(dir_b) / name)
            sections = {}
            for key in sorted(set(ja) | set(jb)):
                if ja.get(key) != jb.get(key):
                    va, vb = json.dumps(ja.get(key)), json.dumps(jb.get(key))
                    sections[key] = ({"replica": ja.get(key), "reference": jb.get(key)}
                                     if len(va) + len(vb) < 4000 else "differs (too large to show)")
            entry["sections"] = sections
        out.append(entry)
    return out


# -- same text, different IDs ---------------------------------------------------------------------

def _pairs(row) -> tuple:
    return tuple(row.values()) if isinstance(row, dict) else tuple(row)


def text_sample_permille(store, scope: Scope) -> int:
    """Per mille of prompt texts the array-scanning checks read: all of them up to TEXT_SAMPLE_ROWS
    text prompts, else a sample chosen by the text's hash (so every replica's copy of a text is in or out)."""
    n = store.query_arrow(TEXT_PROMPTS.replace("{filters}", WINDOW_FILTERS), scope.parameters()).to_pylist()[0]["n"]
    return 1000 if n <= TEXT_SAMPLE_ROWS else max(1, -(-1000 * TEXT_SAMPLE_ROWS // n))


def divergence_severity(divergent: int, compared: int) -> str:
    """critical: CRITICAL_TEXTS texts or more and at least CRITICAL_RATE of those compared; warning:
    MIN_TEXTS or more; info below (one text alone may be one odd record, not a tokenizer)."""
    if divergent >= CRITICAL_TEXTS and divergent >= CRITICAL_RATE * compared:
        return "critical"
    return "warning" if divergent >= MIN_TEXTS else "info"


def _examples(store, rid: str, examples: list[tuple], toks: dict) -> list[dict]:
    """Each (text hash, reference replica, rule) with both token-ID sequences and where they part."""
    fetched = store.query_arrow(PROMPTS, {"hashes": [e[0] for e in examples],
                                           "replicas": sorted({rid, *(e[1] for e in examples)})}).to_pylist()
    by_key = {(f["replica_id"], f["prompt_text_hash"]): f for f in fetched}
    shown = []
    for text_hash, ref, rule in examples:
        mine, theirs = by_key.get((rid, text_hash)), by_key.get((ref, text_hash))
        if not mine or not theirs:
            continue
        d = divergence(mine["ids"], theirs["ids"], toks.get(rid), toks.get(ref), "replica", "reference")
        template = bool(mine["rendered"] and theirs["rendered"] and mine["rendered"] != theirs["rendered"])
        shown.append({"prompt_text_hash": text_hash, "reference_replica": ref, "reference_rule": rule,
                      "prompt_text": mine["text"] or theirs["text"] or None,
                      "cause": "chat template" if template else "tokenizer",
                      "rendered_prompt_hashes": {"replica": mine["rendered"], "reference": theirs["rendered"]},
                      "first_divergent_token": _first_token(d, toks.get(rid), toks.get(ref)), **d})
    return shown


def _first_token(d: dict, mine, theirs) -> dict | None:
    pos = d["first_divergence"]
    if pos is None:
        return None
    out = {"position": pos}
    for side, tok in (("replica", mine), ("reference", theirs or mine)):
        ids = d[f"{side}_token_ids"]
        out[f"{side}_id"] = ids[pos] if pos < len(ids) else None  # None: this side ended there
        out[f"{side}_text"] = tok.piece(ids[pos]) if tok is not None and pos < len(ids) else None
    return out


def same_text_different_ids(store, scope: Scope, replicas: list[dict], toks: dict,
                            permille: int = 1000, baselines: dict | None = None) -> list[Finding]:
    """The same prompt text (or chat messages) with other token IDs than the reference's: see
    tokenizer_sql.DIVERGENCE for the reference and divergence_severity for the severity."""
    baselines = baselines or {}
    side = sorted({r for b in baselines.values() if b for r in b.replicas})
    rows = store.query_arrow(DIVERGENCE.replace("{source}", requests_in(DIVERGENCE_COLUMNS, scope=scope)),
        {**scope.parameters(), "permille": permille, "baseline": side}).to_pylist()
    identity = {r["replica_id"]: r for r in replicas}
    findings = []
    for r in rows:
        if not r["divergent"] and not r["tied"]:
            continue
        rid, n, model = r["replica_id"], r["divergent"], r["model_name"]
        examples = [_pairs(e) for e in (r["examples"] or r["tie_examples"])][:MAX_EXAMPLES]
        shown = _examples(store, rid, examples, toks)
        base = baselines.get(model)
        severity = divergence_severity(n, r["compared"])
        summary = (f"{rid}: {n} of {r['compared']} prompt texts also seen on other replicas of {model} became "
                   f"different token IDs")
        if r["by_baseline"] and base:
            summary += f" ({r['by_baseline']} against the baseline {', '.join(base.replicas)}: {base.rule})"
        if r["template_divergent"]:
            summary += (f"; for {r['template_divergent']} of them its chat template renders the same messages "
                        f"differently: the template's divergence")
        if r["tied"]:
            summary += f"; {r['tied']} more are ties no baseline side decides (the other side may be the odd one)"
        first = shown[0]["first_divergent_token"] if shown else None
        if first:
            summary += (f"; e.g. first divergence at token {first['position']}: {first['replica_id']} "
                        f"{first['replica_text']!r} vs {first['reference_id']} {first['reference_text']!r} "
                        f"(reference {shown[0]['reference_replica']})")
        evidence = {"model_name": model, "replica": rid, "compared": r["compared"], "divergent": n,
                    "by_baseline": r["by_baseline"], "template_divergent": r["template_divergent"],
                    "tied": r["tied"], "rate": n / r["compared"], "sampled_prompt_texts_per_mille": permille,
                    "tokenizer_hash": identity.get(rid, {}).get("tokenizer_hash"), "examples": shown,
                    "compared_texts": {"prompt_text_hashes": list(r["compared_texts"]), "count": r["compared"]},
                    "baseline": base.describe() if base else None,
                    "severity_rule": f"critical >= {CRITICAL_TEXTS} texts and >= {CRITICAL_RATE:.0%} of those "
                                     f"compared, warning >= {MIN_TEXTS}, info below or for ties alone",
                    "method": "prompts grouped by prompt_text_hash (a chat's: its messages) across replicas of "
                              "one model, whatever their sampling; the token IDs most replicas produced are the "
                              "reference, and where none has the most, the baseline side's"}
        # ties alone, or one text, do not alert: kinds of their own that stand for this finding's id
        kind = ("tokenizer_divergence" if severity != "info" else
                "tokenizer_divergence_tie" if not n else "tokenizer_divergence_unconfirmed")
        findings.append(Finding(kind, severity, rid, summary, DIAGNOSTIC, scope, evidence,
                                id_kind="tokenizer_divergence"))
    return findings


def tokenizer_evidence(divergences: list[Finding]) -> dict[str, str]:
    """replica -> the same-text evidence against its tokenizer (texts that became other token IDs than
    the reference's, ties alone excluded): what a token-frequency shift needs to be a tokenizer's."""
    return {f.subject: f"{f.evidence['divergent']} of {f.evidence['compared']} prompt texts became other "
                       f"token IDs ({f.kind})"
            for f in divergences if f.evidence.get("divergent")}


# -- round trips ----------------------------------------------------------------------------------

def roundtrip_failure(tok: Tokenizer, text: str) -> dict | None:
    ids = tok.encode(text, add_special_tokens=False)
    back = tok.decode(ids, skip_special_tokens=False)
    if back == text:
        return None
    at = first_divergence(text, back)
    return {"text": text, "decoded": back, "token_ids": ids, "first_differing_char": at,
            "text_at": text[at:at + 12], "decoded_at": back[at:at + 12]}


def roundtrip_stored(store, scope: Scope, toks: dict) -> list[Finding]:
    ids = sorted(r for r, t in toks.items() if t is not None)
    if not ids:
        return []
    sql = STORED_TEXTS.replace("{n}", str(ROUNDTRIP_SAMPLE)).replace("{filters}", PLAIN_FILTERS)
    rows = store.query_arrow(sql, {**scope.parameters(), "ids": ids}).to_pylist()
    findings = []
    for r in rows:
        tok = toks[r["replica_id"]]
        texts = sorted(set(r["texts"]))
        failures = [f for f in (roundtrip_failure(tok, t) for t in texts) if f]
        if not failures:
            continue
        summary = (f"{r['replica_id']}: decode(encode(x)) != x for {len(failures)} of {len(texts)} stored prompts; "
                   f"e.g. {failures[0]['text_at']!r} came back as {failures[0]['decoded_at']!r}")
        findings.append(Finding("tokenizer_roundtrip", "warning", r["replica_id"], summary, DIAGNOSTIC, scope,
                                {"replica": r["replica_id"], "checked": len(texts), "failed": len(failures),
                                 "tokenizer_dir": tok.directory, "examples": failures[:MAX_EXAMPLES]}))
    return findings


def roundtrip_corpus(toks: dict, scope: Scope) -> list[Finding]:
    findings = []
    results: dict[str, list] = {}  # per tokenizer directory, computed once
    for rid in sorted(toks):
        tok = toks[rid]
        if tok is None:
            continue
        if tok.directory not in results:
            results[tok.directory] = [dict(probe=name, **f) for name, text in corpus()
                                      if (f := roundtrip_failure(tok, text))]
        failures = results[tok.directory]
        if not failures:
            continue
        probes = ", ".join(f["probe"] for f in failures[:4])
        summary = (f"{rid}: its tokenizer changes {len(failures)} of {len(corpus())} Unicode probe strings on a round "
                   f"trip ({probes}{', ...' if len(failures) > 4 else ''})")
        findings.append(Finding("tokenizer_unicode_roundtrip", "warning", rid, summary, DIAGNOSTIC, scope,
                                {"replica": rid, "tokenizer_dir": tok.directory, "tokenizer_hash": tok.tokenizer_hash,
                                 "probes": len(corpus()), "failed": len(failures), "failures": failures}))
    return findings


# -- streamed text vs full decode -----------------------------------------------------------------

def expected_stream_text(tok: Tokenizer, ids: list[int], params: dict, finish_reason: str,
                         streamed: str) -> tuple[str, bool]:
    """The full decode the stream should equal, and whether a stop string may have cut it short."""
    stop_ids = set(params.get("stop_token_ids") or [])
    if finish_reason == "stop" and ids and ids[-1] in stop_ids:
        ids = ids[:-1]  # a user stop token is not part of the text
    full = tok.decode(ids, skip_special_tokens=True)
    return full, bool(params.get("stop")) and finish_reason == "stop"


def streamed_vs_full(store, scope: Scope, toks: dict) -> list[Finding]:
    ids = sorted(r for r, t in toks.items() if t is not None)
    if not ids:
        return []
    sql = OUTPUTS.replace("{n}", str(STREAM_SAMPLE)).replace("{filters}", PLAIN_FILTERS)
    findings = []
    for r in store.query_arrow(sql, {**scope.parameters(), "ids": ids}).to_pylist():
        tok = toks[r["replica_id"]]
        bad = []
        for out in r["outputs"]:
            out_ids, streamed, params_json, reason = _pairs(out)
            try:
                params = json.loads(params_json or "{}")
            except json.JSONDecodeError:
                params = {}
            full, may_be_cut = expected_stream_text(tok, list(out_ids), params, reason, streamed)
            if streamed == full or (may_be_cut and full.startswith(streamed)):
                continue
            at = first_divergence(streamed, full)
            bad.append({"output_token_ids": list(out_ids), "streamed_text": streamed, "full_decode": full,
                        "first_differing_char": at, "streamed_at": streamed[at:at + 16], "full_at": full[at:at + 16]})
        if bad:
            summary = (f"{r['replica_id']}: streamed text differs from the full decode of the output tokens in "
                       f"{len(bad)} of {len(r['outputs'])} outputs; e.g. at char {bad[0]['first_differing_char']}: "
                       f"{bad[0]['streamed_at']!r} vs {bad[0]['full_at']!r}")
            findings.append(Finding("stream_decode_mismatch", "warning", r["replica_id"], summary, DIAGNOSTIC, scope,
                                    {"replica": r["replica_id"], "checked": len(r["outputs"]), "mismatched": len(bad),
                                     "examples": bad[:MAX_EXAMPLES]}))
    return findings


# -- token-ID checks in SQL (double BOS, specials from text, out of vocabulary) -------------------

def id_runs(ids) -> tuple[list[int], list[int]]:
    """Sorted IDs as runs of consecutive ones: (starts, ends), both inclusive ([1, 2, 3, 7] -> [1, 7], [3, 7])."""
    starts, ends = [], []
    for x in sorted(set(ids)):
        if ends and x == ends[-1] + 1:
            ends[-1] = x
        else:
            starts.append(x)
            ends.append(x)
    return starts, ends


BOUNDARY = 0xFFFFFFFF  # a chat prompt's start and end, in its special-token transitions
# the roles every chat template knows; a role a template has no special marker for (the tiny one's
# "tool") would make its messages look like bare end markers, and hide typed ones
PROBE_ROLES = ("system", "user", "assistant")
_TRANSITIONS: dict[tuple, tuple[int, ...]] = {}


def template_transitions(tok: Tokenizer) -> tuple[int, ...]:
    """The special-token transitions the chat template itself writes, as (a << 32) + b for each
    adjacent pair of special tokens in a rendered prompt (BOUNDARY for its start and end).

    Learned by rendering every role order of one to three messages with plain content, with and
    without the generation prompt (orders a template refuses are skipped). A chat prompt holding
    another transition has special tokens its template did not write: they came from a message's
    text (a "<|eos|>" typed into a message puts an end marker where the template has content).
    What this cannot see: text that forges a whole turn (an end marker, then a role marker) makes
    only transitions the template makes itself, and the messages are not stored to tell them apart.
    () without a chat template."""
    key = (tok.directory, tok.tokenizer_hash)
    if key not in _TRANSITIONS:
        specials, seen = set(tok.special_ids), set()
        for n in (1, 2, 3):
            for roles in itertools.product(PROBE_ROLES, repeat=n) if tok.chat_template else ():
                for generate in (True, False):
                    try:
                        ids = tok.apply_chat_template([{"role": r, "content": "x"} for r in roles], generate)
                    except ValueError:
                        continue
                    seq = [BOUNDARY, *(i for i in ids if i in specials), BOUNDARY]
                    seen.update((a << 32) + b for a, b in zip(seq, seq[1:]))
        _TRANSITIONS[key] = tuple(sorted(seen))
    return _TRANSITIONS[key]


def unexpected_specials(ids, tok: Tokenizer) -> list[dict]:
    """The special tokens of a chat prompt at transitions its template never writes, with the transition."""
    allowed, specials = set(template_transitions(tok)), set(tok.special_ids)
    seq = [(None, BOUNDARY), *((i, int(x)) for i, x in enumerate(ids) if int(x) in specials), (None, BOUNDARY)]
    out = []
    for (pa, a), (pb, b) in zip(seq, seq[1:]):
        if (a << 32) + b in allowed:
            continue
        ends = ["start" if pa is None else tok.piece(a), "end" if pb is None else tok.piece(b)]
        out += [{"position": p, "id": x, "text": tok.piece(x), "transition": ends}
                for p, x in ((pa, a), (pb, b)) if p is not None and all(p != o["position"] for o in out)]
    return out


def _tokenizer_groups(toks: dict) -> dict[tuple, list[str]]:
    """Replicas sharing a tokenizer's numbers (bos, sizes, user-writable specials, template
    transitions): one query each."""
    groups: dict[tuple, list[str]] = {}
    for rid, tok in toks.items():
        if tok is None:
            continue
        # specials a text can only contain if the user wrote them (not those the tokenizer adds itself)
        specials = tuple(sorted(set(tok.special_ids) - set(tok.post_processor_ids)))
        key = (tok.bos_token_id if tok.bos_token_id is not None else -1, tok.vocab_size, tok.model_vocab_size, specials,
               tuple(tok.special_ids), template_transitions(tok))
        groups.setdefault(key, []).append(rid)
    return groups


def token_id_checks(store, scope: Scope, toks: dict, identity: dict, permille: int = 1000) -> list[Finding]:
    findings = []
    filters = PLAIN_FILTERS
    for (bos, vocab, model_vocab, specials, chat_specials, transitions), ids in _tokenizer_groups(toks).items():
        starts, ends = id_runs(specials)
        params = {**scope.parameters(), "ids": sorted(ids), "bos": bos, "vocab": vocab, "model_vocab": model_vocab,
                  "specials": list(specials), "special_starts": starts, "special_ends": ends,
                  "permille": permille, "chat": int(bool(transitions)),
                  "active": list(ACTIVE_WORKLOADS),  # the probe suite types special-token strings on purpose
                  "chat_specials": list(chat_specials), "transitions": list(transitions)}
        rows = store.query_arrow(TOKEN_COUNTS.replace("{filters}", filters), params).to_pylist()
        scanned = {s["replica_id"]: s for s in
                   store.query_arrow(SPECIAL_SCAN.replace("{filters}", filters), params).to_pylist()}
        arrays = _example_arrays(store, rows)
        for r in rows:
            rid = r["replica_id"]
            r.update({"special_from_text": 0, "special_from_chat": 0, "special_examples": [], **scanned.get(rid, {})})
            for kind in ("double_bos", "double_bos_probe", "oov", "textless"):
                keys = ((rid, *_pairs(key)) for key in r[f"{kind}_keys"])
                r[f"{kind}_examples"] = [arrays[k] for k in keys if k in arrays]
            for kind in ("double_bos", "double_bos_probe"):
                r[f"{kind}_examples"] = [prompt for prompt, _ in r[f"{kind}_examples"]]
            findings += _token_findings(r, toks[rid], identity, scope, permille)
    return findings


def _example_arrays(store, rows: list[dict]) -> dict[tuple, tuple]:
    """(replica, request_id, arrival microseconds) -> (prompt IDs, output IDs) of the sampled examples' requests."""
    kinds = ("double_bos", "double_bos_probe", "oov", "textless")
    keys = {(r["replica_id"], *_pairs(k)) for r in rows for kind in kinds
            for k in r[f"{kind}_keys"]}
    if not keys:
        return {}
    fetched = store.query_arrow(EXAMPLE_ROWS, {"request_ids": sorted({k[1] for k in keys}),
                                                "replicas": sorted({k[0] for k in keys})}).to_pylist()
    return {key: (f["prompt_token_ids"], f["output_token_ids"]) for f in fetched
            if (key := (f["replica_id"], f["request_id"], f["at"])) in keys}


def _token_findings(r: dict, tok: Tokenizer, identity: dict, scope: Scope, permille: int) -> list[Finding]:
    rid = r["replica_id"]
    model = identity.get(rid, {}).get("model_name", "")
    findings = []
    # clients' prompts and the prober's apart: the prober types a BOS string on purpose (its special-token
    # probe), so what the product makes of it is the model's outcome, compared across replicas
    # (SHARED_SIGNATURES), while a double BOS in client traffic is a template or client adding its own
    for kind, count, of, who in (("double_bos", r["double_bos"], r["requests"] - r["probe_requests"], "client"),
                                 ("double_bos_probe", r["double_bos_probe"], r["probe_requests"], "probe")):
        if not count:
            continue
        examples = [{"prompt_token_ids": list(e), "tokens": tokens(list(e), tok, 0, 6)}
                    for e in r[f"{kind}_examples"]]
        why = ("a template or client adds its own BOS" if who == "client" else
               "the prober's special-token probe types a BOS string and the tokenizer parses it as BOS")
        findings.append(Finding(
            kind, "warning", rid,
            f"{rid}: {count} of {of} {who} prompts start with BOS twice "
            f"(id {tok.bos_token_id} = {tok.piece(tok.bos_token_id)!r}): {why}",
            DIAGNOSTIC, scope, {"replica": rid, "model_name": model, "bos_token_id": tok.bos_token_id,
                                "count": count, "requests": of, "source": who, "examples": examples}))
    if r["special_from_text"] or r["special_from_chat"]:
        specials = set(tok.special_ids) - set(tok.post_processor_ids)
        examples = []
        for e in r["special_examples"]:
            prompt_ids, text, chat = _pairs(e)
            found = (unexpected_specials(prompt_ids, tok) if chat else
                     [{"position": i, "id": int(x), "text": tok.piece(int(x))}
                      for i, x in enumerate(prompt_ids) if i > 0 and int(x) in specials])
            examples.append({"api": "chat" if chat else "completion", "prompt_token_ids": list(prompt_ids),
                             "prompt_text": text or None, "special_tokens": found})
        first = examples[0]["special_tokens"][0] if examples and examples[0]["special_tokens"] else {}
        sampled = f" (in a {permille / 10:g}% sample of prompts)" if permille < 1000 else ""
        which = " and ".join(p for p in (f"{r['special_from_text']} text prompts" if r["special_from_text"] else "",
                                         f"{r['special_from_chat']} chat prompts (in message text: where the chat "
                                         f"template writes no special token)" if r["special_from_chat"] else "") if p)
        findings.append(Finding(
            "special_tokens_from_text", "warning", rid,
            f"{rid}: {which}{sampled} contain special-token strings that were encoded as special tokens "
            f"(e.g. {first.get('text', '?')!r} = id {first.get('id', '?')} at position "
            f"{first.get('position', '?')}): user text can inject control tokens",
            DIAGNOSTIC, scope, {"replica": rid, "model_name": model,
                                "count": r["special_from_text"] + r["special_from_chat"],
                                "text_prompts": r["special_from_text"], "chat_prompts": r["special_from_chat"],
                                "requests": r["requests"], "sampled_prompt_texts_per_mille": permille,
                                "special_token_ids": sorted(specials), "examples": examples,
                                "chat_method": "special-token transitions the replica's chat template never "
                                               "writes (learned by rendering probe conversations); a typed "
                                               "marker that forges a whole turn is not distinguishable"}))
    if r["prompt_out_of_vocab"] or r["output_out_of_vocab"]:
        examples = [_id_example(e, lambda x: x >= tok.model_vocab_size) for e in r["oov_examples"]]
        findings.append(Finding(
            "token_out_of_vocab", "critical", rid,
            f"{rid}: token IDs outside the model's vocabulary ({tok.model_vocab_size}) in "
            f"{r['prompt_out_of_vocab']} prompts and {r['output_out_of_vocab']} outputs",
            DIAGNOSTIC, scope, {"replica": rid, "model_name": model, "vocab_size": tok.model_vocab_size,
                                "prompts": r["prompt_out_of_vocab"], "outputs": r["output_out_of_vocab"],
                                "examples": examples}))
    if r["textless"]:
        # padding rows of the embedding: a trained model never emits them, a random or broken one does
        examples = [_id_example(e, lambda x: tok.vocab_size <= x < tok.model_vocab_size)
                    for e in r["textless_examples"]]
        findings.append(Finding(
            "token_without_text", "info", rid,
            f"{rid}: {r['textless']} requests hold token IDs in the model's vocabulary ({tok.model_vocab_size}) "
            f"that the tokenizer ({tok.vocab_size} tokens) cannot decode: padding rows of the embedding, "
            f"expected only from untrained weights",
            DIAGNOSTIC, scope, {"replica": rid, "model_name": model, "tokenizer_size": tok.vocab_size,
                                "model_vocab_size": tok.model_vocab_size, "requests_affected": r["textless"],
                                "examples": examples}))
    return findings


def _id_example(row, outside) -> dict:
    prompt_ids, output_ids = (list(x) for x in _pairs(row))
    return {"prompt_token_ids": prompt_ids, "output_token_ids": output_ids,
            "out_of_vocab_ids": sorted({int(x) for x in prompt_ids + output_ids if outside(int(x))})}


# a property check's outcome, compared across a model's replicas (diagnostics.shared_outcomes): the same
# corpus strings failing is the tokenizer's; a double BOS in the prober's requests is what the product
# does with the special-token probe (a typed BOS string); one in client traffic (double_bos) is not
# folded: its clients', worth a warning where it happens
SHARED_SIGNATURES = {
    "tokenizer_unicode_roundtrip": lambda f: tuple(sorted(x["probe"] for x in f.evidence["failures"])),
    "double_bos_probe": lambda f: "parses a typed BOS",
}


# -- all of it ------------------------------------------------------------------------------------

def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    replicas = replicas_in(store, scope)
    source = TokenizerSource(dict(request.model_dirs))
    toks = {r["replica_id"]: source.for_replica(r) for r in replicas}
    identity = {r["replica_id"]: r for r in replicas}
    permille = text_sample_permille(store, scope)
    baselines = baselines_by_model(store, replicas, request)  # the side that breaks two-replica ties
    # tokenizer / chat-template hash disagreements: the identity diagnostic (diagnostics.identity)
    findings = same_text_different_ids(store, scope, replicas, toks, permille, baselines)
    findings += token_frequencies.shifts(store, scope, toks, baselines, tokenizer_evidence(findings))
    findings += roundtrip_stored(store, scope, toks)
    findings += roundtrip_corpus(toks, scope)
    findings += streamed_vs_full(store, scope, toks)
    findings += token_id_checks(store, scope, toks, identity, permille)
    checked: dict[str, list[str]] = {}
    for rid, tok in toks.items():
        if tok is not None:
            checked.setdefault(identity[rid].get("model_name", ""), []).append(rid)
    findings = shared_outcomes.fold(findings, checked, SHARED_SIGNATURES)
    for rid, why in sorted(source.problems.items()):
        findings.append(Finding("tokenizer_unavailable", "info", rid,
                                f"{rid}: token-level checks skipped: {why}", DIAGNOSTIC, scope,
                                {"replica": rid, "reason": why}))
    return findings
