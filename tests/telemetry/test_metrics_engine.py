"""A real workload through the engine: /metrics over HTTP and the span trees agree with what was served."""

from __future__ import annotations

import httpx
import pytest
import torch
from live_telemetry_scrape import CONTRACT
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from engine.core.llm import LLM
from telemetry.contract.hooks import EngineObserver, MultiObserver
from engine.core.sampling_params import SamplingParams
from telemetry.metrics import MetricsObserver
from telemetry.tracing import TracingObserver

torch.set_num_threads(1)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Collect(EngineObserver):
    """Keeps the engine's own records, to compare the metrics against."""

    enabled = True

    def __init__(self):
        self.steps, self.requests, self.tokenizations = [], [], []

    def on_step(self, record):
        self.steps.append(record)

    def on_request_finished(self, record):
        self.requests.append(record)

    def on_tokenization(self, cache_hit):
        self.tokenizations.append(cache_hit)


@pytest.fixture(scope="module")
def served(tiny_llama):
    registry = CollectorRegistry()
    metrics = MetricsObserver("r0", "tiny-llama", registry=registry)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingObserver("tiny-llama", replica_id="r0", tracer_provider=provider)
    collect = Collect()
    llm = LLM(tiny_llama, observer=MultiObserver([metrics, tracing, collect]), block_size=4, num_kv_blocks=256,
              served_model_name="tiny-llama")

    greedy = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 3, 9, 6)]
    outputs = llm.generate(["The quick brown fox", "What is 12 + 35?", [0, 17, 42, 99, 7]], greedy[:3],
                           use_tqdm=False)
    # the same prompt again: a tokenization-cache hit and a prefix-cache hit (its first block is cached)
    outputs += llm.generate(["The quick brown fox"], greedy[3], use_tqdm=False)
    engine = llm.engine
    engine.add_request("traced", "Hello there", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       trace_context={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}, stream=False)
    engine.add_request("aborted", [5, 6, 7], SamplingParams(max_tokens=50), stream=False)
    while not any(o.request_id == "traced" for o in outputs):  # "aborted" (50 tokens) is still running then
        outputs.extend(o for o in engine.step() if o.finished)
    aborted = engine.abort("aborted")
    assert aborted is not None and not engine.has_unfinished()
    outputs.append(aborted)
    tracing.flush()

    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).text
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    llm.engine.close()
    return dict(outputs=outputs, collect=collect, text=text, spans=exporter.get_finished_spans(), engine=engine)


def samples(text: str) -> tuple[dict, dict]:
    types, values = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name + ("_total" if family.type == "counter" else "")] = family.type
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("replica", "model"))))
            values[key] = s.value
    return types, values


def test_scrape_counts_agree_with_the_requests_served(served):
    types, values = samples(served["text"])
    outputs = served["outputs"]
    reasons = {}
    for o in outputs:
        reasons[o.finish_reason] = reasons.get(o.finish_reason, 0) + 1
    assert reasons.get("abort") == 1 and reasons.get("length") == 5
    for reason, n in reasons.items():
        assert values[("infersight_request_success_total", (("finished_reason", reason),))] == n
    generated = sum(len(o.token_ids) for o in outputs)
    assert values[("infersight_generation_tokens_total", ())] == generated == 6 + 3 + 6 + 9 + 4 + len(
        served["collect"].requests[-1].output_token_ids)
    assert values[("infersight_prompt_tokens_total", ())] == sum(len(o.prompt_token_ids) for o in outputs)
    started = [r for r in served["collect"].requests if r.first_token_time > 0]
    assert values[("infersight_time_to_first_token_seconds_count", ())] == len(started)
    assert values[("infersight_inter_token_latency_seconds_count", ())] == sum(
        len(r.token_times) - 1 for r in served["collect"].requests if r.token_times)
    for name, kind in CONTRACT.items():
        if not name.startswith("infersight_telemetry_rows") and name != "infersight_observer_failures_total":
            assert types.get(name) == kind, name


def test_step_and_tokenization_metrics_agree_with_the_engines_records(served):
    _, values = samples(served["text"])
    steps, collect = served["collect"].steps, served["collect"]
    work = [s for s in steps if s.phase != "idle"]
    assert values[("infersight_step_duration_seconds_count", ())] == len(work) > 0
    assert values[("infersight_step_duration_seconds_sum", ())] == pytest.approx(
        sum(s.duration_seconds for s in work))
    assert values[("infersight_prefix_cache_queries_total", ())] == sum(s.prefix_query_tokens for s in steps)
    assert values[("infersight_prefix_cache_hits_total", ())] == sum(s.prefix_hit_tokens for s in steps)
    assert values[("infersight_prefix_cache_hits_total", ())] > 0  # the repeated prompt shared its prefix
    assert values[("infersight_num_requests_running", ())] == steps[-1].num_running
    assert values[("infersight_kv_cache_blocks", (("state", "used"),))] == steps[-1].kv_blocks_used
    assert values[("infersight_tokenization_cache_queries_total", ())] == len(collect.tokenizations) > 0
    assert values[("infersight_tokenization_cache_hits_total", ())] == sum(collect.tokenizations) > 0
    info = [k for k in values if k[0] == "infersight_replica_info"]
    assert len(info) == 1 and ("config_hash", served["engine"].replica_record.config_hash) in info[0][1]


def test_one_span_tree_per_request_and_the_callers_parent(served):
    spans = served["spans"]
    roots = {s.attributes["gen_ai.response.id"]: s for s in spans if s.name.startswith("text_completion")}
    assert sorted(roots) == sorted(o.request_id for o in served["outputs"])
    children = {}
    for s in spans:
        if not s.name.startswith("text_completion"):
            children.setdefault(s.parent.span_id, []).append(s.name)
    finished = {o.request_id: o for o in served["outputs"]}
    records = {r.request_id: r for r in served["collect"].requests}
    for rid, root in roots.items():
        expected = ["decode", "prefill", "queue"] if records[rid].first_token_time else ["queue"]
        assert sorted(children[root.context.span_id]) == expected, rid
        assert root.attributes["gen_ai.usage.output_tokens"] == len(finished[rid].token_ids)
        assert tuple(root.attributes["gen_ai.response.finish_reasons"]) == (finished[rid].finish_reason,)
    assert tuple(roots["aborted"].attributes["gen_ai.response.finish_reasons"]) == ("abort",)
    traced = roots["traced"]
    assert format(traced.parent.span_id, "016x") == CALLER_SPAN
    record = next(r for r in served["collect"].requests if r.request_id == "traced")
    assert format(traced.context.trace_id, "032x") == record.trace_id == CALLER_TRACE
