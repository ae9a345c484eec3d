"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Every failure a client can cause becomes a 4xx with a message that says what
is wrong; nothing a client sends may reach the generic 500 path.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(message: str, status: int = 400, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


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


def _describe_validation(errors: list[dict]) -> tuple[str, str | None, str]:
    """pydantic errors -> (message, param, code) a person can act on."""
    parts: list[str] = []
    param, code = None, "invalid_value"
    seen_unions: set[str] = set()
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        kind = e.get("type", "")
        if param is None and loc:
            param = loc[0]
        if kind in ("json_invalid", "json_type"):
            ctx = e.get("ctx", {}) or {}
            parts.append(f"request body is not valid JSON ({ctx.get('error', e.get('msg', ''))})")
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
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        content_type = request.headers.get("content-type", "")
        if content_type and "json" not in content_type and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
            return error_response(f"the body must be JSON, sent with 'Content-Type: application/json' "
                                  f"(got {content_type!r})", 400, code="invalid_content_type")
        message, param, code = _describe_validation(errors)
        return error_response(message, 400, param=param, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error serving %s", request.url.path)
        return error_response(f"internal server error: {type(exc).__name__}", 500, type="internal_error")


def sse_error(message: str, type: str = "internal_error", code: str | None = None) -> str:
    return f"data: {json.dumps(error_body(message, type, None, code))}\n\n"
