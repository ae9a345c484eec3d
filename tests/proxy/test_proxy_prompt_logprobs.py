"""A rescore request through the proxy (teacher-forced, prompt_logprobs asked) is stored with the prompt
tokens' own logprobs, as the engine behind it stores them, so a proxied replica (vLLM) can score its peers'
requests for the continuous cross-scorer (engine/traffic/probe/rescore.py, diagnostics/rescore.py).

infersight's own server is the upstream (it writes vLLM's prompt_logprobs layout); its own row of each
request (replica `up`) is the truth the proxy's row (`px`) is held to.
"""

from __future__ import annotations

import uuid

import pytest
from proxy_support import rows

from engine.serving.proxy.capture import ResponseCapture, prompt_token_logprobs
from engine.serving.proxy.request_row import ProxiedRequest, build_records

PROMPT_IDS = [1, 45, 96, 173, 170, 299, 43, 172, 97, 278]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_rescore_request_keeps_its_prompt_logprobs(clients, upstream, proxy, store, stream):
    _, via = clients
    body = {"model": upstream.model, "prompt": PROMPT_IDS, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 0, "stream": stream}
    before = proxy.proxy.recorded
    request_id = uuid.uuid4().hex
    assert via.post("/v1/completions", json=body, headers={"X-Request-Id": request_id}).status_code == 200
    proxy.wait_recorded(before + 1)
    upstream.flush()
    proxy.flush()
    theirs, ours = rows(store, "up", [request_id])[request_id], rows(store, "px", [request_id])[request_id]
    assert list(ours["prompt_token_ids"]) == PROMPT_IDS
    assert len(theirs["prompt_logprobs"]) == len(PROMPT_IDS) - 1
    assert list(ours["prompt_logprobs"]) == pytest.approx(list(theirs["prompt_logprobs"]), abs=1e-6)


def test_a_request_without_prompt_logprobs_stores_none(clients, upstream, proxy, store):
    _, via = clients
    before = proxy.proxy.recorded
    request_id = uuid.uuid4().hex
    body = {"model": upstream.model, "prompt": PROMPT_IDS, "max_tokens": 2, "temperature": 0}
    assert via.post("/v1/completions", json=body, headers={"X-Request-Id": request_id}).status_code == 200
    proxy.wait_recorded(before + 1)
    proxy.flush()
    assert list(rows(store, "px", [request_id])[request_id]["prompt_logprobs"]) == []


def _entry(token: int, logprob: float, alternative: int | None = None) -> dict:
    out = {str(token): {"logprob": logprob, "rank": 2, "decoded_token": "x"}}
    if alternative is not None:
        out[str(alternative)] = {"logprob": -0.01, "rank": 1, "decoded_token": "y"}
    return out


def test_the_prompt_tokens_own_logprob_is_read_by_id_not_position():
    # the alternative comes first, as vLLM writes a prompt token that was not the top-1
    entries = [None, _entry(7, -2.5, alternative=9), _entry(8, -0.5)]
    assert prompt_token_logprobs(entries, [3, 7, 8]) == [-2.5, -0.5]


@pytest.mark.parametrize("entries, ids", [
    (None, [3, 7]),
    ([None, _entry(7, -1.0)], [3, 7, 8]),  # one position short: not a partial row
    ([None, _entry(6, -1.0)], [3, 7]),  # the prompt token itself is missing
    ([None, None], [3, 7]),
], ids=["not-asked", "short", "other-token", "null-entry"])
def test_an_incomplete_prompt_logprobs_is_stored_as_none(entries, ids):
    assert prompt_token_logprobs(entries, ids) == []


def test_a_vllm_style_response_row_holds_them():
    """vLLM puts prompt_token_ids and prompt_logprobs in the completion's choice."""
    capture = ResponseCapture("completion", arrival_time=1.0)
    capture.on_response({"choices": [{"index": 0, "text": "a", "token_ids": [5], "finish_reason": "length",
                                       "prompt_token_ids": [3, 7, 8],
                                       "prompt_logprobs": [None, _entry(7, -2.5, alternative=9), _entry(8, -0.5)]}]},
                        now=2.0)
    req = ProxiedRequest("v0", "rescore.x.v0.abc", "", "rescore", "completion",
                         {"model": "m", "prompt": [3, 7, 8], "max_tokens": 1, "prompt_logprobs": 0})
    (record,) = build_records(req, capture)
    assert record.prompt_logprobs == [-2.5, -0.5]
