"""The OpenAPI schema is valid and honest (a bounded schemathesis run finds no 5xx and no
undocumented status or shape), and the optional API key guards /v1/*."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)


@pytest.fixture(scope="module")
def small_server(tiny_llama):
    """Its own engine with a 64-token context: generated requests stay short, and often hit the limits."""
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    torch.set_num_threads(1)
    engine = AsyncLLM(EngineConfig(model=str(tiny_llama), max_model_len=64, num_kv_blocks=32, max_num_seqs=4))
    served = ServedModel.from_engine(engine, created=0)
    with BackgroundServer(build_app(served)) as server:
        yield server


def test_openapi_schema_is_valid(live):
    raw = httpx.get(live.url + "/openapi.json").json()
    schema = schemathesis.openapi.from_dict(raw)
    schema.validate()  # against the OpenAPI meta-schema
    paths = raw["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(paths)
    responses = paths["/v1/completions"]["post"]["responses"]
    assert "400" in responses and "422" not in responses  # what the server really answers


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_no_server_errors(small_server, mode):
    """Valid and invalid requests generated from the schema: never a 5xx, and every answer as documented."""
    schema = schemathesis.openapi.from_url(small_server.url + "/openapi.json")
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    for operation in schema.get_all_operations():
        op = operation.ok()
        if mode is GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # nothing to get wrong in a GET without parameters

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            case.call_and_validate(base_url=small_server.url, checks=checks)

        run()


def test_api_key(live, tiny_llama):
    """A second app on the same engine, with a key: /v1/* needs it, /health and /metrics do not."""
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer

    app = build_app(live.served, api_key="s3cret", metrics_registry=live.parts.registry, manage_engine=False)
    with BackgroundServer(app) as server:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}]:
            r = httpx.get(server.url + "/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(server.url + "/v1/completions", json={"model": live.served.name, "prompt": "x"})
        assert r.status_code == 401
        assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 200
