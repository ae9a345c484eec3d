"""infersight's server answers as the real vLLM (the CPU build in .venv-vllm) does, side by side on the
reference model (the plain vLLM the modules here share, plain_vllm.py): an unknown model, echo without generation, echo's
logprobs, tools the model may not call on a template without tools, `--chat-template`, /ping and /load,
a stream's first and last chunks, /detokenize, and the `openai` client on both."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from plain_vllm import SERVED, TEMPLATE
from vllm_fleet_marks import vllm_marks

from engine.core.model_refs import REFERENCE_MODEL

pytestmark = vllm_marks()

PROMPT = "The sky is"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two plus two?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def vllm(plain_vllm):
    return plain_vllm.url


@pytest.fixture(scope="module")
def ours(chat_template_file):
    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    engine = AsyncLLM(EngineConfig(model=str(REFERENCE_MODEL), max_model_len=256, served_model_name=SERVED,
                                   chat_template=str(chat_template_file)))
    with BackgroundServer(build_app(ServedModel.from_engine(engine, created=int(time.time())))) as server:
        yield server.url


@pytest.fixture(scope="module")
def both(vllm, ours):
    """(vLLM's client, ours)."""
    with httpx.Client(base_url=vllm, timeout=120) as theirs, httpx.Client(base_url=ours, timeout=120) as mine:
        yield theirs, mine


def post_both(both, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    return tuple(c.post(path, json=body) for c in both)


def events(text: str) -> list[dict]:
    return [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def same_logprobs(a: dict, b: dict) -> None:
    """A completion's logprobs: the same tokens, the same top_logprobs keys in the same order, the values
    within float noise (two engines' float32 kernels)."""
    assert a["tokens"] == b["tokens"]
    assert [x is None for x in a["token_logprobs"]] == [x is None for x in b["token_logprobs"]]
    assert [x for x in a["token_logprobs"] if x is not None] == pytest.approx(
        [x for x in b["token_logprobs"] if x is not None], abs=1e-3)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
        assert (x is None) == (y is None)
        if x is not None:
            assert list(x) == list(y) and list(x.values()) == pytest.approx(list(y.values()), abs=1e-3)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}),
    ("/tokenize", {"prompt": PROMPT}),
], ids=["completion", "chat", "tokenize"])
def test_an_unknown_model_is_a_404_naming_the_model(both, path, body):
    theirs, mine = post_both(both, path, {"model": "no-such-model", **body})
    assert theirs.status_code == mine.status_code == 404
    assert theirs.json()["error"]["param"] == mine.json()["error"]["param"] == "model"
    assert mine.json()["error"]["code"] == "model_not_found"  # OpenAI's code (vLLM writes the status there)


def test_echo_without_generation_answers_the_prompt(both):
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2}
    theirs, mine = (r.json() for r in post_both(both, "/v1/completions", body))
    a, b = theirs["choices"][0], mine["choices"][0]
    assert a["text"] == b["text"] == PROMPT and a["finish_reason"] == b["finish_reason"]
    same_logprobs(a["logprobs"], b["logprobs"])
    for key in ("prompt_tokens", "completion_tokens"):
        assert theirs["usage"][key] == mine["usage"][key], key
    # without echo, nothing is asked for: both refuse it, naming max_tokens
    theirs, mine = post_both(both, "/v1/completions", {**body, "echo": False})
    assert theirs.status_code == mine.status_code == 400
    assert theirs.json()["error"]["param"] == mine.json()["error"]["param"] == "max_tokens"


def test_echo_with_logprobs_lists_the_token_itself_in_top_logprobs(both):
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    theirs, mine = (r.json()["choices"][0] for r in post_both(both, "/v1/completions", body))
    assert theirs["text"] == mine["text"]
    same_logprobs(theirs["logprobs"], mine["logprobs"])


