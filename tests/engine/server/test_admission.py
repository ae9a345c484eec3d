"""Admission: what the engine is given for a request, and the 400s for what it must not be given."""

from __future__ import annotations

import pytest

from engine.serving.server.admission import admit_chat, admit_completion
from engine.serving.server.errors import APIError
from engine.serving.server.headers import parse_traceparent, request_context
from engine.serving.server.model_info import ServedModel
from engine.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.core.tokenization import Tokenizer
from telemetry.contract.records import chat_messages_hash, text_sha256


@pytest.fixture(scope="module")
def served(tiny_llama):
    tok = Tokenizer(tiny_llama)
    return ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=64, vocab_size=tok.vocab_size,
                       tokenizer=tok)


def _completion(**kw):
    return CompletionRequest(**{"model": "tiny", "prompt": "hello", **kw})


def _chat(**kw):
    return ChatCompletionRequest(**{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_text_prompt_goes_to_the_engine_as_text(served):
    a = admit_completion(_completion(max_tokens=7, temperature=0, stop="x", seed=3), served)
    assert a.prompt == "hello"
    assert a.prompt_len == len(served.tokenizer.encode("hello"))
    sp = a.sampling_params
    assert (sp.max_tokens, sp.temperature, sp.stop, sp.seed) == (7, 0.0, ["x"], 3)


def test_token_prompts_and_single_item_batches(served):
    assert admit_completion(_completion(prompt=[5, 6, 7]), served).prompt == [5, 6, 7]
    assert admit_completion(_completion(prompt=[[5, 6]]), served).prompt == [5, 6]
    assert admit_completion(_completion(prompt=["hey"]), served).prompt == "hey"


def test_chat_renders_the_template_once(served):
    a = admit_chat(_chat(max_completion_tokens=5, logprobs=True, top_logprobs=3), served)
    expected = served.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert a.prompt == expected
    assert expected.count(served.tokenizer.bos_token_id) == 1  # no second BOS from encoding the rendered text
    assert (a.sampling_params.max_tokens, a.sampling_params.logprobs) == (5, 3)
    # no max_tokens: whatever room the context leaves
    assert admit_chat(_chat(), served).sampling_params.max_tokens == 64 - len(expected)


def test_the_engine_is_handed_the_token_ids_made_here_and_what_the_request_came_as(served):
    text = admit_completion(_completion(prompt="what the client sent"), served).engine_prompt
    assert (text.kind, text.text, text.token_ids) == ("text", "what the client sent",
                                                       served.tokenizer.encode("what the client sent"))
    assert text.text_hash == text_sha256("what the client sent") and text.rendered_hash == ""
    ids = admit_completion(_completion(prompt=[5, 6, 7]), served).engine_prompt
    assert (ids.kind, ids.text, ids.text_hash, ids.rendered_hash) == ("token_ids", None, "", "")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = admit_chat(_chat(messages=messages), served).engine_prompt
    rendered = served.tokenizer.apply_chat_template(messages, tokenize=False)
    assert (chat.kind, chat.text, chat.token_ids) == ("chat", rendered, served.tokenizer.apply_chat_template(messages))
    assert chat.text_hash == chat_messages_hash(messages) and chat.rendered_hash == text_sha256(rendered)
    # content parts are the same conversation as their joined text
    parts = _chat(messages=[messages[0], {"role": "user", "content": [{"type": "text", "text": "h"},
                                                                      {"type": "text", "text": "i"}]}])
    assert admit_chat(parts, served).engine_prompt == chat


def test_a_text_prompt_is_tokenized_once_through_the_cache(tiny_llama):
    tok = Tokenizer(tiny_llama)
    lookups = []
    real = tok.hf.encode
    tok.hf.encode = lambda *a, **k: lookups.append(a) or real(*a, **k)
    served = ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=64, vocab_size=tok.vocab_size,
                         tokenizer=tok)
    admit_completion(_completion(prompt="tokenize me once"), served)
    assert len(lookups) == 1 and tok.cache_info()["misses"] == 1
    admit_completion(_completion(prompt="tokenize me once"), served)  # the same text again: from the cache
    admit_chat(_chat(), served)
    assert len(lookups) == 2 and tok.cache_info() | {"size": 0} == {"hits": 1, "misses": 2, "size": 0,
                                                                      "capacity": tok.cache_size}


def test_an_unknown_model_is_a_404_and_echo_alone_asks_for_no_tokens(served):
    for admit, req in ((admit_completion, _completion(model="gpt-4")), (admit_chat, _chat(model="gpt-4"))):
        with pytest.raises(APIError) as e:
            admit(req, served)
        assert (e.value.status, e.value.param, e.value.code) == (404, "model", "model_not_found")
    echoed = admit_completion(_completion(max_tokens=0, echo=True), served)  # vLLM's: the engine runs one step
    assert echoed.echo_only and echoed.sampling_params.max_tokens == 1
    assert not admit_completion(_completion(max_tokens=1, echo=True), served).echo_only


@pytest.mark.parametrize("make, param, words", [
    (lambda: _completion(max_tokens=0), "max_tokens", "at least 1"),
    (lambda: _completion(max_tokens=-5), "max_tokens", "at least 1"),
    (lambda: _completion(max_tokens=10**9), "max_tokens", "maximum context length is 64"),
    (lambda: _completion(prompt="word " * 200), "prompt", "maximum context length is 64"),
    (lambda: _completion(prompt=[1, 2, 10**6]), "prompt", "outside the vocabulary"),
    (lambda: _completion(prompt=[]), "prompt", "must not be empty"),
    (lambda: _completion(prompt=["a"] * 65), "prompt", "at most 64"),
    (lambda: _completion(n=3, best_of=2), "best_of", "at least n"),
    (lambda: _completion(best_of=2, stream=True), "best_of", "cannot be streamed"),
    (lambda: _chat(n=65), "n", "at most 64"),
    (lambda: _completion(logit_bias={"1000000": 1.0}), "logit_bias", "not token IDs of this vocabulary"),
    (lambda: _completion(logit_bias={"05": 1.0}), "logit_bias", "not token IDs of this vocabulary"),
    (lambda: _completion(logit_bias={" 5": 1.0}), "logit_bias", "not token IDs of this vocabulary"),
    (lambda: _completion(logit_bias={"9" * 5000: 1.0}), "logit_bias", "not token IDs of this vocabulary"),
    (lambda: _completion(stop=[""]), "stop", "must not be empty"),
    (lambda: _completion(stop=["s"] * 17), "stop", "at most 16"),
    (lambda: _completion(stop_token_ids=[10**6]), "stop_token_ids", "outside the vocabulary"),
    (lambda: _completion(stream_options={"include_usage": True}), "stream_options", "stream is true"),
    (lambda: _chat(tools=[{"type": "function"}]), "tools", "not supported"),
    (lambda: _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}),
     "response_format", "cannot compile"),
    (lambda: _chat(top_logprobs=2), "top_logprobs", "requires logprobs"),
    (lambda: _chat(max_tokens=3, max_completion_tokens=3), "max_tokens", "not both"),
])
def test_bad_requests_are_400s_naming_the_parameter(served, make, param, words):
    req = make()
    admit = admit_chat if isinstance(req, ChatCompletionRequest) else admit_completion
    with pytest.raises(APIError) as e:
        admit(req, served)
    assert e.value.status == 400
    assert e.value.param == param
    assert words in e.value.message


