"""TracingObserver: span trees, GenAI attributes, W3C parents; the SDK's in-memory exporter and a real OTLP receiver."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from live_telemetry_samples import queued_abort_record, request_record
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from telemetry.tracing import OPERATION_KEY, TracingObserver, traces_url

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = TracingObserver("tiny-llama", replica_id="r0", tracer_provider=provider)
    return observer, exporter


def finished(observer, exporter):
    observer.flush()  # spans are built on the observer's worker thread
    return exporter.get_finished_spans()


def run_request(observer, record, trace_context=None):
    observer.on_request_arrival(record.request_id, record.arrival_time, record.prompt_tokens,
                                record.workload, trace_context)
    observer.on_request_finished(record)


def tree(spans):
    """{root span: [children sorted by start]} for each root in `spans`."""
    by_parent: dict = {}
    for s in spans:
        by_parent.setdefault(s.parent.span_id if s.parent else None, []).append(s)
    roots = [s for s in spans if s.parent is None or s.parent.span_id not in {x.context.span_id for x in spans}]
    return {root: sorted(by_parent.get(root.context.span_id, []), key=lambda s: s.start_time) for root in roots}


def test_one_span_tree_per_request_with_phase_children_at_the_record_times(traced):
    observer, exporter = traced
    record = request_record("req-1")
    run_request(observer, record)
    spans = finished(observer, exporter)
    assert len(spans) == 4
    (root, children), = tree(spans).items()
    assert root.name == "text_completion tiny-llama"
    assert [c.name for c in children] == ["queue", "prefill", "decode"]
    assert all(c.context.trace_id == root.context.trace_id for c in children)
    ns = lambda t: int(t * 1e9)  # noqa: E731
    assert (root.start_time, root.end_time) == (ns(record.arrival_time), ns(record.finish_time))
    queue, prefill, decode = children
    assert (queue.start_time, queue.end_time) == (ns(record.arrival_time), ns(record.scheduled_time))
    assert (prefill.start_time, prefill.end_time) == (ns(record.scheduled_time), ns(record.first_token_time))
    assert (decode.start_time, decode.end_time) == (ns(record.first_token_time), ns(record.finish_time))
    assert prefill.attributes["gen_ai.usage.input_tokens"] == record.prompt_tokens
    assert decode.attributes["gen_ai.usage.output_tokens"] == record.output_tokens


def test_genai_and_infersight_attributes(traced):
    observer, exporter = traced
    record = request_record("req-2", prompt_tokens=9, cached_tokens=4, preemptions=1, workload="agent",
                            finish_reason="stop",
                            sampling={"temperature": 0.5, "top_p": 0.8, "top_k": -1, "max_tokens": 32, "seed": None})
    run_request(observer, record)
    (root, _), = tree(finished(observer, exporter)).items()
    a = dict(root.attributes)
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.system"] == a["gen_ai.provider.name"] == "infersight"
    assert a["gen_ai.request.model"] == "tiny-llama"
    assert a["gen_ai.request.max_tokens"] == 32
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == 0.8
    assert "gen_ai.request.top_k" not in a  # -1: off
    assert "gen_ai.request.seed" not in a  # None: unseeded
    assert a["gen_ai.usage.input_tokens"] == 9
    assert a["gen_ai.usage.output_tokens"] == record.output_tokens == 4
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert a["gen_ai.response.id"] == "req-2"
    assert a["infersight.replica.id"] == "r0"
    assert a["infersight.request.cached_tokens"] == 4
    assert a["infersight.request.preemptions"] == 1
    assert a["infersight.workload"] == "agent"
    assert a["infersight.ttft_seconds"] == pytest.approx(record.ttft_seconds)
    assert a["infersight.e2e_seconds"] == pytest.approx(record.e2e_seconds)
    assert root.status.status_code == StatusCode.UNSET

    run_request(observer, request_record("req-3", sampling={"top_k": 40, "seed": 7, "temperature": 0}))
    root3 = next(s for s in finished(observer, exporter) if s.attributes.get("gen_ai.response.id") == "req-3")
    assert (root3.attributes["gen_ai.request.top_k"], root3.attributes["gen_ai.request.seed"]) == (40, 7)
    assert root3.attributes["gen_ai.request.temperature"] == 0


def test_callers_traceparent_makes_the_request_span_its_child(traced):
    observer, exporter = traced
    record = request_record("req-4", trace_id=CALLER_TRACE)
    run_request(observer, record, {"traceparent": TRACEPARENT, OPERATION_KEY: "chat"})
    (root, children), = tree(finished(observer, exporter)).items()
    assert root.parent is not None and root.parent.is_remote
    assert format(root.parent.span_id, "016x") == CALLER_SPAN
    assert format(root.context.trace_id, "032x") == CALLER_TRACE == record.trace_id
    assert root.name == "chat tiny-llama"
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert len(children) == 3



def test_without_a_caller_the_root_takes_the_records_trace_id(traced):
    observer, exporter = traced
    engine_trace = "0af7651916cd43dd8448eb211c80319c"
    run_request(observer, request_record("req-5", trace_id=engine_trace))
    run_request(observer, request_record("req-6", trace_id=""))  # untraced: a fresh random id
    roots = {s.attributes["gen_ai.response.id"]: s for s in finished(observer, exporter) if s.parent is None}
    assert format(roots["req-5"].context.trace_id, "032x") == engine_trace
    assert roots["req-6"].context.trace_id not in (0, int(engine_trace, 16))


def test_a_malformed_traceparent_is_ignored_not_fatal(traced):
    observer, exporter = traced
    run_request(observer, request_record("req-7"), {"traceparent": "not-a-traceparent"})
    (root, children), = tree(finished(observer, exporter)).items()
    assert root.parent is None and len(children) == 3


def test_queued_abort_has_only_a_queue_child_and_an_error_sets_status(traced):
    observer, exporter = traced
    run_request(observer, queued_abort_record("req-8"))
    (root, children), = tree(finished(observer, exporter)).items()
    assert [c.name for c in children] == ["queue"]
    assert children[0].end_time == root.end_time
    assert root.attributes["gen_ai.usage.output_tokens"] == 0
    exporter.clear()

    run_request(observer, request_record("req-9", finish_reason="error", error="RuntimeError: CUDA OOM"))
    (root, _), = tree(finished(observer, exporter)).items()
    assert root.status.status_code == StatusCode.ERROR
    assert root.attributes["error.type"] == "RuntimeError"


def test_interleaved_requests_get_separate_trees_and_no_context_leaks(traced):
    observer, exporter = traced
    records = [request_record(f"req-{i}", arrival=1_700_000_000.0 + i) for i in range(5)]
    for r in records:
        observer.on_request_arrival(r.request_id, r.arrival_time, r.prompt_tokens, r.workload,
                                    {"traceparent": TRACEPARENT} if r.request_id == "req-2" else None)
    for r in reversed(records):
        observer.on_request_finished(r)
    trees = tree(finished(observer, exporter))
    assert len(trees) == 5 and all(len(children) == 3 for children in trees.values())
    parented = [root for root in trees if root.parent is not None]
    assert [root.attributes["gen_ai.response.id"] for root in parented] == ["req-2"]
    assert observer._carriers == {}


def test_pending_contexts_are_bounded():
    provider = TracerProvider()
    observer = TracingObserver("m", tracer_provider=provider, max_pending=3)
    for i in range(5):
        observer.on_request_arrival(f"q{i}", 0.0, 1, "", {"traceparent": TRACEPARENT})
    assert list(observer._carriers) == ["q2", "q3", "q4"] and observer.dropped_contexts == 2


def test_exporter_choice_and_bad_configuration():
    assert TracingObserver("m", exporter="none").enabled is False
    console = TracingObserver("m", exporter="console")
    assert console.enabled is True
    console.close()
    with pytest.raises(ValueError, match="exporter must be one of"):
        TracingObserver("m", exporter="jaeger")
    with pytest.raises(ValueError, match="OTLP endpoint"):
        TracingObserver("m", exporter="otlp", otlp_endpoint="localhost:4318")
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"


def test_otlp_http_export_reaches_a_real_receiver():
    received: list[ExportTraceServiceRequest] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            message = ExportTraceServiceRequest()
            message.ParseFromString(body)
            received.append((self.path, message))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        observer = TracingObserver("tiny-llama", replica_id="r9", exporter="otlp", otlp_endpoint=endpoint)
        run_request(observer, request_record("otlp-1"), {"traceparent": TRACEPARENT})
        observer.close()  # flushes the batch processor
    finally:
        server.shutdown()
        server.server_close()
    spans = [(rs.resource, span) for _, msg in received for rs in msg.resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    assert {path for path, _ in received} == {"/v1/traces"}
    assert sorted(span.name for _, span in spans) == ["decode", "prefill", "queue", "text_completion tiny-llama"]
    resource, root = next((res, s) for res, s in spans if s.name.startswith("text_completion"))
    assert root.trace_id.hex() == CALLER_TRACE and root.parent_span_id.hex() == CALLER_SPAN
    attributes = {kv.key: kv.value for kv in root.attributes}
    assert attributes["gen_ai.response.id"].string_value == "otlp-1"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 4
    assert {kv.key: kv.value.string_value for kv in resource.attributes}["service.instance.id"] == "r9"


def test_spans_built_inline_or_in_the_background_are_the_same(traced):
    observer, exporter = traced
    inline = TracingObserver("tiny-llama", replica_id="r0", tracer_provider=observer.provider, background=False)
    run_request(inline, request_record("inline", trace_id=CALLER_TRACE))
    assert observer._worker is None and len(exporter.get_finished_spans()) == 4  # no flush needed
    run_request(observer, request_record("queued", trace_id=CALLER_TRACE))
    spans = finished(observer, exporter)
    shape = {r: ([c.name for c in children], {k: v for k, v in r.attributes.items() if k != "gen_ai.response.id"})
             for r, children in tree(spans).items()}
    (a, b) = shape.values()
    assert a == b


def test_a_full_queue_drops_and_counts_and_a_bad_record_is_counted(traced):
    observer, exporter = traced
    full = TracingObserver("m", tracer_provider=observer.provider, max_queued=0)
    run_request(full, request_record("dropped"))
    assert full.dropped_spans == 1 and finished(full, exporter) == ()

    bad = request_record("bad")
    bad.arrival_time = None  # cannot become a timestamp
    run_request(observer, bad)
    run_request(observer, request_record("after"))  # the worker lives on
    roots = [s for s in finished(observer, exporter) if s.parent is None]
    assert observer.failures == 1
    assert [r.attributes["gen_ai.response.id"] for r in roots] == ["after"]
    observer.close()
    run_request(observer, request_record("late"))  # after close: counted, not queued
    assert observer.dropped_spans == 1


def test_the_worker_builds_in_batches_not_woken_per_request(traced):
    import time

    observer, exporter = traced
    batched = TracingObserver("tiny-llama", replica_id="r0", tracer_provider=observer.provider,
                              build_interval=3600, wake_rows=2)
    run_request(batched, request_record("first"))
    assert exporter.get_finished_spans() == ()  # queued: nothing wakes the worker for one request
    run_request(batched, request_record("second"))  # the second reaches wake_rows: both are built now
    deadline = time.monotonic() + 30
    while len(exporter.get_finished_spans()) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    roots = sorted(s.attributes["gen_ai.response.id"] for s in exporter.get_finished_spans() if s.parent is None)
    assert roots == ["first", "second"]
    run_request(batched, request_record("third"))
    assert len(finished(batched, exporter)) == 12  # flush() builds what waits without the interval
    batched.close()
