"""The OpenAPI schema states what the server really answers and accepts.

FastAPI documents request-validation failures as 422 with its own error
shape; this server answers them with 400 in OpenAI's error format, so the
schema is rewritten to say so (clients and schemathesis read it).

What a request may hold depends on the served model too: the schema nodes
protocol.py marks `x-infersight` get the served name (an enum of one), the
vocabulary's last token ID, the longest text that can fit the context and the
most tokens that can be generated, so a request valid by the schema is one the
server accepts (up to the context in tokens, which no schema can state).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from engine.serving.server.model_info import ServedModel
from engine.serving.server.text_check import TOKENIZE_HEADROOM
from engine.serving.server.tool_calls import openapi_keywords

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
MARK = "x-infersight"


def _served_keywords(served: ServedModel) -> dict[str, dict]:
    return {
        "model": {"enum": [served.name]},
        "token_id": {"maximum": served.vocab_size - 1},
        "prompt_text": {"maxLength": served.max_model_len * served.chars_per_token},
        "countable_text": {"maxLength": TOKENIZE_HEADROOM * served.max_model_len * served.chars_per_token},
        "new_tokens": {"maximum": served.max_model_len - 1},
        "token_id_keys": {"propertyNames": {"pattern": decimal_below(served.vocab_size)}},  # logit_bias
        **openapi_keywords(served),  # tools and tool_choice: as the chat template takes them
    }


def decimal_below(n: int) -> str:
    """A regex for the decimal strings of 0 .. n - 1 (no leading zeros), digit by digit under n - 1."""
    top = str(n - 1)
    if len(top) == 1:
        return f"^[0-{top}]$"
    shorter = ["0"] + [f"[1-9][0-9]{{{k - 1}}}" for k in range(1, len(top))]
    same = [top]
    for i, d in enumerate(top):  # the same length: equal to `top` up to i, then a smaller digit
        low = "1" if i == 0 else "0"
        if int(d) > int(low):
            same.append(f"{top[:i]}[{low}-{int(d) - 1}][0-9]{{{len(top) - i - 1}}}")
    return "^(" + "|".join(shorter + same) + ")$"


def fill_served_limits(node, keywords: dict[str, dict]) -> None:
    """Replace every `x-infersight` mark under `node` with the served model's keywords (in place)."""
    if isinstance(node, dict):
        kind = node.pop(MARK, None)
        if kind is not None:
            node.update(keywords[kind])
        for value in node.values():
            fill_served_limits(value, keywords)
    elif isinstance(node, list):
        for value in node:
            fill_served_limits(value, keywords)


def install_openapi(app: FastAPI, served: ServedModel | None = None) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None:
                    responses.setdefault("400", {"description": "invalid request (a prompt whose tokens and max_tokens "
                                                                "exceed the context: code context_length_exceeded)",
                                                 "content": {"application/json": {"schema": _ERROR_REF}}})
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        if served is not None:
            fill_served_limits(components, _served_keywords(served))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
