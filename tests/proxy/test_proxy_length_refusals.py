"""A length refusal through the recording proxy is stored under the prompt's real length: vLLM states a bound
("at least 97 input tokens", it stops tokenizing past the context) or a count of characters, which would put
every prompt it refuses in one length stratum (or none), where the availability rule cannot compare it with
the peers that answered the same prompts."""

from __future__ import annotations

import asyncio
import json

import httpx

from engine.core.model_refs import REFERENCE_MODEL
from engine.serving.proxy.app import RecordingProxy
from engine.serving.proxy.request_row import ProxiedRequest
from engine.core.tokenization import Tokenizer

VLLM_LENGTH = ("This model's maximum context length is 96 tokens. However, your prompt contains at least 97 input "
               "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the "
               "input prompt. (parameter=input_tokens, value=97)")


def _counted(proxy, status: int, message: str, body: dict) -> dict | None:
    upstream = httpx.Response(status, content=json.dumps({"error": {"message": message, "type": "BadRequestError",
                                                                    "code": status}}).encode())
    request = ProxiedRequest("v0", "id", "trace", "chat", "completion", body)
    return asyncio.run(proxy._refused_prompt_length(upstream, request))


def test_a_length_refusal_is_counted_by_the_proxys_tokenizer():
    tokenizer = Tokenizer(REFERENCE_MODEL)
    proxy = RecordingProxy("http://127.0.0.1:9", None, "v0", tokenizer=tokenizer)
    prompt = " ".join(["the cat sat on the mat"] * 40)
    real = len(tokenizer.encode(prompt))
    assert real > 150  # far past the bound vLLM states
    assert _counted(proxy, 400, VLLM_LENGTH, {"prompt": prompt}) == {"prompt_tokens": real,
                                                                     "prompt_tokens_source": "proxy_tokenizer"}
    # a batch of prompts: its longest decides
    assert _counted(proxy, 400, VLLM_LENGTH, {"prompt": ["short", prompt]})["prompt_tokens"] == real


def test_other_refusals_and_a_proxy_without_tokenizer_are_not_counted():
    proxy = RecordingProxy("http://127.0.0.1:9", None, "v0", tokenizer=Tokenizer(REFERENCE_MODEL))
    assert _counted(proxy, 400, "temperature must be >= 0", {"prompt": "hello"}) is None
    assert _counted(proxy, 500, "engine died", {"prompt": "hello"}) is None
    blind = RecordingProxy("http://127.0.0.1:9", None, "v0")
    assert _counted(blind, 400, VLLM_LENGTH, {"prompt": "hello"}) is None


def test_the_counted_length_keeps_the_limit_the_message_states():
    from engine.serving.server.rejections import refused_record

    body = json.dumps({"error": {"message": VLLM_LENGTH, "type": "BadRequestError", "code": 400}}).encode()
    row = refused_record({"headers": []}, replica_id="v0", model_name="m", status=400, body=body, arrival=1.0,
                         finish=1.1, upstream_status=400, detail={"prompt_tokens": 240})
    assert row.prompt_tokens == 240 and json.loads(row.error_detail_json)["max_model_len"] == 96
