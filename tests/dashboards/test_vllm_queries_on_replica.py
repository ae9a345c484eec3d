"""A vLLM user's dashboard and alerts, unchanged, on an infersight replica.

A real replica (AsyncLLM serving the reference model behind the OpenAI server, telemetry wired as
`infersight serve` wires it, vLLM's names on by default) serves completions and chats, some with
n=2 and some sharing a prefix; a real Prometheus scrapes its /metrics. Every expression of vLLM's
example Grafana dashboard, of its example alert rules and of the usual vLLM queries
(fixtures/vllm_grafana_queries.yml) must find live series there, with numbers in them. The same
Prometheus loads the rules that map vLLM replicas' series the other way (vllm_mapping.yml), as a mixed
fleet's does: they must leave the infersight replica alone.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
import yaml
from live_prometheus import running_prometheus

from dashboards.promql import metric_names
from dashboards.vllm_mapping import RECORDED_SCRAPE, RULES_FILE, scrape_samples

FIXTURE = yaml.safe_load((Path(__file__).parent / "fixtures" / "vllm_grafana_queries.yml").read_text())
MODEL = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models" / FIXTURE["model_name"]
EXPRESSIONS = ([(f"dashboard: {panel}", e) for panel, exprs in FIXTURE["dashboard"].items() for e in exprs]
               + [(f"alert: {name}", e) for name, e in FIXTURE["alerts"].items()]
               + [(f"common: {name}", e) for name, e in FIXTURE["common"].items()])
# no speculative decoding here: draft tokens 0, so their ratio is 0/0
MAY_BE_NAN = {"common: speculative acceptance rate"}
# names vLLM 0.32 itself renamed, which its example dashboard still queries (see the fixture's header)
FORMER_VLLM_NAMES = {"vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"}
PREFIX = "The committee met on Tuesday to review the quarterly figures and agree the plan. " * 2
WORK = [
    ("/v1/completions", {"prompt": PREFIX + "First,", "max_tokens": 8}),
    ("/v1/completions", {"prompt": PREFIX + "Second,", "max_tokens": 5, "n": 2, "temperature": 0.8, "seed": 1}),
    ("/v1/completions", {"prompt": PREFIX + "Third,", "max_tokens": 12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 6}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4,
                              "stream": True}),
]
# sent before Prometheus's first scrape: a series the server creates at its first increment (http_*, a
# finish reason) has no earlier sample to compute a rate from, on vLLM as here
WARMUP = [WORK[0], WORK[3]]
SENT = WARMUP + WORK
ENGINE_REQUESTS = sum(body.get("n", 1) for _, body in SENT)


def query(url: str, expr: str) -> dict:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]


def wait_for(url: str, expr: str, want: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        result = query(url, expr)["result"]
        value = float(result[0]["value"][1]) if result else None
        if value is not None and value >= want:
            return
        time.sleep(0.5)
    pytest.fail(f"prometheus: {expr} = {value}, waited for {want}")


@pytest.fixture(scope="module")
def prometheus_with_replica(tmp_path_factory):
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    config = EngineConfig(model=str(MODEL), num_kv_blocks=64, block_size=16, max_num_seqs=4,
                          replica_id="vq-r0")
    observer, parts = build_observer("vq-r0", FIXTURE["model_name"])  # as `infersight serve`: vLLM names on
    engine = AsyncLLM(config, observer)
    app = build_app(ServedModel.from_engine(engine, created=int(time.time())), metrics_registry=parts.registry,
                    metrics_observer=parts.metrics)
    try:
        with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            target = server.url.split("://", 1)[1]
            jobs = [{"job_name": "vllm", "honor_labels": True,
                     "static_configs": [{"targets": [target], "labels": {"replica": "vq-r0"}}]}]
            def send(work):
                for path, body in work:
                    r = client.post(path, json={"model": FIXTURE["model_name"], "temperature": 0.0, **body})
                    assert r.status_code == 200, r.text

            send(WARMUP)
            with running_prometheus(tmp_path_factory.mktemp("prometheus-vllm"), jobs, [RULES_FILE]) as url:
                wait_for(url, 'count_over_time(up{job="vllm"}[1m])', 2)
                send(WORK)
                wait_for(url, f'sum(vllm:e2e_request_latency_seconds_count{{model_name="{FIXTURE["model_name"]}"}})',
                         ENGINE_REQUESTS)
                wait_for(url, "sum(http_requests_total)", len(SENT))
                yield url
    finally:
        parts.close()


def test_the_fixture_is_vllm_032s_names():
    """Every name the fixture queries is one a real vLLM 0.32 exports (its recorded scrape), but the two
    it renamed: the fixture tests vLLM's names, not ours."""
    exported = {name for name, _, _ in scrape_samples(RECORDED_SCRAPE.read_text())}
    queried = {n for _, e in EXPRESSIONS for n in metric_names(e) if n.startswith(("vllm:", "http_"))}
    assert len(queried) > 25
    missing = {n for n in queried - exported if not n.startswith("vllm:spec_decode_")}  # no drafts on vLLM's CPU
    assert {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in missing} == FORMER_VLLM_NAMES


