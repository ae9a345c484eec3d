"""OpenAI `tools` / `tool_choice` on /v1/chat/completions, as vLLM serves them.

Request side (admission calls `plan_tools`, then `constrain`):
- The chat template renders the tools itself (`apply_chat_template(..., tools=...)`). Whether it does
  is found by rendering a probe tool and looking for its name in the text (cached per template): a
  template that ignores `tools` is a 400 that says so, never a silently tool-less prompt.
- Each tool is checked (type "function", a name OpenAI allows - protocol.FUNCTION_NAME, unique,
  `parameters` a valid JSON Schema) and `tool_choice` too (a named function must be one of the tools):
  400s naming the field. `openapi_keywords` publishes what these checks accept, as far as JSON Schema
  can state it, per served model (no tools at all where the template does not render them).
- tool_choice: default "auto" when tools are given. "none": the tools are still rendered (vLLM's
  default, so the prompt is the same whatever the choice) and the output is plain content. "auto":
  the output is parsed by the format's parser (tool_parsers.py: `--tool-call-parser`, else detected
  from the template). A named function: decoding is constrained to that function's `parameters`
  schema and the whole output is its arguments. "required": constrained to vLLM's schema, a JSON
  array (minItems 1) of {"name": one tool's name, "parameters": its schema}, turned into calls.
  Constraints go through SamplingParams.response_format ({"type": "json_schema", ...}).
- The request's tools hash (sha256 of their canonical JSON) and tool choice go into its
  SamplingParams, so the store's sampling_params_json tells which requests carried which tools.

Response side: `tool_message` rewrites a finished choice (content -> `message.tool_calls`,
finish_reason "tool_calls" where the model called tools and stopped by itself; a named function's
finish_reason stays as the engine ended it, as OpenAI's and vLLM's do); tool_stream.py does it for
streamed chunks.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass

from engine.serving.server.errors import APIError
from engine.serving.server.protocol import FUNCTION_NAME
from engine.serving.server.tool_parsers import RequiredArrayParser, ToolParser, detect_parser, get_parser

_NAME = re.compile(FUNCTION_NAME)
_PROBE = "infersight_probe_tool_3f9a"
PARSER_KEY = "tool_call_parser"  # ServedModel.extra: the --tool-call-parser name given at serve time


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[dict]  # as the template renders them
    tools_hash: str
    parser: ToolParser | None = None  # auto: the format's parser; required: the JSON array's
    function: str | None = None  # named: the function every output calls

    @property
    def choice(self) -> str:  # what the request record keeps
        return f"function:{self.function}" if self.mode == "named" else self.mode

    @property
    def keeps_special_tokens(self) -> bool:  # the format's marker is a special token
        return self.mode == "auto" and self.parser is not None and self.parser.needs_special_tokens


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def call_json(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------- the template and the parser


_renders: dict[tuple[int, str], bool] = {}
_renders_lock = threading.Lock()


def template_renders_tools(tokenizer) -> bool:
    """Does this tokenizer's chat template write the tools it is given into the prompt?"""
    key = (id(tokenizer), str(getattr(tokenizer, "chat_template_hash", "")))
    with _renders_lock:
        if key in _renders:
            return _renders[key]
    probe = [{"type": "function", "function": {"name": _PROBE, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=False, tools=probe)
        found = _PROBE in text
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        found = False
    with _renders_lock:
        _renders[key] = found
    return found


def parser_name(served) -> tuple[str | None, str]:
    """(the parser's name or None, where it came from) for this served model."""
    given = (served.extra or {}).get(PARSER_KEY)
    if given:
        return given, "--tool-call-parser"
    return detect_parser(getattr(served.tokenizer, "chat_template", None)), "detected from the chat template"


def describe(served) -> str:
    """The start summary's line about tool calls."""
    if not template_renders_tools(served.tokenizer):
        return ("tool calls: not available (this model's chat template does not render `tools`; requests "
                "with tools get a 400 unless tool_choice is 'none')")
    name, source = parser_name(served)
    if name is None:
        return ("tool calls: the chat template renders tools, but no parser was detected: tool_choice 'auto' "
                "gets a 400 (give --tool-call-parser); 'required' and named functions are constrained")
    return f"tool calls: parser {name} ({source})"


# ---------------------------------------------------------------- the published schema


# what the checks below accept, as far as JSON Schema can say it (not: names unique, `parameters` a valid
# JSON Schema, a named function among the tools, tool_choice only with tools, "auto" only with a parser)
TOOL_SCHEMA = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": FUNCTION_NAME},
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]}}}}}
NAMED_CHOICE = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": FUNCTION_NAME}}}}}


