"""MetricsObserver and the collectors: feed real records, scrape the text exposition, check the numbers."""

from __future__ import annotations

import pytest
from live_telemetry_samples import queued_abort_record, replica_record, request_record, step_record
from live_telemetry_scrape import CONTRACT, scrape, value
from prometheus_client import CollectorRegistry

from telemetry.contract.hooks import EngineObserver, ObserverGuard, replay_request
from telemetry.metrics import MetricsObserver, ObserverFailuresCollector, RecorderStatsCollector


class FakeRecorderStats:
    """Stands in for telemetry.recorder.Recorder's counting surface only (no store involved)."""

    def __init__(self, stats):
        self._stats = stats

    def stats(self):
        return self._stats


def full_registry():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "tiny-llama", registry=registry)
    registry.register(RecorderStatsCollector(
        FakeRecorderStats({"requests": {"written": 5, "spooled": 2, "replayed": 2, "dropped": 1},
                           "steps": {"written": 40, "spooled": 0, "replayed": 0, "dropped": 0}}),
        "r0", "tiny-llama"))
    registry.register(ObserverFailuresCollector(lambda: 3, "r0", "tiny-llama"))
    return registry, observer


def test_every_contract_metric_is_exported_with_its_type_and_labels():
    registry, observer = full_registry()
    observer.on_replica_start(replica_record())
    observer.on_step(step_record(spec_proposed=4, spec_accepted=2, spec_per_pos=(1, 1, 0, 0)))
    replay_request(observer, request_record())
    observer.on_tokenization(True)
    s = scrape(registry)
    for name, kind in CONTRACT.items():
        assert s["__types__"].get(name) == kind, name
    ours = [n for n in s["__types__"] if n.startswith("infersight_")]
    assert sorted(ours) == sorted(CONTRACT), "no metric outside the contract"
    for name, samples in s.items():
        if name.startswith("infersight_"):
            for labels, _ in samples:
                assert labels["replica"] == "r0" and labels["model"] == "tiny-llama", name


def test_request_histograms_and_counters_agree_with_the_records():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    finished = [
        request_record("a", itls=(0.008, 0.02, 0.015), prompt_tokens=7, finish_reason="length"),
        request_record("b", queue=0.2, prefill=1.5, itls=(0.3,), prompt_tokens=120, finish_reason="stop"),
        request_record("c", itls=(), prompt_tokens=3, finish_reason="stop"),
        queued_abort_record("d"),
    ]
    for r in finished:
        replay_request(observer, r)
    s = scrape(registry)
    ids = dict(replica="r0", model="m")

    assert value(s, "infersight_request_success_total", finished_reason="stop", **ids) == 2
    assert value(s, "infersight_request_success_total", finished_reason="length", **ids) == 1
    assert value(s, "infersight_request_success_total", finished_reason="abort", **ids) == 1
    assert value(s, "infersight_request_success_total", finished_reason="error", **ids) == 0
    assert value(s, "infersight_generation_tokens_total", **ids) == sum(r.output_tokens for r in finished) == 7
    assert value(s, "infersight_prompt_tokens_total", **ids) == sum(r.prompt_tokens for r in finished)
    assert value(s, "infersight_request_generation_tokens_count", **ids) == 4
    assert value(s, "infersight_request_prompt_tokens_bucket", le="100.0", **ids) == 3  # 120 is above

    # TTFT / prefill / decode only for requests that produced a token; queue only for scheduled ones
    started = [r for r in finished if r.first_token_time > 0]
    assert value(s, "infersight_time_to_first_token_seconds_count", **ids) == 3
    assert value(s, "infersight_time_to_first_token_seconds_sum", **ids) == pytest.approx(
        sum(r.ttft_seconds for r in started))
    assert value(s, "infersight_request_queue_time_seconds_count", **ids) == 3
    assert value(s, "infersight_request_prefill_time_seconds_sum", **ids) == pytest.approx(0.03 + 1.5 + 0.03)
    assert value(s, "infersight_request_decode_time_seconds_sum", **ids) == pytest.approx(0.043 + 0.3)
    assert value(s, "infersight_e2e_request_latency_seconds_count", **ids) == 4
    assert value(s, "infersight_e2e_request_latency_seconds_sum", **ids) == pytest.approx(
        sum(r.e2e_seconds for r in finished))
    # b's TTFT (1.7 s) is above the 1 s bound; a's and c's (34 ms) are below 40 ms but above 20 ms
    assert value(s, "infersight_time_to_first_token_seconds_bucket", le="0.02", **ids) == 0
    assert value(s, "infersight_time_to_first_token_seconds_bucket", le="0.04", **ids) == 2
    assert value(s, "infersight_time_to_first_token_seconds_bucket", le="1.0", **ids) == 2
    assert value(s, "infersight_time_to_first_token_seconds_bucket", le="+Inf", **ids) == 3

    # one ITL per pair of consecutive tokens
    assert value(s, "infersight_inter_token_latency_seconds_count", **ids) == 3 + 1
    assert value(s, "infersight_inter_token_latency_seconds_sum", **ids) == pytest.approx(0.043 + 0.3)
    assert value(s, "infersight_inter_token_latency_seconds_bucket", le="0.01", **ids) == 1
    assert value(s, "infersight_inter_token_latency_seconds_bucket", le="0.025", **ids) == 3