def test_the_dashboards_model_variable_lists_the_served_model(prometheus_with_replica):
    body = httpx.get(f"{prometheus_with_replica}/api/v1/label/model_name/values",
                     params={"match[]": '{__name__=~"vllm:.*"}'}, timeout=10).json()
    assert body["data"] == [FIXTURE["model_name"]]


@pytest.mark.parametrize("where,expr", EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_vllm_expression_finds_live_series(prometheus_with_replica, where, expr):
    result = query(prometheus_with_replica, expr)["result"]
    assert result, f"{where}: no series for {expr}"
    values = [float(r["value"][1]) for r in result]
    if where not in MAY_BE_NAN:
        assert not any(math.isnan(v) for v in values), f"{where}: {expr} = {values}"


def test_the_numbers_are_the_traffics(prometheus_with_replica):
    """The series carry what was served: the requests, the n=2 one once, its max_tokens, the HTTP requests."""
    url, m = prometheus_with_replica, f'{{model_name="{FIXTURE["model_name"]}"}}'
    assert float(query(url, f"sum(vllm:e2e_request_latency_seconds_count{m})")["result"][0]["value"][1]) \
        == ENGINE_REQUESTS
    assert float(query(url, f"sum(vllm:request_params_n_count{m})")["result"][0]["value"][1]) == len(SENT)
    assert float(query(url, f"sum(vllm:request_params_n_sum{m})")["result"][0]["value"][1]) == len(SENT) + 1
    assert float(query(url, f"sum(vllm:request_params_max_tokens_sum{m})")["result"][0]["value"][1]) \
        == sum(body["max_tokens"] * body.get("n", 1) for _, body in SENT)
    assert float(query(url, 'sum(http_requests_total{status="2xx"})')["result"][0]["value"][1]) == len(SENT)
    finished = query(url, f"sum(vllm:request_success_total{m})")["result"][0]["value"][1]
    assert float(finished) == ENGINE_REQUESTS


def test_the_vllm_mapping_rules_leave_an_infersight_replica_alone(prometheus_with_replica):
    """A mixed fleet's Prometheus loads vllm_mapping.yml: its rules, evaluated, record nothing from this
    replica's vLLM names (that would be a second, 'vllm' identity and infersight_* series over its own)."""
    url = prometheus_with_replica
    deadline = time.monotonic() + 60
    while True:
        groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        evaluated = rules and all(r["health"] == "ok" and not r["lastEvaluation"].startswith("0001") for r in rules)
        if evaluated:
            break
        assert time.monotonic() < deadline, [(r["name"], r["health"], r.get("lastError")) for r in rules]
        time.sleep(0.5)
    assert len(rules) > 30
    info = query(url, 'infersight_replica_info{replica="vq-r0"}')["result"]
    assert [r["metric"]["version"] for r in info] != [] and all(r["metric"]["version"] != "vllm" for r in info)
    # the replica's own series, once: nothing recorded beside them
    assert len(query(url, 'infersight_num_requests_running{replica="vq-r0"}')["result"]) == 1


def test_the_token_bounds_end_at_the_models_context_length(prometheus_with_replica):
    """As vLLM's: 1, 2, 5 ... up to max_model_len (256 here), whether or not the replica was given one
    (the server tells the metrics the engine's)."""
    result = query(prometheus_with_replica, 'vllm:request_prompt_tokens_bucket{model_name="target"}')["result"]
    assert sorted(float(r["metric"]["le"]) for r in result) == [1, 2, 5, 10, 20, 50, 100, 200, float("inf")]
