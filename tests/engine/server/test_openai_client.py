"""The server through the client a vLLM or OpenAI user reaches for first: the `openai` package parses every
answer into its own types (a field of the wrong shape fails here), and its errors are the ones it raises
for OpenAI's and vLLM's servers."""

from __future__ import annotations

import openai
import pytest

PROMPT = "The quick brown fox"


@pytest.fixture
def api(live):
    with openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def model_id(api) -> str:
    return api.models.list().data[0].id


def test_completion_chat_and_their_streams(api):
    model = model_id(api)
    whole = api.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    assert whole.system_fingerprint.startswith("fp_")
    chunks = list(api.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].system_fingerprint == whole.system_fingerprint  # the last chunk carries it, as vLLM's

    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    chat = api.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5
    stream = list(api.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, stream=True,
                                              stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == chat.choices[0].message.content
    assert stream[-1].usage.completion_tokens == 5 and stream[-1].system_fingerprint == chat.system_fingerprint


def test_an_unknown_model_is_the_clients_not_found_error(api):
    with pytest.raises(openai.NotFoundError) as e:
        api.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_echo_without_generation_is_the_prompt(api):
    model = model_id(api)
    r = api.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert r.choices[0].text == PROMPT
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs) == r.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError):  # without echo, max_tokens 0 asks for nothing
        api.completions.create(model=model, prompt=PROMPT, max_tokens=0)
