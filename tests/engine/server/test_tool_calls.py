"""Tools and tool_choice on /v1/chat/completions, end to end: a random-weight Qwen2 with a real trained
tokenizer and a Hermes / Qwen2.5-style chat template written here, served over HTTP.

Checked: the prompt renders the tools and a conversation holding tool calls and tool results; a named
tool_choice and "required" give message.tool_calls whose arguments parse and satisfy the function's
schema (constrained decoding through SamplingParams.response_format, the engine's json_schema
support); the JSON shapes the openai client parses (the `openai` package is not installed here, so
the shapes are checked exactly), whole and streamed; the 400s (a template without tools, an unknown
function, an invalid schema, ...); what the request record keeps (tools hash, tool choice).
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest

from engine.serving.server.admission import admit_chat
from engine.serving.server.errors import APIError
from engine.serving.server.model_info import ServedModel
from engine.serving.server.protocol import ChatCompletionRequest
from engine.serving.server.tool_calls import PARSER_KEY, ToolPlan, describe, tool_response
from engine.serving.server.tool_parsers import HermesParser
from engine.serving.server.tool_stream import ToolStream
from engine.core.tokenization import Tokenizer

# Qwen2.5's tool template, cut down to what this tokenizer's role markers need
HERMES_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools %}<|system|># Tools\nYou may call one or more functions. Signatures:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\nFor each call return "
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>{{ eos_token }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|assistant|>{{ message.content or '' }}"
    "{%- for tc in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}{{ eos_token }}"
    "{%- elif message.role == 'tool' %}<|user|><tool_response>\n{{ message.content }}\n</tool_response>"
    "{{ eos_token }}"
    "{%- else %}{{ '<|' + message.role + '|>' + message.content + eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                                   "unit": {"enum": ["c", "f"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
TIME_SCHEMA = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
               "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER_SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": TIME_SCHEMA}}]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    from engine.core.tiny_model import build_bpe_tokenizer, build_random_model

    out = tmp_path_factory.mktemp("tool_model")
    build_bpe_tokenizer(out, chat_template=HERMES_TEMPLATE)
    return build_random_model(out, "qwen2", tokenizer_dir=out)


@pytest.fixture(scope="module")
def tool_server(tool_model):
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    observer, parts = build_observer("tools-test", "tool-model")
    engine = AsyncLLM(EngineConfig(model=str(tool_model), max_model_len=1024, num_kv_blocks=96, block_size=16,
                                   max_num_seqs=4, replica_id="tools-test"), observer)
    served = ServedModel.from_engine(engine, created=int(time.time()))
    with BackgroundServer(build_app(served)) as server:
        yield server.url, served
    parts.close()


def _post(tool_server, **body) -> httpx.Response:
    url, served = tool_server
    return httpx.post(url + "/v1/chat/completions", timeout=120,
                      json={"model": served.name, "messages": USER, "temperature": 0, "max_tokens": 48, **body})


def _sse(tool_server, **body) -> list[dict]:
    url, served = tool_server
    chunks = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120,
                      json={"model": served.name, "messages": USER, "temperature": 0, "max_tokens": 48,
                            "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def _reassemble(chunks: list[dict]) -> tuple[str, list[dict], str]:
    """(content, tool calls, finish_reason) as the openai client's stream accumulation builds them."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                assert set(tc) <= {"index", "id", "type", "function"} and isinstance(tc["index"], int)
                call = calls.setdefault(tc["index"], {"id": None, "type": None, "name": "", "arguments": ""})
                call["id"] = tc.get("id") or call["id"]
                call["type"] = tc.get("type") or call["type"]
                call["name"] += tc.get("function", {}).get("name") or ""
                call["arguments"] += tc.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return content, [calls[k] for k in sorted(calls)], finish


def _check_call_shape(call: dict, name: str) -> dict:
    """A tool call exactly as OpenAI's ChatCompletionMessageToolCall; returns its parsed arguments."""
    assert set(call) == {"id", "type", "function"} and call["id"].startswith("call_") and call["type"] == "function"
    assert set(call["function"]) == {"name", "arguments"} and call["function"]["name"] == name
    assert isinstance(call["function"]["arguments"], str)
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, SCHEMAS[name])
    return args


# ---------------------------------------------------------------- the prompt


