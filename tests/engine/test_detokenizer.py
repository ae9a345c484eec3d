"""Incremental detokenization: streamed pieces concatenate to the full decode, stop strings cut."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.tokenization import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer(tiny_llama, cache_size=0)


def stream(tok, ids, stop=None, chunk=1):
    """Feed ids `chunk` at a time; return (pieces streamed, detokenizer)."""
    d = IncrementalDetokenizer(tok.decode, stop)
    pieces = []
    for i in range(0, len(ids), chunk):
        d.add_tokens(ids[i:i + chunk])
        pieces.append(d.take_new_text(final=False))
        if d.stopped_by:
            break
    d.finish()
    pieces.append(d.take_new_text(final=True))
    return pieces, d


def test_multibyte_characters_split_across_tokens_are_held_back(tok):
    ids = tok.encode("🚀日本", add_special_tokens=False)
    assert len(ids) > 2  # byte-level pieces of multi-byte characters
    pieces, d = stream(tok, ids)
    assert "".join(pieces) == "🚀日本"
    assert all("\ufffd" not in p for p in pieces)


settings_ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings_
@given(text=st.text(max_size=40), chunk=st.integers(1, 3))
def test_pieces_concatenate_to_the_full_decode_for_any_unicode(tok, text, chunk):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, d = stream(tok, ids, chunk=chunk)
    assert "".join(pieces) == d.text == tok.decode(ids)
    if "<|" not in text:  # special-token markers in the text become special tokens (skipped)
        assert d.text == text


@settings_
@given(ids=st.lists(st.integers(0, 511), max_size=30))
def test_pieces_concatenate_to_the_full_decode_for_any_token_ids(tok, ids):
    # random ids form invalid UTF-8 and special tokens: still exactly the full decode
    pieces, _ = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)


@settings_
@given(text=st.text(alphabet="ab c", max_size=30), stop=st.text(alphabet="ab c", min_size=1, max_size=3))
def test_stop_strings_cut_the_text_and_stream_nothing_of_them(tok, text, stop):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, d = stream(tok, ids, stop=[stop])
    expected = text[:text.find(stop)] if stop in text else text
    assert "".join(pieces) == d.text == expected
    assert (d.stopped_by == stop) == (stop in text)


def test_the_earliest_of_several_stop_strings_wins(tok):
    ids = tok.encode("The answer is 47. Done", add_special_tokens=False)
    _, d = stream(tok, ids, stop=["Done", "47"])
    assert d.text == "The answer is " and d.stopped_by == "47"