def test_step_gauges_counters_and_host_overhead():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    steps = [
        step_record(0, duration=0.010, forward=0.008, running=2, waiting=5, used=8, free=56, cached=0,
                    prefix_query=32, prefix_hit=16),
        step_record(1, duration=0.020, forward=0.005, running=4, waiting=0, used=48, free=16, cached=6,
                    preempted=2, evictions=3, prefix_query=16, prefix_hit=0),
        step_record(2, duration=0.5, forward=0.0, phase="idle", running=4, waiting=0, used=48, free=16, cached=6),
    ]
    for r in steps:
        observer.on_step(r)
    s = scrape(registry)
    ids = dict(replica="r0", model="m")
    assert value(s, "infersight_num_requests_running", **ids) == 4
    assert value(s, "infersight_num_requests_waiting", **ids) == 0
    assert value(s, "infersight_kv_cache_usage_ratio", **ids) == pytest.approx(48 / 64)
    assert value(s, "infersight_kv_cache_blocks", state="used", **ids) == 48
    assert value(s, "infersight_kv_cache_blocks", state="free", **ids) == 16
    assert value(s, "infersight_kv_cache_blocks", state="cached", **ids) == 6
    assert value(s, "infersight_num_preemptions_total", **ids) == 2
    assert value(s, "infersight_kv_cache_evictions_total", **ids) == 3
    assert value(s, "infersight_prefix_cache_queries_total", **ids) == 48
    assert value(s, "infersight_prefix_cache_hits_total", **ids) == 16
    # the idle step is not a step of work: neither histogram sees it
    assert value(s, "infersight_step_duration_seconds_count", **ids) == 2
    assert value(s, "infersight_step_duration_seconds_sum", **ids) == pytest.approx(0.030)
    assert value(s, "infersight_step_host_overhead_ratio_sum", **ids) == pytest.approx(0.2 + 0.75)
    assert value(s, "infersight_step_host_overhead_ratio_bucket", le="0.2", **ids) == 1


def test_kv_usage_is_zero_not_an_error_without_blocks():
    registry = CollectorRegistry()
    MetricsObserver("r0", "m", registry=registry).on_step(step_record(used=0, free=0, cached=0, total=0))
    assert value(scrape(registry), "infersight_kv_cache_usage_ratio", replica="r0", model="m") == 0


def test_speculative_decoding_counters_per_position():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    # 2 sequences x 3 draft tokens; then 1 sequence x 3
    observer.on_step(step_record(0, running=2, spec_proposed=6, spec_accepted=3, spec_per_pos=(2, 1, 0), spec_drafts=2))
    observer.on_step(step_record(1, running=1, spec_proposed=3, spec_accepted=3, spec_per_pos=(1, 1, 1), spec_drafts=1))
    observer.on_step(step_record(2, running=1))  # no speculation this step
    s = scrape(registry)
    ids = dict(replica="r0", model="m")
    assert value(s, "infersight_spec_decode_num_drafts_total", **ids) == 3
    assert value(s, "infersight_spec_decode_num_draft_tokens_total", **ids) == 9
    assert value(s, "infersight_spec_decode_num_accepted_tokens_total", **ids) == 6
    per_pos = [value(s, "infersight_spec_decode_num_accepted_tokens_per_pos_total", position=p, **ids)
               for p in range(3)]
    assert per_pos == [3, 2, 1]


def test_tokenization_cache_counters():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    for hit in (False, True, True, False, True):
        observer.on_tokenization(hit)
    s = scrape(registry)
    assert value(s, "infersight_tokenization_cache_queries_total", replica="r0", model="m") == 5
    assert value(s, "infersight_tokenization_cache_hits_total", replica="r0", model="m") == 3


