"""The tool-call parsers on outputs written in each model family's real format: several calls, text
before them, malformed JSON (plain content, never an error), and streaming: the text fed in random
chunk sizes gives the same calls and the same content as the whole text."""

from __future__ import annotations

import json
import random

import pytest

from engine.serving.server.tool_calls import ToolPlan
from engine.serving.server.tool_parsers import (
    HermesParser, Llama3JsonParser, MistralParser, RequiredArrayParser, ToolCall, detect_parser, get_parser,
)
from engine.serving.server.tool_stream import ChoiceToolState

WEATHER = ToolCall("get_weather", json.dumps({"city": "Paris", "unit": "celsius"}))
TIME = ToolCall("get_time", json.dumps({"tz": "Europe/Paris"}))

HERMES_TWO = ('Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
              '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
              '{"tz": "Europe/Paris"}}\n</tool_call>')
MISTRAL_TWO = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
               '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]')
# mistral-common 1.8.5's InstructTokenizerV13 / V11 render two assistant calls so (decoded with special tokens)
MISTRAL_V13_TWO = ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
                   '[TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Paris"}')
MISTRAL_V11_TWO = ('[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{"city": "Paris", "unit": "celsius"}'
                   '[TOOL_CALLS]get_time[CALL_ID]xyz789uvw[ARGS]{"tz": "Europe/Paris"}')
LLAMA_TWO = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
             '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}')
REQUIRED_TWO = ('[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, '
                '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}]')


@pytest.mark.parametrize("parser, text, content", [
    (HermesParser(), HERMES_TWO, "Let me check both.\n"),
    (MistralParser(), "Sure. " + MISTRAL_TWO, "Sure. "),
    (MistralParser(), "Sure. " + MISTRAL_V13_TWO, "Sure. "),
    (MistralParser(), MISTRAL_V11_TWO, None),
    (MistralParser(), MISTRAL_V13_TWO + "</s>", None),  # what follows the calls is dropped
    (Llama3JsonParser(), LLAMA_TWO, None),
    (Llama3JsonParser(), LLAMA_TWO.removeprefix("<|python_tag|>"), None),  # bare JSON, as Llama 3.1 often writes
    (RequiredArrayParser(), REQUIRED_TWO, None),
])
def test_several_calls_and_the_text_before_them(parser, text, content):
    got_content, calls = parser.extract(text)
    assert calls == [WEATHER, TIME]
    assert got_content == content
    assert all(json.loads(c.arguments) for c in calls)  # arguments are JSON text


def test_one_hermes_call_without_text_has_no_content():
    content, calls = HermesParser().extract('<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
                                            "</tool_call>")
    assert content is None and calls == [ToolCall("get_time", '{"tz": "UTC"}')]


def test_non_ascii_arguments_stay_characters():
    _, calls = HermesParser().extract('<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}</tool_call>')
    assert calls[0].arguments == '{"city": "Zürich"}'


