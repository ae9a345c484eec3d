"""Teacher-forced log-probs from the engine's model equal transformers' on the same tokens, batched or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evals.teacher_forcing import EngineScorer


@pytest.fixture(scope="module")
def engine(tiny_llama):
    from engine.core.engine import LLMEngine

    e = LLMEngine(str(tiny_llama), num_kv_blocks=32)
    yield e
    e.close()


def test_matches_transformers_full_vocabulary(engine, tiny_llama):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, engine.vocab_size, size=n).tolist() for n in (9, 23, 40)]
    starts = [3, 1, 30]
    # a small batch budget forces several forward batches
    got = dict(EngineScorer(engine, max_batch_tokens=40).logprobs(seqs, starts))
    assert sorted(got) == [0, 1, 2]
    for i, (seq, start) in enumerate(zip(seqs, starts)):
        with torch.no_grad():
            logits = hf(torch.tensor([seq])).logits[0].double()
        want = torch.log_softmax(logits, -1)[start - 1:len(seq) - 1].numpy()
        assert got[i].shape == (len(seq) - start, engine.vocab_size)
        np.testing.assert_allclose(got[i], want, atol=2e-4)


def test_rejects_what_it_cannot_score(engine):
    scorer = EngineScorer(engine)
    with pytest.raises(ValueError, match="start 0"):
        list(scorer.logprobs([[1, 2, 3]], [0]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        list(scorer.logprobs([[1, engine.vocab_size]], [1]))
    with pytest.raises(ValueError, match="one start per sequence"):
        list(scorer.logprobs([[1, 2]], []))
