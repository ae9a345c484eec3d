"""The OpenAPI schema states what the server really answers.

FastAPI documents request-validation failures as 422 with its own error
shape; this server answers them with 400 in OpenAI's error format, so the
schema is rewritten to say so (clients and schemathesis read it).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None:
                    responses.setdefault("400", {"description": "invalid request",
                                                 "content": {"application/json": {"schema": _ERROR_REF}}})
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