@pytest.mark.parametrize("parser, text", [
    (HermesParser(), 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'),
    (HermesParser(), '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'),  # JSON, but no name
    (HermesParser(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": '),  # cut by max_tokens
    # a good call, then a malformed one: all or nothing, as vLLM's parsers
    (HermesParser(), '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": '
                     '"get_weather", "arguments": {"city": Paris}}\n</tool_call>'),
    (MistralParser(), '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": 3}]'),
    (MistralParser(), '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    (MistralParser(), '[TOOL_CALLS][{"name": 5}]'),
    (MistralParser(), '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'),  # cut by max_tokens
    (MistralParser(), '[TOOL_CALLS]get_weather{"city": "Paris"}'),  # no [ARGS]
    (MistralParser(), '[TOOL_CALLS]get_weather'),
    (MistralParser(), '[TOOL_CALLS]get weather[ARGS]{}'),  # not a name
    (MistralParser(), '[TOOL_CALLS][ARGS]{}'),  # no name: "[" then not JSON
    (MistralParser(), '[TOOL_CALLS] [CALL_ID]x[ARGS]{}'),  # an empty name
    (MistralParser(), '[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS][1, 2]'),  # all or nothing
    (Llama3JsonParser(), '{"name": "get_weather", "parameters": {"city": "Paris"'),
    (Llama3JsonParser(), '{"not": "a call"}'),
    (RequiredArrayParser(), '[{"name": "get_weather", "parameters": [1, 2]}]'),  # arguments not an object
])
def test_malformed_calls_are_returned_as_plain_content(parser, text):
    assert parser.extract(text) == (text, [])


@pytest.mark.parametrize("parser, text", [
    (HermesParser(), "The weather in Paris is mild; no tool is needed."),
    (MistralParser(), "Plain answer with [brackets] and {braces}."),
    (Llama3JsonParser(), 'The answer is {"a": 1} in JSON.'),  # a JSON object not at the start is text
])
def test_plain_answers_have_no_calls(parser, text):
    assert parser.extract(text) == (text, [])


def _stream(parser, text: str, rng: random.Random) -> tuple[str, list[ToolCall]]:
    """Feed `text` in random chunks; reassemble content and calls as the openai client does."""
    state = ChoiceToolState(ToolPlan("auto", [], "", parser))
    pieces, pos = [], 0
    while pos < len(text):
        step = rng.randint(1, 7)
        pieces.append(text[pos:pos + step])
        pos += step
    content, calls = "", {}
    for k, piece in enumerate(pieces):
        for delta in state.feed(piece, finished=k == len(pieces) - 1):
            content += delta.get("content", "")
            for tc in delta.get("tool_calls", []):
                call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                assert ("id" in tc) == (not call["name"])  # the id and name come once, first
                call["name"] += tc.get("function", {}).get("name", "") or ""
                call["arguments"] += tc.get("function", {}).get("arguments", "")
    return content, [ToolCall(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


STREAM_CASES = [
    (HermesParser(), HERMES_TWO), (MistralParser(), "Sure. " + MISTRAL_TWO), (Llama3JsonParser(), LLAMA_TWO),
    (Llama3JsonParser(), LLAMA_TWO.removeprefix("<|python_tag|>")), (RequiredArrayParser(), REQUIRED_TWO),
    (HermesParser(), "A plain answer that mentions <tool but never calls one."),
    (HermesParser(), 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'),
    (MistralParser(), '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    (MistralParser(), "Sure. " + MISTRAL_V13_TWO), (MistralParser(), MISTRAL_V11_TWO + "</s>"),
    (MistralParser(), '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'), (MistralParser(), "[TOOL_CALLS]get weather[ARGS]{}"),
    (Llama3JsonParser(), "  plain text after spaces"),
]


@pytest.mark.parametrize("parser, text", STREAM_CASES)
def test_streaming_in_random_chunks_gives_the_calls_of_the_whole_text(parser, text):
    whole_content, whole_calls = parser.extract(text)
    for seed in range(20):
        content, calls = _stream(parser, text, random.Random(seed))
        assert calls == whole_calls, seed
        assert content == (whole_content or ""), seed


def test_streamed_content_before_a_call_is_sent_before_the_call_ends():
    state = ChoiceToolState(ToolPlan("auto", [], "", HermesParser()))
    assert state.feed("Let me check.\n<tool", False) == [{"content": "Let me check.\n"}]  # "<tool" held back
    assert state.feed('_call>\n{"name": "get_time", "argu', False) == []
    deltas = state.feed('ments": {}}\n</tool_call>', True)
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": ""}
    assert deltas[0]["tool_calls"][0]["id"].startswith("call_")
    assert deltas[1]["tool_calls"][0] == {"index": 0, "function": {"arguments": "{}"}}


def test_named_function_streams_argument_fragments():
    state = ChoiceToolState(ToolPlan("named", [], "", None, "get_time"))
    first = state.feed('{"tz": ', False)
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"tz": '}
    assert state.feed('"UTC"}', True) == [{"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}]


def test_parser_registry_and_detection_from_templates():
    assert {get_parser(n).name for n in ("hermes", "mistral", "llama3_json")} == {"hermes", "mistral", "llama3_json"}
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("nope")
    assert detect_parser("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("{{- '<|python_tag|>' }}") == "llama3_json"
    assert detect_parser("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_parser(None) is None


@pytest.mark.parametrize("version", ["v11", "v13"])
def test_mistral_commons_own_rendering_of_calls_parses_whole_and_streamed(version):
    """Calls as mistral-common's v11 / v13 instruct tokenizers encode an assistant message (a byte-level
    vocabulary with their control tokens), decoded keeping special tokens as the server does for mistral."""
    pytest.importorskip("mistral_common")
    import base64

    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.tool_calls import FunctionCall
    from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall
    from mistral_common.tokens.tokenizers import instruct
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy, TokenizerVersion
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    specials = [dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    specials += [{"rank": len(specials) + i, "token_str": s, "is_control": True}
                 for i, s in enumerate((MistralParser.ARGS, MistralParser.CALL_ID))]
    vocab = [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": None} for b in range(256)]
    tekken = Tekkenizer(vocab, specials, pattern=r"[\s\S]", vocab_size=256 + len(specials),
                        num_special_tokens=len(specials), version=TokenizerVersion(version))
    encoder = {"v11": instruct.InstructTokenizerV11, "v13": instruct.InstructTokenizerV13}[version](tekken)
    message = AssistantMessage(tool_calls=[
        MistralCall(id="abc123def", function=FunctionCall(name=c.name, arguments=c.arguments)) for c in (WEATHER, TIME)])
    ids = encoder.encode_assistant_message(message, is_before_last_user_message=False, continue_message=False)
    text = tekken.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)
    assert text.startswith("[TOOL_CALLS]get_weather[") and "[ARGS]" in text
    parser = MistralParser()
    assert parser.extract(text) == (None, [WEATHER, TIME])
    for seed in range(5):
        assert _stream(parser, text, random.Random(seed)) == ("", [WEATHER, TIME])
