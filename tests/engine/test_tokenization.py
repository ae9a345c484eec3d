"""The tokenizer wrapper: same tokens as transformers, identity hashes, the LRU cache and its counts."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from telemetry.contract.hooks import EngineObserver
from engine.core.tokenization import Tokenizer


class CountingObserver(EngineObserver):
    enabled = True

    def __init__(self):
        self.events = []

    def on_tokenization(self, cache_hit):
        self.events.append(cache_hit)


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer(tiny_llama)


def test_encode_decode_and_chat_template_match_transformers(tok, tiny_llama):
    hf = AutoTokenizer.from_pretrained(tiny_llama)
    text = "Unicode: café 日本語 🚀, numbers 12 + 35"
    assert tok.encode(text) == hf.encode(text)
    assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    ids = hf.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages, tokenize=False) == rendered
    assert tok.apply_chat_template(messages) == hf.encode(rendered, add_special_tokens=False)


def test_cache_counts_hits_and_misses_and_reports_them(tiny_llama):
    observer = CountingObserver()
    tok = Tokenizer(tiny_llama, cache_size=2, observer=observer)
    first = tok.encode("alpha")
    first.append(-1)  # callers get their own list; the cache is not corrupted
    assert tok.encode("alpha")[-1] != -1
    tok.encode("beta")
    tok.encode("gamma")  # evicts "alpha" (least recently used)
    tok.encode("alpha")
    assert observer.events == [False, True, False, False, False]
    assert tok.cache_info() == {"hits": 1, "misses": 4, "size": 2, "capacity": 2}


def test_identity_hashes_change_with_the_files_and_the_template(tiny_llama, tmp_path):
    a = Tokenizer(tiny_llama)
    assert len(a.tokenizer_hash) == 64 and len(a.chat_template_hash) == 64
    assert Tokenizer(tiny_llama).tokenizer_hash == a.tokenizer_hash  # deterministic

    changed = tmp_path / "tok"
    shutil.copytree(tiny_llama, changed)
    template = (changed / "chat_template.jinja")
    template.write_text(template.read_text().replace("{{ bos_token }}", ""))
    b = Tokenizer(changed)
    assert b.chat_template_hash != a.chat_template_hash
    assert b.tokenizer_hash != a.tokenizer_hash

    config = json.loads((changed / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (changed / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer(changed).tokenizer_hash != b.tokenizer_hash


def test_bad_inputs_give_clear_errors(tmp_path, tok):
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        Tokenizer(tmp_path)
    with pytest.raises(ValueError, match="chat template"):
        tok.apply_chat_template("not a message list")


def test_bad_directories_raise_the_load_error(tmp_path):
    from engine.core.tokenization import TokenizerLoadError

    with pytest.raises(TokenizerLoadError, match=str(tmp_path)):
        Tokenizer(tmp_path)
    with pytest.raises(TokenizerLoadError):
        Tokenizer(tmp_path / "no" / "such" / "dir")


def test_pieces_render_specials_byte_level_pieces_and_unknown_ids(tok):
    text = "🚀 hi"
    ids = [tok.bos_token_id, *tok.encode(text, add_special_tokens=False)]
    pieces = tok.pieces(ids)
    assert pieces[0] == "<|bos|>" == tok.piece(tok.bos_token_id)
    assert "\ufffd" in "".join(pieces)  # the rocket's 4 bytes span several byte-level tokens
    assert tok.decode(ids, skip_special_tokens=False) == "<|bos|>" + text
    assert [tok.piece(i) for i in ids] == pieces
    assert tok.piece(tok.vocab_size) == f"<out of vocabulary: {tok.vocab_size}>"
    assert tok.piece(-1) == "<out of vocabulary: -1>"
    # unknown ids add no text to a decode (as the Rust decoder skips them), negative ones too
    plain = tok.encode("ok", add_special_tokens=False)
    assert tok.decode([*plain, tok.vocab_size + 5, -3]) == tok.decode(plain) == "ok"
    import numpy as np

    assert tok.decode(np.array(plain, dtype=np.uint32)) == "ok"


def test_vocabulary_numbers_and_specials(tok, tiny_llama):
    config = json.loads((tiny_llama / "config.json").read_text())
    assert tok.model_vocab_size == max(config["vocab_size"], tok.vocab_size)
    assert tok.bos_token_id in tok.special_ids and tok.eos_token_id in tok.special_ids
    assert tok.post_processor_ids == [tok.bos_token_id]  # the tiny tokenizer adds a BOS itself
    assert tok.directory == str(tiny_llama)
    assert tok.in_vocab(0) and not tok.in_vocab(tok.vocab_size) and not tok.in_vocab(-1)


def test_loads_tokenizer_files_only_or_a_bare_tokenizer_json(tok, tiny_llama, tmp_path):
    only = tmp_path / "only_tokenizer"
    only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_llama / name, only / name)
    a = Tokenizer(only)  # no config.json, no weights
    text = "café 🚀 <|user|>"
    assert a.encode(text) == tok.encode(text) and a.tokenizer_hash == tok.tokenizer_hash
    assert a.model_vocab_size == a.vocab_size  # no config.json: the tokenizer's own size
    b = Tokenizer(tiny_llama / "tokenizer.json")
    ids = tok.encode(text)
    assert b.decode(ids, skip_special_tokens=False) == tok.decode(ids, skip_special_tokens=False)
    assert b.pieces(ids) == tok.pieces(ids)
    assert b.tokenizer_hash and b.tokenizer_hash != tok.tokenizer_hash  # the hash of that one file
