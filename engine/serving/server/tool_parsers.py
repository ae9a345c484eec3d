"""Parsers of a model's tool-call output, one small class per format, by vLLM's `--tool-call-parser` names.

    hermes       Qwen2.5 / Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, repeated
    mistral      `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (tokenizers up to v7), or per call
                 `[TOOL_CALLS]name[ARGS]{...}` (v13), `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` (v11), as
                 mistral-common's instruct tokenizers write assistant tool calls
    llama3_json  `{"name": ..., "parameters": {...}}` (calls joined by `;`), maybe after `<|python_tag|>`

Algorithm (the same code serves whole outputs and streams, so both give the same calls):
- `start(text)`: where the tool-call section begins (a marker), or None: the text is plain content.
- `scan(section, final)`: the complete calls at the head of the section, where they end, and whether
  the section is malformed (a call that is not JSON, or JSON that is not a call). While streaming
  (`final=False`) an unfinished call is not an error: the scan stops before it and is asked again
  with more text.
- `hold(text)`: how many trailing characters of content to hold back while streaming, because they
  could be the beginning of a marker.
`extract(text)` is all or nothing, as vLLM's parsers are: text before the section stays content; a
malformed section makes the whole output plain content (never an error); text after the calls is
dropped (vLLM drops it too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI's `function.arguments`


@dataclass
class Scan:
    calls: list[ToolCall] = field(default_factory=list)
    end: int = 0  # where the last complete call (and its closing marker) ends in the section
    malformed: bool = False


def arguments_text(value) -> str:
    """OpenAI's `arguments` string: a JSON object as text (a string the model wrote is kept as is)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_from(obj, keys=("arguments", "parameters")) -> ToolCall | None:
    """A call from a decoded JSON value: an object with a string `name` and an object of arguments."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[k] for k in keys if k in obj), {})
    if not isinstance(args, (dict, str)):
        return None
    return ToolCall(obj["name"], arguments_text(args))


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def partial_marker_len(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def json_items(text: str, pos: int, final: bool, sep: str, close: str | None, keys) -> Scan:
    """Calls written as JSON objects from `pos`, separated by `sep`, up to `close` (a JSON array's
    `]`) or the end. Shared by the mistral and llama3 formats and by tool_choice="required"'s array."""
    scan = Scan()  # end 0 until a call is complete: a malformed section is content from its start
    while True:
        pos = _skip_space(text, pos)
        if pos >= len(text):
            scan.malformed = final and close is not None  # an array never closed
            return scan
        if close is not None and text[pos] == close:
            scan.end = pos + 1
            return scan
        try:
            obj, after = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            scan.malformed = final  # while streaming: the object is not complete yet
            return scan
        call = call_from(obj, keys)
        if call is None:
            scan.malformed = True
            return scan
        scan.calls.append(call)
        scan.end = pos = after
        nxt = _skip_space(text, pos)
        if nxt < len(text) and text[nxt] == sep:
            pos = nxt + 1
        elif nxt < len(text) and text[nxt] != close:
            return scan  # something else follows the calls: dropped, as vLLM drops it


