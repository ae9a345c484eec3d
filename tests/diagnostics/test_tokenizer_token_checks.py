"""The token-ID checks read the arrays only where the summaries of migration 0009 say a check must
look: a special token after the first position is found wherever it sits in the prompt's ID range,
with the specials at the ends of the vocabulary (the tiny tokenizer's) or in runs in its middle."""

from __future__ import annotations

import time

from diag_records import request

from diagnostics import tokenizer as tokdiag
from diagnostics.scope import Scope
from engine.core.tokenization import Tokenizer
from telemetry.schema import migrate
from telemetry.store import open_store
from tests.telemetry.older_schema import insert_as_then


class MidVocabularySpecials:
    """The numbers token_id_checks reads of a tokenizer, with special IDs in two runs inside the
    vocabulary (100-101 and 250) rather than at its ends; 0 is the BOS the tokenizer adds itself."""

    directory, tokenizer_hash, chat_template = "/mid-vocabulary", "mid", None
    bos_token_id, vocab_size, model_vocab_size = 0, 500, 512
    special_ids, post_processor_ids = [0, 100, 101, 250], [0]

    def piece(self, token_id: int) -> str:
        return f"<{token_id}>"


def test_id_runs():
    assert tokdiag.id_runs([7, 1, 2, 3, 3]) == ([1, 7], [3, 7])
    assert tokdiag.id_runs([]) == ([], [])


def _prompts(store, rid: str, prompts: list[list[int]], t0: float) -> None:
    insert_as_then(store, "requests", [request(rid, i, t0 + i, prompt_ids=p, prompt_text=f"text {rid} {i}")
                                       for i, p in enumerate(prompts)])


def _specials_found(store, tok, rid: str, t0: float):
    """(the examples' prompt IDs, sorted; the count) of the replica's special_tokens_from_text, or []."""
    found = [f for f in tokdiag.token_id_checks(store, Scope(start=t0 - 60), {rid: tok}, {rid: {"model_name": "tiny"}})
             if f.kind == "special_tokens_from_text"]
    if not found:
        return []
    (finding,) = found
    return sorted(e["prompt_token_ids"] for e in finding.evidence["examples"]), finding.evidence["count"]


def test_a_special_is_found_at_either_end_of_the_prompts_id_range(clean, tiny_llama):
    t0 = time.time() - 600
    tok = Tokenizer(tiny_llama)
    bos, marker = tok.bos_token_id, tok.hf.convert_tokens_to_ids("<|assistant|>")
    assert marker not in tok.post_processor_ids and marker < 16  # the tiny tokenizer's specials: its lowest IDs
    hits = [[bos, marker], [bos, 300, marker, 400], [bos, bos, marker]]  # the only ID after the first, the lowest
    clear = [[bos, 300, 301], [bos, bos, 300], [bos], []]  # a range that spans a special holds none of them
    _prompts(clean, "r0", hits + clear, t0)
    examples, count = _specials_found(clean, tok, "r0", t0)
    assert count == 3 and examples == sorted(hits)


def test_specials_in_runs_inside_the_vocabulary_are_found_and_a_spanning_range_is_not(clean):
    t0 = time.time() - 600
    tok = MidVocabularySpecials()
    # inside the range, its only ID, its lowest, its highest (a range above the first run)
    hits = [[0, 50, 250, 400], [0, 101], [0, 100, 300], [0, 260, 250]]
    clear = [[0, 99, 102], [0, 200, 300], [0, 260, 400], [100, 7, 8]]  # around a run, between runs, at position 0
    _prompts(clean, "m0", hits + clear, t0)
    examples, count = _specials_found(clean, tok, "m0", t0)
    assert count == 4 and len(examples) == 3 and all(e in hits for e in examples)
    _prompts(clean, "m1", clear, t0)
    assert _specials_found(clean, tok, "m1", t0) == []


def test_requests_written_before_the_summaries_existed_give_the_same_findings(clean):
    t0 = time.time() - 600
    tok = MidVocabularySpecials()
    prompts = [[0, 50, 250, 400], [0, 0, 9], [0, 99, 102], [0, 600]]  # special, double BOS, clear, out of vocab
    _prompts(clean, "m0", prompts, t0)
    now = tokdiag.token_id_checks(clean, Scope(start=t0 - 60), {"m0": tok}, {"m0": {"model_name": "tiny"}})
    assert {f.kind for f in now} == {"special_tokens_from_text", "double_bos", "token_out_of_vocab"}
    with open_store(clean.path, database="tok_pre0009") as s:  # a second database, same data directory
        migrate(s, until=8)  # as a store before migration 0009
        _prompts(s, "m0", prompts, t0)
        migrate(s)  # the summaries of that part are computed when read
        old = tokdiag.token_id_checks(s, Scope(start=t0 - 60), {"m0": tok}, {"m0": {"model_name": "tiny"}})
    assert [(f.kind, f.summary, f.evidence) for f in old] == [(f.kind, f.summary, f.evidence) for f in now]