def test_headers():
    from starlette.datastructures import Headers

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = request_context(Headers({"x-request-id": "abc-1", "x-workload": "chat", "traceparent": tp}), "chat")
    assert (ctx.request_id, ctx.workload, ctx.trace_id) == ("abc-1", "chat", "4bf92f3577b34da6a3ce929d0e0e4736")
    assert ctx.trace_context["gen_ai.operation.name"] == "chat"
    fresh = request_context(Headers({}), "text_completion")
    assert len(fresh.request_id) == 32 and len(fresh.trace_id) == 32 and fresh.workload == ""
    for bad in ["00-00000000000000000000000000000000-00f067aa0ba902b7-01", "ff-" + tp[3:], "garbage",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"]:
        assert parse_traceparent(bad) is None  # ignored, as the W3C spec says: a new trace starts
    for bad in [{"x-request-id": "a b"}, {"x-request-id": "x" * 200}, {"x-workload": "chat;drop"}]:
        with pytest.raises(APIError):
            request_context(Headers(bad), "chat")


def test_penalties_min_p_and_logit_bias_reach_the_sampling_params(served):
    for admit, req in [(admit_completion, _completion), (admit_chat, _chat)]:
        p = admit(req(presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.2, min_p=0.1,
                      logit_bias={"5": 3.0, "0": -100.0}), served).sampling_params
        assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p) == (0.5, -0.25, 1.2, 0.1)
        assert p.logit_bias == {5: 3.0, 0: -100.0}
        assert admit(req(logit_bias={}), served).sampling_params.logit_bias is None


@pytest.mark.parametrize("body", [{"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
                                  {"min_p": 1.5}, {"logit_bias": {"5": 101.0}}])
def test_out_of_range_processor_values_are_validation_errors(body):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):  # the server answers these with a 400 naming the field
        _completion(**body)