def test_replica_info_carries_identity_and_a_restart_replaces_it():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    observer.on_replica_start(replica_record(numa_mismatch=True, quantization="int8"))
    info = scrape(registry)["infersight_replica_info"]
    assert len(info) == 1
    labels, v = info[0]
    assert v == 1
    assert labels == {"replica": "r0", "model": "m", "version": "0.1.0", "config_hash": "cfg123",
                      "quantization": "int8", "speculative_mode": "none", "attention_backend": "torch",
                      "tokenizer_hash": "t" * 16, "chat_template_hash": "c" * 16, "numa_mismatch": "true"}
    observer.on_replica_start(replica_record(config_hash="cfg456"))
    info = scrape(registry)["infersight_replica_info"]
    assert [lbls["config_hash"] for lbls, _ in info] == ["cfg456"]


def test_queue_time_and_ttft_are_observed_when_they_happen_not_at_finish():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    r = request_record("long", queue=0.25, prefill=0.5, itls=(0.01,) * 50)
    ids = dict(replica="r0", model="m")
    observer.on_request_arrival(r.request_id, r.arrival_time, r.prompt_tokens, r.workload, None)
    assert value(scrape(registry), "infersight_request_queue_time_seconds_count", **ids) == 0
    observer.on_request_scheduled(r.request_id, r.scheduled_time)
    s = scrape(registry)
    assert value(s, "infersight_request_queue_time_seconds_count", **ids) == 1
    assert value(s, "infersight_request_queue_time_seconds_sum", **ids) == pytest.approx(0.25)
    assert value(s, "infersight_time_to_first_token_seconds_count", **ids) == 0
    observer.on_first_token(r.request_id, r.first_token_time)  # 50 tokens before the request ends
    s = scrape(registry)
    assert value(s, "infersight_time_to_first_token_seconds_count", **ids) == 1
    assert value(s, "infersight_time_to_first_token_seconds_sum", **ids) == pytest.approx(0.75)
    observer.on_request_finished(r)  # observed once, not again at finish
    s = scrape(registry)
    assert value(s, "infersight_time_to_first_token_seconds_count", **ids) == 1
    assert value(s, "infersight_request_queue_time_seconds_count", **ids) == 1
    assert observer._arrivals == {}  # nothing kept per request once it has its first token


def test_replicas_sharing_a_registry_keep_separate_series():
    registry = CollectorRegistry()
    a = MetricsObserver("r0", "m", registry=registry)
    b = MetricsObserver("r1", "m", registry=registry)
    replay_request(a, request_record("x"))
    replay_request(b, request_record("y"))
    replay_request(b, request_record("z", finish_reason="stop"))
    s = scrape(registry)
    assert value(s, "infersight_e2e_request_latency_seconds_count", replica="r0", model="m") == 1
    assert value(s, "infersight_e2e_request_latency_seconds_count", replica="r1", model="m") == 2


def test_an_unexpected_finish_reason_is_counted_under_its_name():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    replay_request(observer, request_record(finish_reason="timeout"))
    assert value(scrape(registry), "infersight_request_success_total",
                 replica="r0", model="m", finished_reason="timeout") == 1


def test_recorder_stats_collector_exports_each_table_and_survives_a_broken_source():
    registry, _ = full_registry()
    s = scrape(registry)
    ids = dict(replica="r0", model="tiny-llama")
    assert value(s, "infersight_telemetry_rows_written_total", table="requests", **ids) == 5
    assert value(s, "infersight_telemetry_rows_spooled_total", table="requests", **ids) == 2
    assert value(s, "infersight_telemetry_rows_replayed_total", table="requests", **ids) == 2
    assert value(s, "infersight_telemetry_rows_dropped_total", table="requests", **ids) == 1
    assert value(s, "infersight_telemetry_rows_written_total", table="steps", **ids) == 40

    def broken():
        raise RuntimeError("recorder gone")

    registry = CollectorRegistry()
    MetricsObserver("r0", "m", registry=registry).on_tokenization(True)
    registry.register(RecorderStatsCollector(broken, "r0", "m"))
    s = scrape(registry)  # the scrape itself still succeeds
    assert value(s, "infersight_tokenization_cache_hits_total", replica="r0", model="m") == 1
    assert "infersight_telemetry_rows_dropped_total" not in s


def test_observer_failures_counter_reads_a_guard():
    class Broken(EngineObserver):
        enabled = True

        def on_step(self, record):
            raise ValueError("bug in an observer")

    guard = ObserverGuard(Broken())
    registry = CollectorRegistry()
    registry.register(ObserverFailuresCollector(lambda: guard.failures, "r0", "m"))
    for i in range(3):
        guard.on_step(step_record(i))
    assert value(scrape(registry), "infersight_observer_failures_total", replica="r0", model="m") == 3


