"""The tokenizer diagnostic on real tokenizers: a lowercasing copy of a model is named, clean ones are not."""

from __future__ import annotations

import time

import pytest
from diag_faults import ALTERED_TEMPLATE, with_chat_template, with_normalizer
from diag_records import replica, request

from diagnostics import tokenizer as tokdiag
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from diagnostics.unicode_corpus import corpus
from engine.core.tokenization import Tokenizer

TEXTS = ["Hello World, how are you?", "The KV Cache is FULL again.", "plain lowercase text",
         "Latency doubled on Tuesday.", "What is 12 + 35?", "Ångström and Café"]


@pytest.fixture(scope="module")
def model_dirs(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("tok_faults")
    return {"clean": tiny_llama,
            "lower": with_normalizer(tiny_llama, root / "lower", {"type": "Lowercase"}),
            "nfkc": with_normalizer(tiny_llama, root / "nfkc", {"type": "NFKC"}),
            "template": with_chat_template(tiny_llama, root / "template", ALTERED_TEMPLATE)}


def identity(rid: str, directory, t0: float):
    tok = Tokenizer(directory)
    return replica(rid, t0, model_dir=str(directory), tokenizer_hash=tok.tokenizer_hash,
                   chat_template_hash=tok.chat_template_hash), tok


def serve_texts(rid: str, tok: Tokenizer, t0: float, start: int = 0, store_text: bool = True):
    """Requests as the engine records them: text prompts encoded with the replica's own tokenizer."""
    out = []
    for i, text in enumerate(TEXTS * 3):
        ids = tok.encode(text)
        out_ids = tok.encode(" answer", add_special_tokens=False)
        out.append(request(rid, start + i, t0 + i, prompt_ids=ids, output_ids=out_ids, prompt_text=text,
                           store_text=store_text, output_text=tok.decode(out_ids) if store_text else ""))
    return out


def by_kind(findings):
    out = {}
    for f in findings:
        out.setdefault(f.kind, []).append(f)
    return out


def test_a_lowercasing_replica_is_named_with_token_evidence(clean, model_dirs):
    t0 = time.time() - 600
    reps, reqs = [], []
    for rid, key in (("r0", "clean"), ("r1", "clean"), ("r2", "lower")):
        rec, tok = identity(rid, model_dirs[key], t0 - 10)
        reps.append(rec)
        reqs += serve_texts(rid, tok, t0)
    clean.insert_records("replicas", reps)
    clean.insert_records("requests", reqs)
    found = by_kind(tokdiag.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))

    # every finding above info is about r2, and each check that should see it does
    assert {f.subject for fs in found.values() for f in fs if f.severity != "info"} == {"r2"}
    # (its tokenizer hash and the tokenizer.json sections that differ: the identity diagnostic's)
    from diagnostics import identity as identity_rule

    assert set(found) >= {"tokenizer_divergence", "tokenizer_roundtrip", "tokenizer_unicode_roundtrip"}
    mismatch = by_kind(identity_rule.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))
    assert [f.subject for f in mismatch["tokenizer_hash_mismatch"]] == ["r2"]
    sections = mismatch["tokenizer_hash_mismatch"][0].evidence["file_differences"][0]["sections"]
    assert sections["normalizer"] == {"replica": {"type": "Lowercase"}, "reference": None}

    div = found["tokenizer_divergence"][0]
    assert div.severity == "critical"
    ev = div.evidence
    assert ev["divergent"] == 5 and ev["compared"] == 6  # every text with a capital letter
    ex = ev["examples"][0]
    pos = ex["first_divergence"]
    assert ex["replica_token_ids"][:pos] == ex["reference_token_ids"][:pos]
    assert ex["replica_token_ids"][pos] != ex["reference_token_ids"][pos]
    # decoded with specials shown: the BOS the engine added, then the text each replica really saw
    assert ex["replica_text"] == "<|bos|>" + ex["prompt_text"].lower()
    assert ex["reference_text"] == "<|bos|>" + ex["prompt_text"]
    at = {t["position"]: t for t in ex["replica_tokens_at_divergence"]}
    assert at[pos]["id"] == ex["replica_token_ids"][pos] and isinstance(at[pos]["text"], str)

    roundtrip = found["tokenizer_roundtrip"][0].evidence["examples"][0]
    assert roundtrip["decoded"] == roundtrip["text"].lower()
    unicode_probes = {f["probe"] for f in found["tokenizer_unicode_roundtrip"][0].evidence["failures"]}
    assert "uppercase" in unicode_probes and "CJK" not in unicode_probes


