"""One inter-token latency: the same requests seen in Streamlit, in the demo report and in a live
Prometheus scrape give the same ITL p50 / p99 for the same window.

A real replica (AsyncLLM on a tiny Llama behind the OpenAI server, telemetry wired as
`infersight serve` wires it) serves a mixed batch of requests; its recorder writes them to a
real sidecar, and its /metrics is scraped over HTTP. Streamlit's queries and the demo report's
run over that store: their quantiles must be equal (one SQL definition) and equal to the
definition in Python over the stored token times. Prometheus only has buckets: its `_count` and
`_sum` must be the number and the sum of the stored gaps, and its histogram_quantile (computed
as Prometheus does) must fall in the bucket that holds the exact quantile.
"""

from __future__ import annotations

import bisect
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboards import data, queries
from dashboards.console import demo_report
from telemetry.contract import derived
from telemetry.store.waiting import wait_for_requests

REPLICA = "itl-r0"
RUN = "itlrun"
ITL = "infersight_inter_token_latency_seconds"
# varied prompt and output lengths, a 1-token request (no gap) among them, four at a time:
# prefills land between other requests' decode steps, so gaps differ within a request
WORK = [("The quick brown fox jumps over the lazy dog. " * k, n)
        for k, n in [(1, 1), (3, 2), (1, 5), (6, 9), (2, 14), (1, 20), (8, 3), (2, 7), (4, 12), (1, 17)]]


