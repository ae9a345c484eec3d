"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Every failure a client can cause becomes a 4xx with a message that says what
is wrong; nothing a client sends may reach the generic 500 path.
"""

from __future__ import annotations

import json
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
                 detail: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers  # e.g. Retry-After on a 429 / 503
        # numbers for the request's row, not the client (a length refusal's prompt length and limit, the
        # queue's state when shed): engine/serving/server/rejections.py
        self.detail = detail

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


ROW_DETAIL = "infersight_row_detail"  # the request's scope state: what its row records beside the error body


def note_detail(scope, detail: dict) -> None:
    """Numbers for the row of a request the server refuses (engine/serving/server/rejections.py writes it)."""
    scope.setdefault("state", {}).setdefault(ROW_DETAIL, {}).update(detail)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(message: str, status: int = 400, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


_SURROGATE = re.compile("[\ud800-\udfff]")


def first_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (a str Python's json makes of "\\ud800"), or None."""
    bad = _SURROGATE.search(text)
    return None if bad is None else bad.start()


def invalid_unicode(path: str, text: str, position: int) -> APIError:
    return APIError(f"{path}: invalid Unicode at character {position}: U+{ord(text[position]):04X} is a lone "
                    "surrogate (half of a UTF-16 pair), not a character; send valid UTF-8 text",
                    param=path, code="invalid_unicode")


# fields that accept several shapes: one message instead of one per rejected shape
_UNION_HINTS = {
    "prompt": "must be a string or a list of token IDs (non-negative integers)",
    "stop": "must be a string or a list of strings",
    "content": "must be a string or a list of {\"type\": \"text\", \"text\": ...} parts",
    "tool_choice": "must be a string or an object",
}
_TYPE_TAGS = ("str", "int", "list[", "dict[", "function-", "constrained-", "nullable[", "union[")


def _field_path(loc: list[str]) -> str:
    return ".".join(x for x in loc if not x.startswith(_TYPE_TAGS) and x not in ("TextPart",))


def _json_path(loc) -> str:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content' (as text_check names fields)."""
    path = ""
    for x in loc:
        if isinstance(x, int):
            path += f"[{x}]"
        elif x != "body" and not x.startswith(_TYPE_TAGS) and x != "TextPart":
            path += f".{x}" if path else x
    return path


def _unicode_error(errors: list[dict]) -> APIError | None:
    """pydantic refuses some strings holding a lone surrogate itself (those it must measure): the same 400
    as text_check's."""
    for e in errors:
        text = e.get("input")
        if e.get("type") == "string_unicode" and isinstance(text, str) and first_surrogate(text) is not None:
            return invalid_unicode(_json_path(e.get("loc", ())), text, first_surrogate(text))
    return None


def _describe_validation(errors: list[dict]) -> tuple[str, str | None, str]:
    """pydantic errors -> (message, param, code) a person can act on."""
    parts: list[str] = []
    param, code = None, "invalid_value"
    seen_unions: set[str] = set()
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        kind = e.get("type", "")
        if param is None and loc and kind != "json_invalid":  # a JSON error's loc is a byte offset
            param = loc[0]
        if kind in ("json_invalid", "json_type"):
            ctx = e.get("ctx", {}) or {}
            why = str(ctx.get("error", e.get("msg", "")))
            if kind == "json_invalid" and loc and loc[0].isdigit():  # json's own message leaves out where
                why = f"{why.removesuffix(' at')} at offset {loc[0]}"
            parts.append(f"request body is not valid JSON ({why})")
            code = "invalid_json"
        elif not loc and kind in ("model_attributes_type", "dict_type", "model_type"):
            parts.append("the request body must be a JSON object")
        elif kind == "extra_forbidden":
            parts.append(f"unrecognized request argument: {_field_path(loc)}")
            code = "unsupported_parameter"
        elif kind == "missing":
            parts.append(f"missing required parameter: {_field_path(loc) or 'body'}")
            code = "missing_parameter"
        else:
            tag = next((i for i, x in enumerate(loc) if x.startswith(_TYPE_TAGS)), None)
            if tag is not None:  # a union field: one line for it, not one per rejected shape
                field = _field_path(loc[:tag])
                if field not in seen_unions:
                    seen_unions.add(field)
                    hint = _UNION_HINTS.get(field.split(".")[-1], f"invalid value ({e.get('msg', '')})")
                    parts.append(f"{field}: {hint}")
                continue
            parts.append(f"{_field_path(loc) or 'body'}: {e.get('msg', 'invalid value')}")
    if len(parts) > 5:
        parts = parts[:5] + [f"... and {len(parts) - 5} more"]
    return "; ".join(parts) or "invalid request", param, code


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        if exc.detail:
            note_detail(request.scope, exc.detail)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        content_type = request.headers.get("content-type", "")
        if content_type and "json" not in content_type and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
            return error_response(f"the body must be JSON, sent with 'Content-Type: application/json' "
                                  f"(got {content_type!r})", 400, code="invalid_content_type")
        bad_text = _unicode_error(errors)
        if bad_text is not None:
            return JSONResponse(bad_text.body(), status_code=400)
        message, param, code = _describe_validation(errors)
        return error_response(message, 400, param=param, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):  # FastAPI's "There was an error parsing the body"
            return error_response(f"the request body is not valid {cause.encoding.upper()} (byte "
                                  f"0x{cause.object[cause.start]:02x} at offset {cause.start}): send JSON "
                                  "encoded as UTF-8", 400, code="invalid_encoding")
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error serving %s", request.url.path)
        return error_response(f"internal server error: {type(exc).__name__}", 500, type="internal_error")


def sse_error(message: str, type: str = "internal_error", code: str | None = None) -> str:
    return f"data: {json.dumps(error_body(message, type, None, code))}\n\n"
