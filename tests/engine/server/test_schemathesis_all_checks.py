"""Every schemathesis check, hundreds of generated requests: the schema admits exactly what the server
accepts (valid data is answered 2xx, invalid data 4xx), no answer is a 5xx or off the schema, and
afterwards the replica still serves with every KV block back in the pool.

Excused from "valid data must be accepted", because no JSON Schema can state them: the context in
tokens (prompt tokens plus max_tokens; code context_length_exceeded), the two rules that relate
two fields, best_of >= n and no streaming when best_of > n (codes best_of_less_than_n, best_of_streamed),
and tools whose function names are unique (a property of one field across array items: duplicate_tool_name).
"""

from __future__ import annotations

import collections
from datetime import timedelta

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from metrics_scrape import scraped_metric

EXAMPLES_PER_OPERATION = 110  # x 3 POST operations: >= 300 per generation mode
EXCUSED_CODES = ("context_length_exceeded", "best_of_less_than_n", "best_of_streamed", "duplicate_tool_name")
REQUEST_TIMEOUT_S = 60  # a hung request fails the test instead of stalling it


@pytest.fixture(scope="module")
def observed_server(tiny_llama):
    """A replica with a 64-token context (generated requests often hit the limits) and its /metrics."""
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    observer, parts = build_observer("schemathesis", "tiny")
    engine = AsyncLLM(EngineConfig(model=str(tiny_llama), max_model_len=64, num_kv_blocks=32, max_num_seqs=4,
                                   replica_id="schemathesis"), observer)
    served = ServedModel.from_engine(engine, created=0)
    app = build_app(served, metrics_registry=parts.registry, metrics_observer=parts.metrics)
    with BackgroundServer(app) as server:
        yield server
    parts.close()


def accepts_valid_data_within_the_context(ctx, response, case):
    """positive_data_acceptance, but for a request past the context in tokens (see the module docstring)."""
    if response.status_code == 400:
        try:
            if response.json()["error"]["code"] in EXCUSED_CODES:
                return None
        except (ValueError, KeyError, TypeError):
            pass
    return positive_data_acceptance(ctx, response, case)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_all_checks_pass(observed_server, mode):
    url = observed_server.url
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    sent: collections.Counter = collections.Counter()
    for operation in schema.get_all_operations():
        op = operation.ok()
        if mode is GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # a GET without parameters has nothing to get wrong

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=timedelta(seconds=REQUEST_TIMEOUT_S),
                  derandomize=True, database=None, suppress_health_check=list(HealthCheck))
        def run(case):
            sent[op.label] += 1
            # every check schemathesis has, with the one excuse above in place of positive_data_acceptance
            case.call_and_validate(base_url=url, timeout=REQUEST_TIMEOUT_S,
                                   excluded_checks=[positive_data_acceptance],
                                   additional_checks=[accepts_valid_data_within_the_context])

        run()
    posts = {label: n for label, n in sent.items() if label.startswith("POST")}
    assert len(posts) == 4 and sum(posts.values()) >= 400, sent  # completions, chat, tokenize, detokenize

    # still serving, and nothing the generated requests did left a request or a KV block behind
    health = httpx.get(url + "/health", timeout=10).json()
    assert health["status"] == "ok"
    assert (health["running"], health["waiting"], health["in_flight"], health["kv_blocks_used"]) == (0, 0, 0, 0)
    assert scraped_metric(url, "infersight_kv_cache_usage_ratio") == 0.0
    assert scraped_metric(url, "infersight_num_requests_running") == 0.0