def test_the_prompt_renders_the_tools(tool_server):
    _, served = tool_server
    with_tools = admit_chat(ChatCompletionRequest(model=served.name, messages=USER, tools=TOOLS), served)
    without = admit_chat(ChatCompletionRequest(model=served.name, messages=USER), served)
    ids = with_tools.engine_prompt.token_ids
    name_ids = served.tokenizer.encode('"name": "get_weather"', add_special_tokens=False)
    assert any(ids[i:i + len(name_ids)] == name_ids for i in range(len(ids))), "the tool's name is not in the prompt"
    assert "Weather in a city" in served.decode(ids)
    assert "get_weather" not in served.decode(without.engine_prompt.token_ids)
    # tool_choice "none" renders them too (vLLM's default), so the prompt does not depend on the choice
    none = admit_chat(ChatCompletionRequest(model=served.name, messages=USER, tools=TOOLS, tool_choice="none"), served)
    assert none.engine_prompt.token_ids == ids and none.sampling_params.response_format is None


def test_a_conversation_with_tool_calls_and_tool_results_renders(tool_server):
    messages = [*USER,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    r = _post(tool_server, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4, return_token_ids=True)
    assert r.status_code == 200, r.text
    _, served = tool_server
    prompt = served.decode(r.json()["prompt_token_ids"])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in prompt


# ---------------------------------------------------------------- constrained calls (the engine's json_schema)


def test_named_tool_choice_calls_that_function_with_arguments_of_its_schema(tool_server):
    r = _post(tool_server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None and len(message["tool_calls"]) == 1
    _check_call_shape(message["tool_calls"][0], "get_weather")
    assert choice["finish_reason"] == "stop"  # as OpenAI and vLLM answer a named tool_choice


def test_named_tool_choice_streamed(tool_server):
    chunks = _sse(tool_server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content, calls, finish = _reassemble(chunks)
    assert content == "" and len(calls) == 1 and calls[0]["id"].startswith("call_") and finish == "stop"
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME_SCHEMA)
    assert calls[0]["name"] == "get_time"


def test_named_tool_choice_with_several_choices(tool_server):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _post(tool_server, tools=TOOLS, tool_choice=named, n=2, temperature=1.0, seed=3)
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    for choice in r.json()["choices"]:
        _check_call_shape(choice["message"]["tool_calls"][0], "get_weather")
    chunks = _sse(tool_server, tools=TOOLS, tool_choice=named, n=2, temperature=1.0, seed=3)
    for k in (0, 1):  # each choice's deltas reassemble on their own
        mine = [{**c, "choices": [x for x in c["choices"] if x["index"] == k]} for c in chunks]
        _, calls, _ = _reassemble(mine)
        assert len(calls) == 1 and calls[0]["name"] == "get_weather"
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_SCHEMA)


def _closing_bias(served) -> dict[str, float]:
    """A logit bias towards the tokens that close a JSON array: random weights would otherwise call
    tools until max_tokens (the schema, as vLLM's, sets no maxItems); the grammar allows `]` only
    after a whole call."""
    vocab = served.tokenizer.hf.get_vocab()
    return {str(i): 30.0 for piece, i in vocab.items() if "]" in piece}


def test_required_tool_choice_gives_tool_calls(tool_server):
    bias = _closing_bias(tool_server[1])
    r = _post(tool_server, tools=TOOLS, tool_choice="required", max_tokens=96, logit_bias=bias)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["tool_calls"]
    for call in choice["message"]["tool_calls"]:
        _check_call_shape(call, call["function"]["name"])
    streamed = _reassemble(_sse(tool_server, tools=TOOLS, tool_choice="required", max_tokens=96, logit_bias=bias))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed[1]] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert streamed[2] == "tool_calls"


# ---------------------------------------------------------------- auto (parsed) and plain answers


def test_auto_without_a_call_is_plain_content(tool_server):
    r = _post(tool_server, tools=TOOLS)  # random weights write no <tool_call>
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert "tool_calls" not in choice["message"] and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    content, calls, _ = _reassemble(_sse(tool_server, tools=TOOLS))
    assert calls == [] and content == choice["message"]["content"]


HERMES_OUTPUT = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
                 '\n</tool_call>')


def test_auto_parses_the_hermes_format_out_of_a_whole_response():
    plan = ToolPlan("auto", TOOLS, "", HermesParser())
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": HERMES_OUTPUT},
                         "finish_reason": "stop", "logprobs": None}]}
    choice = tool_response(plan, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking.\n"
    assert _check_call_shape(choice["message"]["tool_calls"][0], "get_weather") == {"city": "Paris", "unit": "c"}
    bad = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "<tool_call>{oops</tool_call>"},
                        "finish_reason": "stop"}]}
    assert tool_response(plan, bad)["choices"][0] == {  # malformed: the text as it is, never an error
        "index": 0, "message": {"role": "assistant", "content": "<tool_call>{oops</tool_call>"},
        "finish_reason": "stop"}