def openapi_keywords(served) -> dict[str, dict]:
    """The schema of `tools` and `tool_choice` for this served model (engine/serving/server/openapi.py fills them in):
    a template that does not render tools takes them only with tool_choice 'none' (and tool_choice null or
    'none' only)."""
    if not template_renders_tools(served.tokenizer):
        return {"tools": {"items": TOOL_SCHEMA}, "tool_choice": {"anyOf": [{"const": "none"}, {"type": "null"}]},
                "tools_without_template": {
                    "if": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
                    "then": {"properties": {"tool_choice": {"const": "none"}}, "required": ["tool_choice"]}}}
    modes = ["none", "auto", "required"] if parser_name(served)[0] is not None else ["none", "required"]
    return {"tools": {"items": TOOL_SCHEMA}, "tools_without_template": {},
            "tool_choice": {"anyOf": [{"enum": modes}, NAMED_CHOICE, {"type": "null"}]}}


# ---------------------------------------------------------------- request checks


def _check_schema(schema, path: str) -> None:
    if not isinstance(schema, dict):
        raise APIError(f"{path} must be a JSON Schema object, got {type(schema).__name__}", param="tools")
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:  # without jsonschema: the shape only (xgrammar rejects the rest when compiling)
        kind = schema.get("type")
        types = {"object", "array", "string", "number", "integer", "boolean", "null"}
        if kind is not None and not (kind in types if isinstance(kind, str) else
                                     isinstance(kind, list) and set(kind) <= types):
            raise APIError(f"{path}: invalid JSON Schema: unknown type {kind!r}", param="tools") from None
        return
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        raise APIError(f"{path}: invalid JSON Schema: {e.message}", param="tools") from None


