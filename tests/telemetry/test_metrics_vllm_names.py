"""vLLM's names, labels, types and bucket boundaries on a replica's /metrics (telemetry/metrics/vllm_names.py),
checked against vLLM itself: the vLLM 0.32 installed in .venv-vllm and a real scrape of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboards.vllm_mapping import RECORDED_SCRAPE
from engine.serving.vllm_adapter.launch import vllm_missing, vllm_python
from telemetry.contract.hooks import replay_request
from telemetry.metrics import MetricsObserver, vllm_buckets
from telemetry.metrics.vllm_fold import request_params
from telemetry.metrics.vllm_names import FORMER_NAMES, vllm_family_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))
from live_metrics import replica, request, step  # noqa: E402  (the records the dashboards' live exporter uses)

# a vLLM histogram family -> ours, and the family of vllm/v1/metrics/buckets.py its bounds come from
BUCKET_FAMILIES = {
    "request_latency": vllm_buckets.REQUEST_LATENCY, "time_to_first_token": vllm_buckets.TIME_TO_FIRST_TOKEN,
    "inter_token_latency": vllm_buckets.INTER_TOKEN_LATENCY, "iteration_tokens": vllm_buckets.ITERATION_TOKENS,
    "request_params_n": vllm_buckets.REQUEST_PARAMS_N,
    "request_num_preemptions": vllm_buckets.REQUEST_NUM_PREEMPTIONS,
}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def vllm_recorded() -> dict:
    # (that vLLM exported `*_created` series, which the parser reads as gauges of their own; we switch them off)
    return {name: f for name, f in families(RECORDED_SCRAPE.read_text()).items()
            if name.startswith("vllm:") and not name.endswith("_created")}


def fed_registry(max_model_len: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "target", registry=registry)
    start = replica("r0")
    start.config_json = json.dumps({"max_model_len": max_model_len, "block_size": 16})
    observer.on_replica_start(start)
    MetricsObserver("r1", "target", registry=registry).on_replica_start(replica("r1"))  # a second engine
    for i in range(3):
        observer.on_step(step(i))
        replay_request(observer, request(i))
    observer.fold()
    return registry


def test_the_bucket_bounds_are_the_installed_vllms():
    if vllm_missing():
        pytest.skip(vllm_missing())
    code = ("import json; from vllm.v1.metrics.buckets import histogram_buckets as h; "
            f"print(json.dumps({{k: h(k) for k in {sorted(BUCKET_FAMILIES)}}} | {{'request_tokens': h('request_tokens', "
            "max_model_len=131072)}))")
    out = subprocess.run([str(vllm_python()), "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    for family, ours in BUCKET_FAMILIES.items():
        assert [float(b) for b in theirs[family]] == [float(b) for b in ours], family
    assert theirs["request_tokens"] == list(vllm_buckets.request_tokens(131072))


def test_every_family_vllm_exports_has_its_name_type_labels_and_bounds():
    """Name by name against a real vLLM 0.32 scrape: the same type, the same labels, the same `le`
    bounds (the token histograms' follow max_model_len, as vLLM's do)."""
    theirs = vllm_recorded()
    max_model_len = int(max(float(s.labels["le"]) for s in theirs["vllm:request_prompt_tokens"].samples
                            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"))
    ours = {name: f for name, f in families(generate_latest(fed_registry(max_model_len)).decode()).items()
            if name.startswith("vllm:")}
    shared = set(ours) & set(theirs)
    # all that vLLM's CPU build exported there but its GPU-only, connector, multimodal and sleep families
    assert set(theirs) - shared == {
        "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu", "vllm:estimated_write_bytes_per_gpu",
        "vllm:engine_sleep_state", "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
        "vllm:mm_cache_queries", "vllm:mm_cache_hits", "vllm:prompt_tokens_cached_by_source"}
    assert set(ours) - shared == FORMER_NAMES | {n.removesuffix("_total") for n in vllm_family_names()
                                                 if n.startswith("vllm:spec_decode_")}
    for name in sorted(shared):
        a, b = ours[name], theirs[name]
        assert a.type == b.type, name
        label_names = {k for s in a.samples for k in s.labels if k != "le"}
        their_labels = {k for s in b.samples for k in s.labels if k != "le"}
        if name == "vllm:cache_config_info":  # vLLM's CacheConfig has ~35 keys; ours are a subset of them
            assert label_names < their_labels
        else:
            assert label_names == their_labels, name
        if a.type == "histogram":
            def bounds(family):
                return sorted({s.labels["le"] for s in family.samples
                               if s.name.endswith("_bucket") and s.labels["engine"] == "0"})
            assert bounds(a) == bounds(b), name


def test_the_views_count_what_the_infersight_families_count():
    """One set of observations, two exports: counts and sums agree, and a vLLM bound that infersight
    does not export (TTFT le=0.25) is exact, because the children keep both bound sets."""
    text = generate_latest(fed_registry(512)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}

    def value(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    ours, theirs = {"replica": "r0", "model": "target"}, {"model_name": "target", "engine": "0"}
    for a, b in [("infersight_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
                 ("infersight_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"),
                 ("infersight_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
                 ("infersight_request_prompt_tokens", "vllm:request_prompt_tokens")]:
        assert value(a + "_count", **ours) == value(b + "_count", **theirs) > 0
        assert value(a + "_sum", **ours) == value(b + "_sum", **theirs)
    # every TTFT is 0.05 s: under vLLM's 0.08 bound, over its 0.04; the e2e (0.09 s) under its first, 0.3
    assert value("vllm:time_to_first_token_seconds_bucket", le="0.04", **theirs) == 0
    assert value("vllm:time_to_first_token_seconds_bucket", le="0.06", **theirs) == 3
    assert value("vllm:e2e_request_latency_seconds_bucket", le="0.3", **theirs) == 3
    assert value("vllm:prompt_tokens_total", **theirs) == value("infersight_prompt_tokens_total", **ours)
    assert value("vllm:num_requests_running", **theirs) == value("infersight_num_requests_running", **ours) == 2
    assert value("vllm:request_success_total", finished_reason="stop", **theirs) == 3
    assert value("vllm:request_success_total", finished_reason="repetition", **theirs) == 0
    # vLLM-only series, from the records: 4 of each request's 5 prompt tokens were cached
    assert value("vllm:prompt_tokens_cached_total", **theirs) == 12
    assert value("vllm:prompt_tokens_by_source_total", source="local_cache_hit", **theirs) == 12
    assert value("vllm:prompt_tokens_by_source_total", source="local_compute", **theirs) == 3
    assert value("vllm:request_prefill_kv_computed_tokens_sum", **theirs) == 3
    # decode 0.04 s over 2 gaps: 0.02 s per output token; inference = scheduled -> finish = 0.08 s
    assert value("vllm:request_time_per_output_token_seconds_sum", **theirs) == pytest.approx(0.06)
    assert value("vllm:request_inference_time_seconds_sum", **theirs) == pytest.approx(0.24)
    assert value("vllm:iteration_tokens_total_count", **theirs) == 3
    assert value("vllm:request_params_n_sum", **theirs) == 3
    # a second replica on the registry is engine "1": no two series share their labels
    assert value("vllm:num_requests_running", model_name="target", engine="1") == 0


def test_the_token_bounds_follow_the_replicas_max_model_len():
    text = generate_latest(fed_registry(512)).decode()
    les = [s.labels["le"] for f in text_string_to_metric_families(text) if f.name == "vllm:request_prompt_tokens"
           for s in f.samples if s.name.endswith("_bucket") and s.labels["engine"] == "0"]
    assert les == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "+Inf"]


def test_off_means_infersight_names_only():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "target", registry=registry, vllm_names=False)
    replay_request(observer, request(0))
    assert "vllm:" not in generate_latest(registry).decode()


def test_n_choices_are_one_request_for_n_and_the_longest_generation():
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "target", registry=registry)
    for k, tokens in enumerate((3, 7)):
        r = request(0)
        r.request_id, r.output_tokens = f"cmpl-9-{k}", tokens
        r.sampling_params_json = json.dumps({"n": 2, "max_tokens": 8}, sort_keys=True)
        replay_request(observer, r)
    observer.fold()
    fam = families(generate_latest(registry).decode())
    got = {s.name: s.value for s in fam["vllm:request_params_n"].samples if "_bucket" not in s.name}
    assert got == {"vllm:request_params_n_count": 1, "vllm:request_params_n_sum": 2}
    got = {s.name: s.value for s in fam["vllm:request_max_num_generation_tokens"].samples if "_bucket" not in s.name}
    assert got == {"vllm:request_max_num_generation_tokens_count": 1, "vllm:request_max_num_generation_tokens_sum": 7}
    got = {s.name: s.value for s in fam["vllm:request_params_max_tokens"].samples if "_bucket" not in s.name}
    assert got == {"vllm:request_params_max_tokens_count": 2, "vllm:request_params_max_tokens_sum": 16}


JSON_SCALARS = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["n", "max_tokens", "best_of", "x", "{", '"n": 1']),
                                             inner, max_size=3), max_leaves=8)
PARAMS = st.dictionaries(st.sampled_from(["n", "max_tokens", "best_of", "stop", "logit_bias", "response_format",
                                          "temperature", "a", "z"]), JSON_VALUES, max_size=6)


@settings(max_examples=300, deadline=None)
@given(params=PARAMS, sort_keys=st.booleans(), compact=st.booleans())
def test_request_params_read_the_top_level_keys_whatever_the_json(params, sort_keys, compact):
    """The fast path (a regex) and the parse agree on every JSON object: nested keys named n or max_tokens,
    keys inside strings, floats, booleans and negative numbers are not the request's parameters."""
    text = json.dumps(params, sort_keys=sort_keys, separators=(",", ":") if compact else None)

    def top(key):
        v = params.get(key)
        return v if type(v) is int and v >= 0 else None

    n = top("n") or 1
    assert request_params(text) == (n, top("max_tokens"), max(n, top("best_of") or n))


def test_metrics_md_lists_every_vllm_family():
    text = (Path(__file__).resolve().parents[2] / "telemetry" / "METRICS.md").read_text()
    names = vllm_family_names()
    assert len(names) > 30
    assert [n for n in names if f"`{n}`" not in text] == []