def test_tools_the_model_may_not_call_are_answered_on_a_template_without_tools(both):
    body = {"model": SERVED, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "tools": TOOLS,
            "tool_choice": "none"}
    theirs, mine = post_both(both, "/v1/chat/completions", body)
    assert theirs.status_code == mine.status_code == 200, (theirs.text, mine.text)
    assert theirs.json()["choices"][0]["message"]["content"] == mine.json()["choices"][0]["message"]["content"]
    assert theirs.json()["usage"]["prompt_tokens"] == mine.json()["usage"]["prompt_tokens"]
    # tools the model may call ('auto', the default when tool_choice is left out) it cannot: both refuse
    theirs, mine = post_both(both, "/v1/chat/completions", {k: v for k, v in body.items() if k != "tool_choice"})
    assert theirs.status_code == mine.status_code == 400


def test_both_render_chats_with_the_chat_template_they_were_given(both):
    from engine.core.tokenization import Tokenizer

    theirs, mine = (r.json() for r in post_both(both, "/v1/chat/completions", {
        "model": SERVED, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "return_token_ids": True}))
    ids = theirs.get("prompt_token_ids") or theirs["choices"][0].get("prompt_token_ids")
    assert ids == mine["prompt_token_ids"]
    assert theirs["choices"][0]["message"]["content"] == mine["choices"][0]["message"]["content"]
    tok = Tokenizer(REFERENCE_MODEL)
    assert ids == tok.encode(tok.hf.apply_chat_template(MESSAGES, chat_template=TEMPLATE, tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False)
    assert ids != tok.apply_chat_template(MESSAGES)  # the model directory's template renders it otherwise
    theirs, mine = (r.json() for r in post_both(both, "/tokenize", {"model": SERVED, "messages": MESSAGES}))
    assert theirs["tokens"] == mine["tokens"] == ids


def test_ping_and_load(both):
    for method in ("GET", "POST"):
        theirs, mine = (c.request(method, "/ping") for c in both)
        assert theirs.status_code == mine.status_code == 200
    theirs, mine = (c.get("/load") for c in both)
    assert theirs.status_code == mine.status_code == 200
    assert theirs.json() == mine.json() == {"server_load": 0}  # nothing in flight on either


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})], ids=["completion", "chat"])
@pytest.mark.parametrize("usage", [False, True], ids=["no-usage", "usage"])
def test_a_streams_first_and_last_chunks(both, path, body, usage):
    body = {"model": SERVED, "max_tokens": 3, "temperature": 0, "stream": True, **body}
    if usage:
        body["stream_options"] = {"include_usage": True}
    theirs, mine = (events(r.text) for r in post_both(both, path, body))
    for chunks in (theirs, mine):
        # the last chunk (the usage chunk where asked, else the finishing one) carries the fingerprint
        assert chunks[-1].get("system_fingerprint") and ("usage" in chunks[-1]) == usage
        assert all("system_fingerprint" not in c for c in chunks[:-1])
    first = [chunks[0]["choices"][0] for chunks in (theirs, mine)]
    assert ("stop_reason" in first[0]) == ("stop_reason" in first[1])  # a completion's first: null; a chat's: none
    assert first[0].get("stop_reason") is None and first[1].get("stop_reason") is None
    text = [("".join(c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or ""
                     for c in chunks if c["choices"])) for chunks in (theirs, mine)]
    assert text[0] == text[1]


def test_detokenize_keeps_the_special_tokens(both):
    theirs, _ = post_both(both, "/tokenize", {"model": SERVED, "prompt": PROMPT})
    ids = theirs.json()["tokens"]
    theirs, mine = post_both(both, "/detokenize", {"model": SERVED, "tokens": ids})
    assert theirs.json()["prompt"] == mine.json()["prompt"]
    assert theirs.json()["prompt"].startswith("<|bos|>")


def test_the_openai_client_gets_the_same_answers_from_both(vllm, ours):
    answers = []
    for url in (vllm, ours):
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as api:
            text = api.completions.create(model=SERVED, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
            chat = api.chat.completions.create(model=SERVED, messages=MESSAGES, max_tokens=6, temperature=0)
            with pytest.raises(openai.NotFoundError):
                api.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
            answers.append((text, chat.choices[0].message.content))
    assert answers[0] == answers[1]