def test_gauges_follow_the_latest_step_when_a_state_comes_back():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    for running, used in ((2, 8), (2, 8), (5, 30), (2, 8)):
        observer.on_step(step_record(running=running, used=used, free=64 - used))
    s = scrape(registry)
    assert value(s, "infersight_num_requests_running", replica="r0", model="m") == 2
    assert value(s, "infersight_kv_cache_blocks", replica="r0", model="m", state="free") == 56


def test_engine_histogram_exposes_exactly_what_prometheus_clients_histogram_would():
    from prometheus_client import Histogram

    from telemetry.metrics.engine_histogram import EngineHistogram

    bounds = (0.001, 0.01, 0.1, 1.0)
    values = [0.0, 0.001, 0.0010001, 0.01, 0.05, 0.1, 0.7, 1.0, 3.0, 1e-9, 0.2]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = EngineHistogram("x_seconds", "doc", ("replica",), bounds, ours).labels("r0")
    b = Histogram("x_seconds", "doc", ("replica",), buckets=bounds, registry=theirs).labels("r0")
    many = values * 3  # past VECTORIZE_FROM: the numpy path, bounds and values equal to a bound included
    a.observe_many(values[:5])
    a.observe_many(many)
    for v in values[5:]:
        a.observe(v)
    for v in values + many:
        b.observe(v)
    got, want = scrape(ours), scrape(theirs)
    for sample in ("x_seconds_bucket", "x_seconds_count"):
        assert sorted(got[sample], key=repr) == sorted(want[sample], key=repr)
    assert value(got, "x_seconds_sum", replica="r0") == pytest.approx(value(want, "x_seconds_sum", replica="r0"))


def test_scraping_while_the_engine_thread_writes_is_safe():
    import threading

    registry = CollectorRegistry()
    observers = [MetricsObserver(f"r{i}", "m", registry=registry) for i in range(2)]
    stop, errors, scrapes = threading.Event(), [], [0]

    def scraper():
        try:
            while not stop.is_set():
                scrape(registry)
                scrapes[0] += 1
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    t = threading.Thread(target=scraper)
    t.start()
    try:
        for i in range(300):
            replay_request(observers[i % 2], request_record(f"q{i}", itls=(0.01,) * 20))
            observers[i % 2].on_step(step_record(i, running=i % 7))
    finally:
        stop.set()
        t.join()
    assert errors == [] and scrapes[0] > 0
    s = scrape(registry)
    assert value(s, "infersight_inter_token_latency_seconds_count", replica="r0", model="m") == 150 * 20


def test_steps_and_finished_requests_are_deferred_then_folded_in_batches_or_by_a_scrape():
    from telemetry.metrics.observer import FOLD_EVERY

    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    child = observer._step_duration
    for i in range(FOLD_EVERY - 1):
        observer.on_step(step_record(i, duration=0.01, forward=0.008))
    assert sum(child.counts) == 0  # deferred: the hook only queued them
    observer.on_step(step_record(FOLD_EVERY, duration=0.01, forward=0.008))
    assert sum(child.counts) == FOLD_EVERY  # the batch folded on the hook's own thread
    observer.on_step(step_record(FOLD_EVERY + 1, duration=0.01, forward=0.008, running=9))
    replay_request(observer, request_record("a", itls=(0.01, 0.02)))
    s = scrape(registry)  # the collection folds first: nothing hooked is missing from a scrape
    assert value(s, "infersight_step_duration_seconds_count", replica="r0", model="m") == FOLD_EVERY + 1
    assert value(s, "infersight_num_requests_running", replica="r0", model="m") == 9
    assert value(s, "infersight_inter_token_latency_seconds_count", replica="r0", model="m") == 2


def test_a_malformed_deferred_record_is_counted_and_the_others_still_fold():
    import dataclasses

    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "m", registry=registry)
    observer.on_step(dataclasses.replace(step_record(0), duration_seconds="slow"))  # cannot be compared
    observer.on_step(step_record(1, duration=0.01, forward=0.008))
    s = scrape(registry)
    assert observer.failures == 1
    assert value(s, "infersight_step_duration_seconds_count", replica="r0", model="m") == 1


def test_metrics_md_documents_every_metric_and_the_buckets_in_use():
    from pathlib import Path

    import telemetry
    from telemetry.metrics import buckets

    doc = (Path(telemetry.__file__).parent / "METRICS.md").read_text()
    for name in CONTRACT:
        assert f"`{name}`" in doc, name
    for bounds in (buckets.TTFT_SECONDS, buckets.ITL_SECONDS, buckets.REQUEST_SECONDS, buckets.STEP_SECONDS,
                   buckets.RATIO, buckets.TOKENS):
        assert ", ".join(f"{b:g}" for b in bounds) in doc
