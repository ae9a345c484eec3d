"""The runner against a deployed replica: the real OpenAI-compatible server over HTTP gives the same
token ids, text and logprobs as the in-process engine."""

from __future__ import annotations

import time

import pytest

from evals.backends import HttpBackend
from evals.runner import run_suite


@pytest.fixture(scope="module")
def replica_url(engine_config):
    from engine.core.async_engine import AsyncLLM
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    engine = AsyncLLM(engine_config(max_num_seqs=8))
    served = ServedModel.from_engine(engine, created=int(time.time()))
    with BackgroundServer(build_app(served, manage_engine=True)) as server:
        yield server.url


def test_http_run_matches_the_in_process_run(replica_url, baseline_run, heldout_subset):
    subset = heldout_subset.subset(max_items=6)
    backend = HttpBackend(replica_url)
    try:
        run = run_suite(subset, backend, progress=False)
    finally:
        backend.close()
    assert run.run.endpoint == replica_url and run.run.model_name == "target"
    local = {i.item_id: i for i in baseline_run.items}
    for item in run.items:
        ref = local[item.item_id]
        assert item.input_token_ids == ref.input_token_ids
        assert item.output_token_ids == ref.output_token_ids
        assert item.output_text == ref.output_text and item.score == ref.score
        assert item.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-4)


def test_completion_and_chat_response_shapes_parse():
    chat = {"prompt_token_ids": [1, 2], "choices": [{"message": {"role": "assistant", "content": "5"},
            "token_ids": [7, 1], "finish_reason": "stop",
            "logprobs": {"content": [{"token": "5", "logprob": -0.1}, {"token": "", "logprob": -0.2}]}}]}
    g = HttpBackend.parse(chat)
    assert (g.prompt_token_ids, g.output_token_ids, g.text, g.logprobs) == ([1, 2], [7, 1], "5", [-0.1, -0.2])
    comp = {"choices": [{"text": " hi", "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}]}
    g = HttpBackend.parse(comp)
    assert (g.text, g.logprobs, g.finish_reason, g.output_token_ids) == (" hi", [-0.5], "length", [])