@pytest.fixture(scope="module")
def served(tiny_llama, tmp_path_factory):
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer
    from telemetry.schema import migrate
    from telemetry.sidecar.process import start_sidecar
    from telemetry.store import open_store

    torch.set_num_threads(1)
    sidecar = start_sidecar(tmp_path_factory.mktemp("itl-sidecar"))
    store = open_store(sidecar.store_url)
    try:
        migrate(store)
        model = Path(tiny_llama).resolve().name
        config = EngineConfig(model=str(tiny_llama), max_model_len=512, num_kv_blocks=96, block_size=16,
                              max_num_seqs=4, replica_id=REPLICA)
        observer, parts = build_observer(REPLICA, model, store_target=sidecar.store_url,
                                         recorder_kwargs={"flush_interval": 0.2})
        engine = AsyncLLM(config, observer)
        app = build_app(ServedModel.from_engine(engine, created=int(time.time())), metrics_registry=parts.registry)
        start = time.time()
        with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            def send(i: int) -> dict:
                prompt, n = WORK[i]
                r = client.post("/v1/completions", headers={"X-Request-Id": f"{RUN}-{i}"}, json={
                    "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                    "return_metrics": True})
                r.raise_for_status()
                return r.json()

            with ThreadPoolExecutor(4) as pool:
                responses = list(pool.map(send, range(len(WORK))))
            scrape = client.get("/metrics").text
        parts.close()  # the recorder's final flush
        end = time.time() + 1.0
        assert wait_for_requests(store, RUN + "-", len(WORK)) == len(WORK)
        yield dict(store=store, start=start - 1.0, end=end, scrape=scrape, responses=responses)
    finally:
        store.close()
        sidecar.stop()


def stored_gaps(served) -> tuple[list[float], dict[str, list[float]]]:
    """Every per-gap ITL of the window's requests, from the stored token times, by the Python definition."""
    rows = served["store"].query_df(
        f"SELECT request_id, token_times FROM requests WHERE {queries.REQUEST_WINDOW} AND {queries.REPLICA_FILTER}",
        {"start": served["start"], "end": served["end"], "replicas": [REPLICA]})
    assert sorted(rows["request_id"]) == sorted(f"{RUN}-{i}" for i in range(len(WORK)))
    by_request = {r.request_id: [float(t) for t in r.token_times] for r in rows.itertuples()}
    return [g for times in by_request.values() for g in derived.itl_gaps(times)], by_request


def histogram(scrape: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets [(le, count)] ending with +Inf, _sum, _count) of REPLICA's series."""
    buckets, total, count = [], None, None
    for family in text_string_to_metric_families(scrape):
        if family.name != name:
            continue
        for s in family.samples:
            if s.labels.get("replica") != REPLICA:
                continue
            if s.name == name + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name == name + "_sum":
                total = s.value
            elif s.name == name + "_count":
                count = s.value
    assert buckets and total is not None and count is not None, f"{name} of {REPLICA} not in the scrape"
    return sorted(buckets), total, count


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile (promql/quantile.go, bucketQuantile) over cumulative buckets."""
    rank = q * buckets[-1][1]
    b = next((i for i, (_, c) in enumerate(buckets[:-1]) if c >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, count_below = (buckets[b - 1][0], buckets[b - 1][1]) if b > 0 else (0.0, 0.0)
    return start + (buckets[b][0] - start) * (rank - count_below) / (buckets[b][1] - count_below)


def bucket_of(value: float, bounds: list[float]) -> int:
    return bisect.bisect_left(bounds, value)  # the first `le` >= value, as the observer counts it


def test_streamlit_and_demo_report_show_the_same_per_gap_itl(served):
    gaps, _ = stored_gaps(served)
    exact = derived.quantiles(gaps)
    params = {"start": served["start"], "end": served["end"], "replicas": [REPLICA]}
    data.use_store(served["store"])
    try:
        health = data.query(queries.REPLICA_HEALTH, **params).set_index("replica_id")
        compare = data.query(queries.COMPARE_SUMMARY, start=params["start"], end=params["end"], a=[REPLICA], b=[])
    finally:
        data.use_store(None)
    report = demo_report.collect(served["store"], RUN, [REPLICA], served["start"])["replicas"].set_index("replica_id")

    streamlit = list(health.loc[REPLICA, "itl"])
    assert list(compare.set_index("side").loc["A", "itl"]) == streamlit
    assert list(report.loc[REPLICA, "itl"]) == streamlit  # one SQL definition: equal, not close
    assert streamlit == pytest.approx(exact, rel=1e-9, abs=1e-12)  # and the Python one agrees
    # the report prints these very numbers (ms) under its "itl p50 / p90 / p99" header
    text = demo_report.format_report(demo_report.collect(served["store"], RUN, [REPLICA], served["start"]))
    row = next(line.split() for line in text.splitlines() if line.startswith(REPLICA + " "))
    assert row[11:14] == [f"{v * 1000:.1f}" for v in streamlit]  # after req and the four availability shares

    # the data can tell the units apart: the per-request mean ITL has other quantiles
    _, by_request = stored_gaps(served)
    means = [derived.mean_itl(t) for t in by_request.values() if len(t) > 1]
    assert derived.quantiles(means) != pytest.approx(exact, rel=1e-3)


def test_prometheus_histogram_counts_the_same_gaps(served):
    gaps, _ = stored_gaps(served)
    buckets, total, count = histogram(served["scrape"], ITL)
    assert count == len(gaps) == sum(n - 1 for _, n in WORK)
    assert total == pytest.approx(sum(gaps), abs=1e-6 * len(gaps))  # float32 offsets in the store
    assert buckets[-1] == (math.inf, count)


@pytest.mark.parametrize("q", [0.5, 0.99])
def test_prometheus_quantile_lies_in_the_bucket_of_the_exact_one(served, q):
    gaps, _ = stored_gaps(served)
    buckets, _, _ = histogram(served["scrape"], ITL)
    bounds = [le for le, _ in buckets[:-1]]
    (exact,) = derived.quantiles(gaps, [q])
    estimate = histogram_quantile(q, buckets)
    # the exact value interpolates between two order statistics; Prometheus ranks by q * n, the
    # exact quantile by q * (n - 1): either may sit in the bucket of one of those two neighbours
    # (and a stored float32 offset may sit a hair across a bound from the observed float64 one)
    xs, pos = sorted(gaps), q * (len(gaps) - 1)
    near = [exact, xs[math.floor(pos)], xs[math.ceil(pos)]]
    allowed = {bucket_of(v + d, bounds) for v in near for d in (-1e-6, 0.0, 1e-6)}
    assert bucket_of(estimate, bounds) in allowed, (q, exact, estimate, bounds)
    assert bucket_of(exact, bounds) in allowed


def test_the_engine_reports_the_per_request_mean_of_the_same_gaps(served):
    _, by_request = stored_gaps(served)
    for i, response in enumerate(served["responses"]):
        times = by_request[f"{RUN}-{i}"]
        expected = derived.mean_itl(times, empty=0.0)
        assert response["metrics"]["mean_itl_seconds"] == pytest.approx(expected, abs=1e-6), i