class _Chunks:
    """Stands in for the server's StreamFormatter: the chunks it writes, one text increment each."""

    def __init__(self, pieces):
        self.pieces = pieces

    def events(self, k):
        body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        last = k == len(self.pieces) - 1
        events = []
        if k == 0:
            events.append({**body, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})
        choice = {"index": 0, "delta": {"content": self.pieces[k]}, "logprobs": None,
                  "finish_reason": "stop" if last else None}
        if last:
            choice["stop_reason"] = None
        events.append({**body, "choices": [choice]})
        return [f"data: {json.dumps(e)}\n\n" for e in events]


def test_auto_streams_the_hermes_format_as_tool_call_deltas():
    pieces = [HERMES_OUTPUT[i:i + 5] for i in range(0, len(HERMES_OUTPUT), 5)]
    stream = ToolStream(_Chunks(pieces), ToolPlan("auto", TOOLS, "", HermesParser()))
    chunks = [json.loads(e[len("data: "):]) for k in range(len(pieces)) for e in stream.events(k)]
    content, calls, finish = _reassemble(chunks)
    assert content == "Checking.\n" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris", "unit": "c"})]


# ---------------------------------------------------------------- 400s, records, the start summary


@pytest.mark.parametrize("body, param, words", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}},
     "tool_choice", "not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools", "invalid JSON Schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": 5}}}]},
     "tools", "invalid JSON Schema"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}],  # JSON Schema allows it; no grammar
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools", "cannot constrain decoding"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "letters, digits"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "must be 'function'"),
    ({"tool_choice": "required"}, "tool_choice", "requires tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be 'none', 'auto'"),
])
def test_bad_tool_requests_are_400s(tool_server, body, param, words):
    r = _post(tool_server, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_template_without_tools_is_a_400_that_says_so(tiny_llama):
    tok = Tokenizer(tiny_llama)  # engine/core/tiny_model.py's template, which ignores `tools` (as the reference model's)
    served = ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=256, vocab_size=tok.vocab_size,
                         tokenizer=tok)
    with pytest.raises(APIError) as e:
        admit_chat(ChatCompletionRequest(model="tiny", messages=USER, tools=TOOLS), served)
    assert e.value.status == 400 and e.value.param == "tools"
    assert "chat template does not render `tools`" in e.value.message and "--chat-template" in e.value.message
    assert "not available" in describe(served)
    # tools the model may not call (tool_choice 'none') are answered as without them, as vLLM does; their
    # shape is still checked
    plain = admit_chat(ChatCompletionRequest(model="tiny", messages=USER), served)
    none = admit_chat(ChatCompletionRequest(model="tiny", messages=USER, tools=TOOLS, tool_choice="none"), served)
    assert none.tools is None and none.engine_prompt.token_ids == plain.engine_prompt.token_ids
    with pytest.raises(APIError) as e:
        admit_chat(ChatCompletionRequest(model="tiny", messages=USER, tools=[{"type": "retrieval"}],
                                         tool_choice="none"), served)
    assert e.value.param == "tools"


@pytest.mark.parametrize("name, ok", [("get_weather-2", True), ("x" * 64, True), ("x" * 65, False), ("", False),
                                      ("bad name", False), ("naïve", False), ("f\n", False)])
def test_function_and_format_names_follow_one_rule(name, ok):
    """OpenAI's name rule (protocol.FUNCTION_NAME) for a tool's function and a json_schema format alike."""
    from pydantic import ValidationError

    from engine.serving.server.protocol import JSONSchemaSpec
    from engine.serving.server.tool_calls import _check_tools

    tool = [{"type": "function", "function": {"name": name}}]
    outcomes = []
    for check in (lambda: _check_tools(tool), lambda: JSONSchemaSpec(name=name, schema={})):
        try:
            check()
            outcomes.append(True)
        except (APIError, ValidationError):
            outcomes.append(False)
    assert outcomes == [ok, ok]