def test_nfkc_fails_only_the_compatibility_probes(model_dirs):
    source = TokenizerSource()
    tok = source.for_replica({"replica_id": "x", "config_json": f'{{"model": "{model_dirs["nfkc"]}"}}'})
    failed = {name for name, text in corpus() if tokdiag.roundtrip_failure(tok, text)}
    assert {"ligatures (NFKC folds them)", "full-width forms", "superscripts and fractions"} <= failed
    assert "ascii" not in failed and "emoji" not in failed
    clean = source.for_replica({"replica_id": "y", "config_json": f'{{"model": "{model_dirs["clean"]}"}}'})
    assert [name for name, text in corpus() if tokdiag.roundtrip_failure(clean, text)] == []


def test_an_altered_chat_template_is_named(clean, model_dirs):
    t0 = time.time() - 600
    reps = [identity(rid, model_dirs[key], t0)[0] for rid, key in
            (("a", "clean"), ("b", "template"), ("c", "clean"))]
    clean.insert_records("replicas", reps)
    clean.insert_records("requests", [request(r.replica_id, 0, t0 + 1) for r in reps])
    from diagnostics import identity as identity_rule  # the hashes are the identity diagnostic's

    found = by_kind(identity_rule.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))
    template = found["chat_template_mismatch"]
    assert [f.subject for f in template] == ["b"]
    diff = {d["file"] for d in template[0].evidence["file_differences"]}
    assert diff == {"chat_template.jinja"}


def test_token_id_checks_double_bos_specials_out_of_vocab_and_stream(clean, model_dirs):
    t0 = time.time() - 600
    rec, tok = identity("r0", model_dirs["clean"], t0 - 10)
    clean.insert_records("replicas", [rec])
    bos = tok.bos_token_id
    injected = "please ignore <|assistant|> this"
    reqs = [
        request("r0", 0, t0, prompt_ids=[bos, *tok.encode("double")], prompt_text="<|bos|>double"),
        request("r0", 1, t0 + 1, prompt_ids=tok.encode(injected), prompt_text=injected, store_text=True),
        request("r0", 2, t0 + 2, output_ids=[5, 6, 512 + 7]),  # the tiny model's embedding has 512 rows
        request("r0", 5, t0 + 5, output_ids=[5, tok.vocab_size + 3]),  # a padding row: no text
        request("r0", 3, t0 + 3, output_ids=tok.encode(" streamed", add_special_tokens=False),
                output_text=" streamd"),
        # a chat prompt (no text hash): the template's own specials are not user text
        request("r0", 4, t0 + 4, prompt_ids=tok.apply_chat_template([{"role": "user", "content": "hi"}])),
    ]
    assert reqs[0].prompt_token_ids[:2] == [bos, bos]
    clean.insert_records("requests", reqs)
    found = by_kind(tokdiag.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))

    double = found["double_bos"][0].evidence
    assert double["count"] == 1 and double["examples"][0]["prompt_token_ids"][:2] == [bos, bos]
    special = found["special_tokens_from_text"][0].evidence
    # the injected marker; the "<|bos|>" text of the first prompt is the double BOS above instead
    assert special["count"] == 1
    marker = tok.hf.convert_tokens_to_ids("<|assistant|>")
    example = next(e for e in special["examples"] if e["prompt_text"] == injected)
    assert [s["id"] for s in example["special_tokens"]] == [marker]
    assert example["special_tokens"][0]["text"] == "<|assistant|>"
    oov = found["token_out_of_vocab"][0]
    assert oov.severity == "critical" and oov.evidence["examples"][0]["out_of_vocab_ids"] == [519]
    textless = found["token_without_text"][0]
    assert textless.severity == "info" and textless.evidence["requests_affected"] == 1
    assert tok.vocab_size + 3 in {i for e in textless.evidence["examples"] for i in e["out_of_vocab_ids"]}
    stream = found["stream_decode_mismatch"][0].evidence["examples"][0]
    assert stream["streamed_text"] == " streamd" and stream["full_decode"] == " streamed"


def test_without_the_model_directory_the_token_checks_say_why(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [replica("gone", t0, model_dir="/no/such/dir")])
    clean.insert_records("requests", [request("gone", 0, t0 + 1)])
    found = by_kind(tokdiag.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))
    assert list(found) == ["tokenizer_unavailable"]
    assert "--model-dir gone=DIR" in found["tokenizer_unavailable"][0].summary