def _check_tools(tools: list) -> list[dict]:
    names = set()
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise APIError(f"{param}.type must be 'function'", param="tools")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise APIError(f"{param}.function must be an object with a name", param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise APIError(f"{param}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                           param="tools")
        if name in names:
            raise APIError(f"{param}.function.name {name!r} is given twice", param="tools", code="duplicate_tool_name")
        names.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise APIError(f"{param}.function.description must be a string", param="tools")
        if fn.get("parameters") is not None:
            _check_schema(fn["parameters"], f"{param}.function.parameters")
    return tools


def _tool_choice(choice, names: list[str]) -> tuple[str, str | None]:
    """(mode, function name) of a tool_choice; tools are given."""
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise APIError(f"tool_choice names the function {name!r}, which is not among the tools "
                           f"({', '.join(names)})", param="tool_choice", code="unknown_tool")
        return "named", name
    raise APIError("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}", param="tool_choice")


def tools_hash(tools: list[dict]) -> str:
    return hashlib.sha256(json.dumps(tools, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def plan_tools(req, served) -> ToolPlan | None:
    """The request's tool plan, or None without tools; a 400 for what cannot be served."""
    if not req.tools:
        if req.tool_choice not in (None, "none"):
            raise APIError("tool_choice requires tools: give the functions the model may call in `tools`",
                           param="tool_choice")
        return None
    if not template_renders_tools(served.tokenizer):
        if req.tool_choice == "none":  # the model may not call them: answered as without tools, as vLLM does
            _check_tools(req.tools)
            return None
        raise APIError("tools: tool calling is not supported by this model: its chat template does not render "
                       "`tools`; serve a model whose chat template does (its chat_template.jinja, e.g. Qwen2.5's "
                       "or Hermes', or give one with --chat-template), or send tool_choice 'none'", param="tools",
                       code="unsupported_parameter")
    tools = _check_tools(req.tools)
    names = [t["function"]["name"] for t in tools]
    mode, function = _tool_choice(req.tool_choice, names)
    parser = None
    if mode == "auto":
        name, _ = parser_name(served)
        if name is None:
            raise APIError("tool_choice 'auto': no tool-call parser is known for this model's chat template; "
                           "start the server with --tool-call-parser NAME (hermes, mistral, llama3_json), or use "
                           "tool_choice 'required' or a named function", param="tool_choice",
                           code="unsupported_parameter")
        parser = get_parser(name)
    elif mode == "required":
        parser = RequiredArrayParser()
    forced = mode in ("named", "required")
    if forced and req.response_format is not None and req.response_format.type != "text":
        raise APIError("response_format cannot be given with a tool_choice that forces a call (both constrain "
                       "the output)", param="response_format")
    return ToolPlan(mode, tools, tools_hash(tools), parser, function)


def _function_schema(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def forced_format(mode: str, function: str | None, tools: list[dict]) -> dict | None:
    """The response_format a forced call decodes under (None unless tool_choice forces one); the proxy
    records the same for the requests it passes on (engine/serving/proxy/request_row.py)."""
    if mode == "named":
        tool = next(t for t in tools if t["function"]["name"] == function)
        return {"type": "json_schema", "json_schema": {"name": function, "schema": _function_schema(tool)}}
    if mode == "required":  # vLLM's schema for tool_choice="required"
        one_of = [{"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                  "parameters": _function_schema(t)},
                   "required": ["name", "parameters"]} for t in tools]
        return {"type": "json_schema", "json_schema": {
            "name": "tool_calls", "schema": {"type": "array", "minItems": 1,
                                             "items": {"type": "object", "anyOf": one_of}}}}
    return None


def recorded_tool_fields(tools, tool_choice) -> dict:
    """What a request with `tools` adds to its recorded sampling params (tools_hash, tool_choice and a
    forced call's response_format), from the raw body; {} for a body the server would refuse."""
    if not tools or not isinstance(tools, list):
        return {}
    try:
        checked = _check_tools(tools)
        mode, function = _tool_choice(tool_choice, [t["function"]["name"] for t in checked])
    except APIError:
        return {}
    plan = ToolPlan(mode, checked, tools_hash(checked), function=function)
    fields = {"tools_hash": plan.tools_hash, "tool_choice": plan.choice}
    forced = forced_format(mode, function, checked)
    if forced is not None:
        fields["response_format"] = forced
    return fields


def constrain(params, plan: ToolPlan) -> None:
    """Record the tools in the SamplingParams; a forced call constrains decoding (response_format)."""
    params.tools_hash, params.tool_choice = plan.tools_hash, plan.choice
    forced = forced_format(plan.mode, plan.function, plan.tools)
    if forced is not None:
        params.response_format = forced
    try:  # the constraint is checked as a client's response_format is (its grammar must compile)
        params.validate()
    except ValueError as e:
        raise APIError(f"tools: the function's parameters cannot constrain decoding: {e}", param="tools") from None


# ---------------------------------------------------------------- conversation messages


def _arguments_for_template(arguments):
    """vLLM hands templates the arguments as an object (templates `tojson` them); text that is not a
    JSON object stays text (templates such as Qwen2.5's print a string as it is)."""
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        return value if isinstance(value, dict) else arguments
    return arguments


def template_message(message, text: str) -> dict:
    """A request message as the chat template reads it: role, content text, and where given the
    assistant's tool calls, a tool result's tool_call_id and name."""
    out = {"role": message.role, "content": text}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": c.type,
                              "function": {"name": c.function.name,
                                           "arguments": _arguments_for_template(c.function.arguments)}}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.role == "tool" and message.name is not None:
        out["name"] = message.name
    return out


# ---------------------------------------------------------------- the response


def message_and_finish(plan: ToolPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """A finished choice's `message` and finish_reason from the output text."""
    if plan.mode == "named":
        return {"role": "assistant", "content": None,
                "tool_calls": [call_json(new_call_id(), plan.function, text)]}, finish_reason
    if plan.parser is None:  # "none": plain content
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = plan.parser.extract(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    message = {"role": "assistant", "content": content,
               "tool_calls": [call_json(new_call_id(), c.name, c.arguments) for c in calls]}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


def tool_response(plan: ToolPlan, body: dict) -> dict:
    """A whole chat.completion body with each choice's tool calls parsed out (in place)."""
    for choice in body.get("choices", []):
        choice["message"], choice["finish_reason"] = message_and_finish(
            plan, choice["message"]["content"] or "", choice["finish_reason"])
    return body