def _published_validator(openapi: dict):
    """A validator of request bodies against the published ChatCompletionRequest schema."""
    schema = {"$ref": "#/components/schemas/ChatCompletionRequest", "components": openapi["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_the_published_schema_takes_tools_where_the_template_renders_them(tool_server):
    url, served = tool_server
    validator = _published_validator(httpx.get(url + "/openapi.json", timeout=30).json())
    body = {"model": served.name, "messages": USER, "tools": TOOLS}
    for choice in (None, "auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        request = body if choice is None else {**body, "tool_choice": choice}
        assert validator.is_valid(request), next(validator.iter_errors(request)).message
        assert _post(tool_server, **request, max_tokens=2).status_code == 200  # and the server takes them
    bad_name = [{"type": "function", "function": {"name": "bad name!"}}]
    assert not validator.is_valid({**body, "tools": bad_name})
    assert not validator.is_valid({**body, "tools": [{"type": "retrieval"}]})
    assert not validator.is_valid({**body, "tool_choice": "sometimes"})


def test_the_published_schema_takes_no_tools_where_the_template_ignores_them(tiny_llama):
    from engine.serving.server.openapi import _served_keywords, fill_served_limits

    tok = Tokenizer(tiny_llama)
    served = ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=256, vocab_size=tok.vocab_size,
                         tokenizer=tok)
    request = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = {"ChatCompletionRequest": request}
    components.update(request.pop("$defs"))
    fill_served_limits(components, _served_keywords(served))
    validator = _published_validator({"components": {"schemas": components}})
    plain = {"model": "tiny", "messages": USER}
    assert validator.is_valid(plain) and validator.is_valid({**plain, "tool_choice": "none"})
    assert not validator.is_valid({**plain, "tools": TOOLS})  # admission's 400 (the test above)
    assert not validator.is_valid({**plain, "tool_choice": "required"})


def test_auto_needs_a_parser(tool_model):
    tok = Tokenizer(tool_model)
    tok.chat_template = tok.hf.chat_template = HERMES_TEMPLATE.replace("<tool_call>", "<call>")
    tok.chat_template_hash = "no-marker"
    served = ServedModel(engine=None, name="m", replica_id="r0", max_model_len=1024, vocab_size=tok.vocab_size,
                         tokenizer=tok)
    with pytest.raises(APIError, match="--tool-call-parser"):
        admit_chat(ChatCompletionRequest(model="m", messages=USER, tools=TOOLS), served)
    served.extra[PARSER_KEY] = "hermes"  # `serve --tool-call-parser hermes`
    admitted = admit_chat(ChatCompletionRequest(model="m", messages=USER, tools=TOOLS), served)
    assert admitted.tools.parser.name == "hermes"
    assert describe(served) == "tool calls: parser hermes (--tool-call-parser)"


def test_the_request_record_keeps_the_tools_hash_and_choice(tool_server):
    _, served = tool_server
    assert describe(served) == "tool calls: parser hermes (detected from the chat template)"
    choice = {"type": "function", "function": {"name": "get_time"}}
    named = admit_chat(ChatCompletionRequest(model=served.name, messages=USER, tools=TOOLS, tool_choice=choice), served)
    params = json.loads(named.sampling_params.to_json())
    assert params["tool_choice"] == "function:get_time" and len(params["tools_hash"]) == 64
    assert params["response_format"] == {"type": "json_schema",
                                         "json_schema": {"name": "get_time", "schema": TIME_SCHEMA}}
    plain = json.loads(admit_chat(ChatCompletionRequest(model=served.name, messages=USER), served)
                       .sampling_params.to_json())
    assert "tools_hash" not in plain and "tool_choice" not in plain  # the layout of requests without tools


def test_serve_takes_a_tool_call_parser_option():
    import argparse

    from engine.serving.server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--model", "m", "--tool-call-parser", "mistral"]).tool_call_parser == "mistral"
    assert parser.parse_args(["--model", "m"]).tool_call_parser is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--tool-call-parser", "nope"])


@pytest.mark.parametrize("tool_choice", [None, "none", "auto", "required",
                                         {"type": "function", "function": {"name": "get_time"}}])
def test_the_proxy_records_tool_requests_as_the_server_does(tool_model, tool_choice):
    """A mixed fleet pairs rows on sampling_params_json: the proxy's row of a tool request carries the
    same tools_hash, tool_choice and forced response_format as infersight's admission records."""
    from engine.serving.proxy.request_row import sampling_params_json

    tok = Tokenizer(tool_model)
    served = ServedModel(engine=None, name="m", replica_id="r0", max_model_len=1024, vocab_size=tok.vocab_size,
                         tokenizer=tok)
    body = {"model": "m", "messages": USER, "tools": TOOLS, "max_tokens": 8}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    admitted = admit_chat(ChatCompletionRequest(**body), served)
    proxied = json.loads(sampling_params_json(body, "chat", admitted.prompt_len, served.max_model_len))
    engine = json.loads(admitted.sampling_params.to_json())
    assert proxied["tools_hash"] == engine["tools_hash"]
    assert proxied == {k: engine[k] for k in proxied}
