"""build_observer: one observer fanning out to guarded parts, a registry for /metrics, failures counted."""

from __future__ import annotations

import dataclasses
import time

import pytest
from live_telemetry_samples import replica_record, request_record, step_record
from live_telemetry_scrape import CONTRACT, scrape, value
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telemetry.replica_wiring import build_observer


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def drive(observer, n_requests=3):
    observer.on_replica_start(replica_record())
    for i in range(n_requests):
        r = request_record(f"req-{i}")
        observer.on_request_arrival(r.request_id, r.arrival_time, r.prompt_tokens, r.workload, None)
        observer.on_tokenization(i > 0)
        observer.on_step(step_record(i))
        observer.on_request_finished(r)


def test_metrics_and_tracing_parts_both_see_every_hook(spans):
    provider, exporter = spans
    observer, parts = build_observer("r0", "tiny-llama", tracer_provider=provider)
    assert observer.enabled and parts.recorder is None
    assert [type(p).__name__ for p in observer.observers] == ["MetricsObserver", "TracingObserver"]
    drive(observer, 3)
    s = scrape(parts.registry)
    assert value(s, "infersight_request_success_total", replica="r0", model="tiny-llama",
                 finished_reason="length") == 3
    assert value(s, "infersight_tokenization_cache_hits_total", replica="r0", model="tiny-llama") == 2
    assert value(s, "infersight_observer_failures_total", replica="r0", model="tiny-llama") == 0
    parts.tracing.flush()
    assert len([sp for sp in exporter.get_finished_spans() if sp.parent is None]) == 3
    parts.close()
    observer.close()  # the engine closing too is harmless


def test_a_failing_part_is_counted_and_does_not_starve_the_others(spans):
    provider, exporter = spans
    observer, parts = build_observer("r0", "m", tracer_provider=provider)
    broken = dataclasses.replace(request_record("bad"), token_times=[0.1, None])  # metrics cannot subtract None
    observer.on_request_finished(broken)
    observer.on_request_finished(request_record("good"))
    assert parts.failures() == 1
    s = scrape(parts.registry)
    assert value(s, "infersight_observer_failures_total", replica="r0", model="m") == 1
    parts.tracing.flush()
    assert {sp.attributes["gen_ai.response.id"] for sp in exporter.get_finished_spans() if sp.parent is None} == {
        "bad", "good"}


def test_metrics_off_and_tracing_off_leaves_only_the_failure_counter():
    observer, parts = build_observer("r0", "m", metrics=False)
    assert observer.enabled is False and observer.observers == [] and parts.tracing is None
    names = set(scrape(parts.registry)["__types__"])
    assert names == {"infersight_observer_failures_total"}


def test_bad_tracing_choice_is_a_clear_error():
    with pytest.raises(ValueError, match="exporter must be one of"):
        build_observer("r0", "m", tracing="zipkin")


def test_with_a_store_the_recorder_is_a_part_and_its_rows_are_exported(tmp_path):
    pytest.importorskip("telemetry.recorder")
    observer, parts = build_observer("r0", "tiny-llama", store_target=str(tmp_path / "store"))
    assert parts.recorder is not None
    try:
        drive(observer, 4)
        parts.recorder.flush()
        stats = parts.recorder.stats()
        s = scrape(parts.registry)
        assert set(CONTRACT) <= set(s["__types__"])
        assert value(s, "infersight_telemetry_rows_written_total", replica="r0", model="tiny-llama",
                     table="requests") == stats["requests"]["written"] == 4
    finally:
        parts.close()


def test_guarded_fan_out_calls_only_overriding_parts_in_order_and_isolates_failures(caplog):
    from telemetry.contract.hooks import EngineObserver, MultiObserver
    from telemetry.fan_out import GuardedFanOut

    calls = []

    class Steps(EngineObserver):
        enabled = True

        def on_step(self, record):
            calls.append(("steps", record.step_id))

    class Broken(EngineObserver):
        enabled = True

        def on_step(self, record):
            raise RuntimeError("boom")

        def close(self):
            calls.append(("broken", "close"))

    class Disabled(Steps):
        enabled = False

    fan = GuardedFanOut([Broken(), Steps(), Disabled()])
    assert isinstance(fan, MultiObserver) and fan.enabled
    assert [type(p).__name__ for p in fan.observers] == ["Broken", "Steps"]
    for i in range(3):
        fan.on_step(step_record(i))
    fan.on_tokenization(True)  # nobody overrides it: nothing runs, nothing fails
    fan.close()
    assert calls == [("steps", 0), ("steps", 1), ("steps", 2), ("broken", "close")]
    assert fan.failures == 3
    assert sum("Broken.on_step failed" in r.getMessage() for r in caplog.records) == 1  # logged once


@pytest.mark.parametrize("store_text", [False, True])
def test_store_text_reaches_the_recorder_the_one_place_that_decides(tmp_path, spans, store_text):
    from telemetry.store import open_store

    provider, exporter = spans
    data_dir = tmp_path / "store"
    observer, parts = build_observer("r0", "m", store_target=str(data_dir), store_text=store_text,
                                     tracer_provider=provider)
    sample = request_record("with-text")
    now = time.time() - sample.arrival_time  # a recent request (older rows are past the table's TTL)
    record = dataclasses.replace(sample, prompt_text="a secret prompt", output_text="a secret answer",
                                 prompt_text_hash="h" * 64, **{name: getattr(sample, name) + now for name in (
                                     "arrival_time", "scheduled_time", "first_token_time", "finish_time")})
    try:
        assert parts.recorder.store_text is store_text
        observer.on_request_finished(record)
        parts.recorder.flush()
        parts.tracing.flush()
    finally:
        parts.close()
    with open_store(data_dir) as store:
        row = store.query_df("SELECT prompt_text, output_text, prompt_text_hash FROM requests").iloc[0]
    stored = ("a secret prompt", "a secret answer") if store_text else ("", "")
    assert (row["prompt_text"], row["output_text"]) == stored and row["prompt_text_hash"] == "h" * 64
    # tracing never exports the text, whatever the recorder may store
    exported = [str(v) for sp in exporter.get_finished_spans() for v in sp.attributes.values()]
    assert exported and not [v for v in exported if "secret" in v]


def test_store_text_has_one_way_in():
    with pytest.raises(ValueError, match="store_text"):
        build_observer("r0", "m", store_target="/nonexistent", recorder_kwargs={"store_text": True})
