"""`eval run`'s bar moves while the batch runs (tokens, not finished items); the gate's largest KL
positions name their tokens as text."""

from __future__ import annotations

import pytest

import evals.backends as backends
from evals.backends import EngineBackend
from evals.logit_drift import compute_drift
from evals.runner import run_suite
from evals.suite import Suite, SuiteItem


class RecordingBar:
    def __init__(self, total, enabled, items):
        self.total, self.n, self.seen = total, 0, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, k):
        self.n += k
        self.seen.append(self.n)

    def set_postfix_str(self, *a, **k):
        pass


@pytest.fixture(scope="module")
def tiny_run(tiny_llama):
    from engine.core.config import EngineConfig

    suite = Suite("tiny", "tiny.jsonl", [SuiteItem(id=f"i{k}", prompt=f"count {k} and", reference="?", max_tokens=12)
                                         for k in range(4)])
    backend = EngineBackend(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, max_model_len=256))
    bars = []

    def make(*a):
        bars.append(RecordingBar(*a))
        return bars[-1]

    original, backends._token_progress = backends._token_progress, make
    try:
        run = run_suite(suite, backend, progress=True)
    finally:
        backends._token_progress = original
        backend.close()
    return run, bars[0]


def test_progress_moves_before_the_items_finish(tiny_run):
    _, bar = tiny_run
    assert bar.total == 4 * 12 and bar.n == bar.total
    partial = [v for v in bar.seen if 0 < v < bar.total]
    assert len(set(partial)) >= 5, bar.seen  # step by step, not one jump at the end
    assert bar.seen == sorted(bar.seen)


def test_largest_kl_positions_carry_token_text(tiny_run, tiny_llama, tiny_model_factory):
    from engine.core.engine import LLMEngine
    from evals.report import _tok
    from evals.teacher_forcing import EngineScorer

    run, _ = tiny_run
    base = LLMEngine(str(tiny_llama), num_kv_blocks=64)
    cand = LLMEngine(str(tiny_model_factory("llama", seed=1)), num_kv_blocks=64)  # other weights, same vocab
    import evals.logit_drift as logit_drift

    bars = []

    def make(total, enabled):
        bars.append(RecordingBar(total, enabled, 0))
        bars[-1].close = lambda: None
        return bars[-1]

    original, logit_drift._teacher_forcing_bar = logit_drift._teacher_forcing_bar, make
    try:
        report = compute_drift([run], EngineScorer(base), EngineScorer(cand), progress=True)
    finally:
        logit_drift._teacher_forcing_bar = original
        base.close()
        cand.close()
    assert bars and bars[0].seen == [1, 2, 3, 4] and bars[0].total == 4  # the teacher-forcing phase has its bar
    assert report.worst
    for w in report.worst:
        assert w.token == base.tokenizer.piece(w.token_id)
        assert w.baseline_top_token == base.tokenizer.piece(w.baseline_top)
        assert w.candidate_top_token == base.tokenizer.piece(w.candidate_top)
    assert _tok(17, "a|b\n") == "17 'a\\|b\\n'" and _tok(17, "") == "17"