class ToolParser:
    name = ""
    markers: tuple[str, ...] = ()
    needs_special_tokens = False  # the marker is a special token: decode with skip_special_tokens=False

    def start(self, text: str) -> int | None:
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def hold(self, text: str) -> int:
        return max((partial_marker_len(text, m) for m in self.markers), default=0)

    def scan(self, section: str, final: bool) -> Scan:
        raise NotImplementedError

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output; content None when the calls are all there is."""
        i = self.start(text)
        if i is None:
            return text, []
        scan = self.scan(text[i:], final=True)
        if scan.malformed or not scan.calls:
            return text, []
        return text[:i] or None, scan.calls


class HermesParser(ToolParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    markers = (OPEN,)

    def scan(self, section: str, final: bool) -> Scan:
        scan, pos = Scan(), 0
        while True:
            pos = section.find(self.OPEN, pos)
            if pos < 0:
                return scan
            body = pos + len(self.OPEN)
            close = section.find(self.CLOSE, body)
            if close < 0 and not final:
                return scan  # the call is still being written
            try:  # an unclosed last call is accepted when its JSON is whole (vLLM's regex does so too)
                call = call_from(json.loads(section[body:] if close < 0 else section[body:close]))
            except json.JSONDecodeError:
                call = None
            if call is None:
                scan.malformed = True
                return scan
            scan.calls.append(call)
            scan.end = pos = len(section) if close < 0 else close + len(self.CLOSE)


class MistralParser(ToolParser):
    name = "mistral"
    MARKER, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (MARKER,)
    needs_special_tokens = True  # [TOOL_CALLS], [ARGS] and [CALL_ID] are special tokens of Mistral's tokenizers

    def scan(self, section: str, final: bool) -> Scan:
        pos = _skip_space(section, len(self.MARKER))
        if pos >= len(section):
            return Scan(malformed=final)
        if section[pos] == "[":  # v7 and before: a JSON array of calls
            return json_items(section, pos + 1, final, ",", "]", ("arguments", "parameters"))
        if section[pos] == "{":  # one bare object is accepted too
            return json_items(section, pos, final, ",", None, ("arguments", "parameters"))
        return self._named_calls(section, final)

    def _named_calls(self, section: str, final: bool) -> Scan:
        """v11+: each call is [TOOL_CALLS], the function's name (then [CALL_ID] and an id, v11), [ARGS] and
        the arguments' JSON object; the id is not kept (the server gives each call its own)."""
        scan, pos = Scan(), 0
        while section.startswith(self.MARKER, pos):
            head = pos + len(self.MARKER)
            args = section.find(self.ARGS, head)
            if args < 0:  # the name is still being written; at the end: a call without arguments
                scan.malformed = final
                return scan
            name = section[head:args].split(self.CALL_ID, 1)[0].strip()
            body = _skip_space(section, args + len(self.ARGS))
            try:
                obj, after = _DECODER.raw_decode(section, body)
            except json.JSONDecodeError:
                scan.malformed = final  # while streaming: the arguments are not complete yet
                return scan
            call = call_from({"name": name, "arguments": obj}) if name and not any(map(str.isspace, name)) else None
            if call is None:
                scan.malformed = True
                return scan
            scan.calls.append(call)
            scan.end = after
            pos = _skip_space(section, after)
        return scan  # what follows the calls (not a [TOOL_CALLS]) is dropped, as vLLM drops it


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    TAG = "<|python_tag|>"
    markers = (TAG,)
    needs_special_tokens = True  # <|python_tag|> is a special token of Llama 3's tokenizer

    def start(self, text: str) -> int | None:
        lead = _skip_space(text, 0)
        if text.startswith("{", lead):  # a JSON object as the whole answer is a call (vLLM's rule)
            return lead
        return super().start(text)

    def hold(self, text: str) -> int:
        if not text.strip():  # the answer may still begin with "{"
            return len(text)
        return super().hold(text)

    def scan(self, section: str, final: bool) -> Scan:
        pos = len(self.TAG) if section.startswith(self.TAG) else 0
        return json_items(section, pos, final, ";", None, ("parameters", "arguments"))


class RequiredArrayParser(ToolParser):
    """tool_choice="required": the constrained output is a JSON array of {"name", "parameters"}."""

    name = "required"
    markers = ("[",)

    def start(self, text: str) -> int | None:
        lead = _skip_space(text, 0)
        return lead if text.startswith("[", lead) else None

    def hold(self, text: str) -> int:
        return len(text) if not text.strip() else 0

    def scan(self, section: str, final: bool) -> Scan:
        return json_items(section, 1, final, ",", "]", ("parameters", "arguments"))


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, MistralParser, Llama3JsonParser)}


def get_parser(name: str) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]()


def detect_parser(template: str | None) -> str | None:
    """The parser a chat template's own tool-call format needs, from the markers it writes; None if none."""
    text = str(template or "")
    if HermesParser.OPEN in text:
        return HermesParser.name
    if MistralParser.MARKER in text:
        return MistralParser.name
    if Llama3JsonParser.TAG in text or ('"parameters"' in text and "ipython" in text):
        return Llama3JsonParser.name
    return None
