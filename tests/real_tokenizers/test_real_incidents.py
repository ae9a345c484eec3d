"""Each real incident, tokenizer by tokenizer: the two directories turn the same prompts into different
IDs, and token_evidence.divergence points at the first differing position with both IDs and strings."""

from __future__ import annotations

import json

import pytest
from incidents import BY_NAME, INCIDENTS

from diagnostics.token_evidence import divergence


def prompt_ids(tok, prompt) -> list[int]:
    """As the engine encodes a prompt: a text with special tokens, a chat rendered by the template."""
    return tok.encode(prompt) if isinstance(prompt, str) else tok.apply_chat_template(prompt)


@pytest.mark.parametrize("incident", INCIDENTS, ids=lambda i: i.name)
def test_the_incident_changes_prompt_ids_where_expected(incident, incident_dirs, tokenizer_of):
    base_dir, cand_dir = incident_dirs(incident)
    base, cand = tokenizer_of(base_dir), tokenizer_of(cand_dir)
    assert base.tokenizer_hash != cand.tokenizer_hash or base.chat_template_hash != cand.chat_template_hash
    for prompt in incident.same:
        assert prompt_ids(base, prompt) == prompt_ids(cand, prompt), prompt
    for prompt, e in incident.diverging:
        d = divergence(prompt_ids(base, prompt), prompt_ids(cand, prompt), base, cand, "base", "cand")
        pos = d["first_divergence"]
        assert pos == e.position, (prompt, incident.why)
        assert d["base_token_ids"][:pos] == d["cand_token_ids"][:pos]
        assert (d["base_token_ids"][pos], d["cand_token_ids"][pos]) == (e.base_id, e.cand_id)
        # the vocabulary entries: SentencePiece's '▁' shows which side kept the space
        assert base.hf.convert_ids_to_tokens(e.base_id) == e.base_piece
        assert cand.hf.convert_ids_to_tokens(e.cand_id) == e.cand_piece
        # the evidence's strings are each side's own rendering of its token (what the dashboard shows)
        at = {side: {t["position"]: t for t in d[f"{side}_tokens_at_divergence"]} for side in ("base", "cand")}
        assert at["base"][pos] == {"position": pos, "id": e.base_id, "text": base.piece(e.base_id)}
        assert at["cand"][pos] == {"position": pos, "id": e.cand_id, "text": cand.piece(e.cand_id)}
        # what differs shows: the two tokens' strings, or (the same string split elsewhere) the decoded texts
        assert base.piece(e.base_id) != cand.piece(e.cand_id) or d["base_text"] != d["cand_text"]


def test_double_bos_is_two_bos_ids_at_the_start(incident_dirs, tokenizer_of):
    base_dir, cand_dir = incident_dirs(BY_NAME["double_bos"])
    base, cand = tokenizer_of(base_dir), tokenizer_of(cand_dir)
    rendered, _ = BY_NAME["double_bos"].diverging[0]
    assert cand.encode(rendered)[:2] == [cand.bos_token_id] * 2
    assert base.encode(rendered)[:2] == [base.bos_token_id, 733]
    assert base.encode("Hello world") == cand.encode("Hello world")[1:]  # base adds no BOS to any text


def test_legacy_false_is_the_space_after_special_tokens(incident_dirs, tokenizer_of):
    base, cand = (tokenizer_of(d) for d in incident_dirs(BY_NAME["legacy_false"]))
    # a special token followed by a word: the word's '▁' goes with legacy=False
    assert base.hf.convert_ids_to_tokens(base.encode("Hello</s>world", add_special_tokens=False)) == [
        "▁Hello", "</s>", "▁world"]
    assert cand.hf.convert_ids_to_tokens(cand.encode("Hello</s>world", add_special_tokens=False)) == [
        "▁Hello", "</s>", "world"]
    assert base.encode("Hello world") == cand.encode("Hello world")  # no special token, no difference


def test_legacy_false_reexported_is_the_same_incident(incident_dirs, tokenizer_of, tmp_path):
    """The flag alone (transformers 5 rebuilds the pre-tokenizer from it) and a re-export with it
    (tokenizer.json then says prepend_scheme "first") tokenize alike."""
    from real_models import convert_sentencepiece

    from engine.core.tokenization import Tokenizer

    _, cand = (tokenizer_of(d) for d in incident_dirs(BY_NAME["legacy_false"]))
    convert_sentencepiece(tmp_path, legacy=False)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["pre_tokenizer"]["prepend_scheme"] == "first"
    reexported = Tokenizer(tmp_path)
    for prompt, _ in BY_NAME["legacy_false"].diverging:
        assert prompt_ids(reexported, prompt) == prompt_ids(cand, prompt)


def test_the_evidence_strings_show_the_lost_space(incident_dirs, tokenizer_of):
    base, cand = (tokenizer_of(d) for d in incident_dirs(BY_NAME["legacy_false"]))
    _, e = BY_NAME["legacy_false"].diverging[0]
    # engine.core.tokenization.Tokenizer.piece decodes a token after an anchor: alone, SentencePiece's
    # decoder would strip the leading space and both would read '['
    assert (base.piece(e.base_id), cand.piece(e.cand_id)) == (" [", "[")


def test_ignore_merges_is_a_no_op_on_tekken(incident_dirs, tokenizer_of):
    """Every Tekken token is reachable through the merges MistralConverter derives (every split into two
    tokens, in rank order), so whole-word lookup never changes a token: each token's own text (the
    only input where the lookup could apply) encodes alike. Only the tokenizer's hash tells them apart."""
    base, cand = (tokenizer_of(d) for d in incident_dirs(BY_NAME["ignore_merges_false"]))
    assert base.hf.backend_tokenizer.model.ignore_merges and not cand.hf.backend_tokenizer.model.ignore_merges
    texts = [t for t in (base.decode([i]) for i in range(1000, base.vocab_size)) if "\ufffd" not in t]
    a = base.hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    b = cand.hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    assert len(texts) > 0.9 * (base.vocab_size - 1000) and [x.ids for x in a] == [x.ids for x in b]
