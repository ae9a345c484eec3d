"""The runner against the in-process engine: token ids, scores, logprobs, JSON and store round trips."""

from __future__ import annotations

import math

import pytest

from evals.backends import EngineBackend
from evals.results import EvalRun
from evals.runner import run_suite, store_run, summarize
from evals.scorers import score
from evals.suite import Suite, SuiteItem


def test_items_carry_what_the_engine_saw_and_said(baseline_run, target_dir, heldout_subset):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    eos = tok.eos_token_id
    run = baseline_run
    assert [i.item_id for i in run.items] == [i.id for i in heldout_subset.items]
    for item, src in zip(run.items, heldout_subset.items):
        want = tok.apply_chat_template(src.messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert item.input_token_ids == list(want["input_ids"])
        assert item.output_token_ids[-1] == eos  # every reference answer is short: the model stops
        assert item.output_text == tok.decode(item.output_token_ids[:-1])
        assert item.score == score("exact", item.output_text, src.reference)
        assert len(item.output_logprobs) == len(item.output_token_ids)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in item.output_logprobs)
        assert item.task == src.task and item.suite == "reference_heldout"
    assert run.run.accuracy == pytest.approx(sum(i.score for i in run.items) / len(run.items))
    assert run.run.num_items == 24 and run.run.quantization == "none" and len(run.run.weights_hash) > 8
    assert "reference_heldout" in summarize(run) and "word_problem" in summarize(run)


def test_engine_outputs_match_transformers_greedy(baseline_run, target_dir):
    """The engine's greedy answers are what transformers' own model generates from the same ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals.reference.hf_generate import greedy_generate

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    hf = greedy_generate(model, tok, [i.input_token_ids for i in baseline_run.items], max_new_tokens=24)
    assert hf == [i.output_token_ids[:-1] for i in baseline_run.items]


def test_json_and_store_round_trips(baseline_run, tmp_path):
    path = baseline_run.save(tmp_path / "run.json")
    assert EvalRun.load(path) == baseline_run
    store_dir = tmp_path / "store"
    store_run(baseline_run, str(store_dir))
    from telemetry.store import open_store

    with open_store(str(store_dir)) as store:
        back = EvalRun.from_store(store, baseline_run.run_id)
        with pytest.raises(ValueError, match="no eval run"):
            EvalRun.from_store(store, "missing")
    assert back.run.run_id == baseline_run.run_id and back.run.accuracy == baseline_run.run.accuracy
    assert back.run.start_time == pytest.approx(baseline_run.run.start_time, abs=1e-5)
    by_id = {i.item_id: i for i in back.items}
    for item in baseline_run.items:
        b = by_id[item.item_id]
        assert (b.input_token_ids, b.output_token_ids, b.score, b.task) == (
            item.input_token_ids, item.output_token_ids, item.score, item.task)
        assert b.output_logprobs == pytest.approx(item.output_logprobs, rel=1e-6)  # Float32 column


def test_a_bad_item_is_recorded_and_the_run_goes_on(engine_config):
    suite = Suite("mixed", "mixed.jsonl", [
        SuiteItem(id="long", prompt="x " * 400, reference="?"),  # beyond the 256-token context
        SuiteItem(id="ok", messages=[{"role": "user", "content": "What is 2 + 3?"}], reference="5"),
    ])
    backend = EngineBackend(engine_config())
    try:
        run = run_suite(suite, backend, progress=False)
    finally:
        backend.close()
    long, ok = run.items
    assert long.score == 0.0 and long.output_text.startswith("[error]") and long.output_token_ids == []
    assert ok.output_token_ids and ok.output_text == "5" and ok.score == 1.0
