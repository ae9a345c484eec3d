"""vLLM's metric names and labels for what infersight measures, beside the `infersight_*` names.

A vLLM user's Grafana dashboards and alerts query `vllm:*` series labelled `model_name` and
`engine` (vLLM 0.32: vllm/v1/metrics/loggers.py). A replica exports them too, so that those
dashboards work unchanged on it (telemetry/METRICS.md lists every name and where it comes from).

Most families here are views, built at scrape time from what the `infersight_*` families already
hold: counters and gauges re-labelled, histograms re-bucketed from children that keep both bucket
sets (engine_histogram.py). The engine thread pays nothing for them. The series vLLM has and
infersight had not (time per output token, inference time, iteration tokens, request parameters,
per-request preemptions, prefill KV computed, cached prompt tokens) have sources of their own,
fed in the observer's fold (vllm_fold.py).

`engine` is vLLM's data-parallel engine index within one server. A replica is one engine: "0",
and a second replica on the same registry (tests, a local fleet in one process) is "1", so that no
two series have the same labels.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from telemetry.metrics import vllm_buckets as vb
from telemetry.metrics.definitions import FINISH_REASONS as OBSERVER_FINISH_REASONS
from telemetry.metrics.definitions import EngineMetrics, engine_metrics
from telemetry.metrics.engine_histogram import EngineHistogram, HistogramView

VLLM_LABELS = ("model_name", "engine")
SOURCE_LABELS = ("replica", "model")  # the sources' children: keyed as the infersight families
TOKENS_KEPT = vb.request_tokens(vb.TOKENS_KEPT_UP_TO)
DEFAULT_MAX_MODEL_LEN = 100_000  # token bounds until the replica's start says its max_model_len

# vLLM's reasons, all present from the start as in vLLM (a `sum by (finished_reason)` panel lists them)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")  # infersight's scheduler defers nothing: all wait for capacity
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")  # infersight's queue limit counts requests
# names vLLM renamed and no longer exports (0.32), which its example Grafana dashboard still queries
FORMER_NAMES = {"vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"}


class Expanded:
    """A counter or gauge family re-exported from an infersight one at scrape time.

    `expand(labels, value)` gives the (vLLM label values, value) samples one source sample becomes
    (none, one, or several: a reason that infersight never has is a 0). Samples landing on the same
    labels are summed (vLLM's admission counter has no `engine` label)."""

    def __init__(self, sources: Iterable, name: str, documentation: str, kind: str, labelnames: Iterable[str],
                 expand: Callable[[dict, float], Iterable[tuple[tuple[str, ...], float]]], registry):
        self.sources = tuple(sources)
        self.name = name.removesuffix("_total") if kind == "counter" else name
        self.documentation = documentation
        self.kind = kind
        self.labelnames = tuple(labelnames)
        self.expand = expand
        registry.register(self)

    def _family(self):
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        return cls(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterator:
        yield self._family()

    def collect(self) -> Iterator:
        values: dict[tuple[str, ...], float] = {}
        for source in self.sources:
            for metric in source.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_created"):
                        continue
                    for labels, value in self.expand(sample.labels, sample.value):
                        values[labels] = values.get(labels, 0.0) + value
        family = self._family()
        for labels, value in sorted(values.items()):
            family.add_metric(labels, value)
        yield family


class VllmFamilies:
    """Every `vllm:*` family on one registry (one per registry: see `vllm_families`)."""

    def __init__(self, registry: CollectorRegistry, m: EngineMetrics):
        self.registry = registry
        self._engines: dict[str, str] = {}
        self._lock = threading.Lock()
        ids = self.ids

        # -- histograms: views of the infersight families' children ---------------------------------
        def view(source, name, doc, bounds):
            return HistogramView(source, name, doc, VLLM_LABELS, bounds, ids, registry)

        view(m.ttft, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             vb.TIME_TO_FIRST_TOKEN)
        view(m.itl, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             vb.INTER_TOKEN_LATENCY)
        # the name vLLM's example Grafana dashboard still queries (vLLM renamed it inter_token_latency): one per gap
        view(m.itl, "vllm:time_per_output_token_seconds",
             "Histogram of time per output token in seconds (the former name of vllm:inter_token_latency_seconds).",
             vb.INTER_TOKEN_LATENCY)
        view(m.e2e, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             vb.REQUEST_LATENCY)
        view(m.queue, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
             vb.REQUEST_LATENCY)
        view(m.prefill, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
             vb.REQUEST_LATENCY)
        view(m.decode, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
             vb.REQUEST_LATENCY)
        self.token_views = [
            view(m.request_prompt_tokens, "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                 vb.request_tokens(DEFAULT_MAX_MODEL_LEN)),
            view(m.request_generation_tokens, "vllm:request_generation_tokens",
                 "Number of generation tokens processed.", vb.request_tokens(DEFAULT_MAX_MODEL_LEN)),
        ]

        # -- histograms infersight had not: sources fed by vllm_fold.py ------------------------------
        def source(name, doc, bounds, kept=None):
            hist = EngineHistogram(name, doc, SOURCE_LABELS, kept or bounds, None)
            hist_view = view(hist, name, doc, bounds)
            return hist, hist_view

        self.tpot, _ = source("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", vb.INTER_TOKEN_LATENCY)
        self.inference, _ = source("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", vb.REQUEST_LATENCY)
        self.iteration_tokens, _ = source("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", vb.ITERATION_TOKENS)
        self.params_n, _ = source("vllm:request_params_n", "Histogram of the n request parameter.",
                                  vb.REQUEST_PARAMS_N)
        self.num_preemptions, _ = source("vllm:request_num_preemptions",
                                         "Histogram of the number of times a request was preempted.",
                                         vb.REQUEST_NUM_PREEMPTIONS)
        default_tokens = vb.request_tokens(DEFAULT_MAX_MODEL_LEN)
        self.max_num_generation_tokens, view_a = source(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            default_tokens, TOKENS_KEPT)
        self.params_max_tokens, view_b = source(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", default_tokens,
            TOKENS_KEPT)
        self.prefill_kv_computed, view_c = source(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", default_tokens,
            TOKENS_KEPT)
        self.token_views += [view_a, view_b, view_c]

        # -- counters and gauges: re-labelled at scrape time ----------------------------------------
        def same(name, doc, kind, *sources):
            return Expanded(sources, name, doc, kind, VLLM_LABELS,
                            lambda labels, value: [(self.labels_of(labels), value)], registry)

        same("vllm:num_requests_running", "Number of requests in model execution batches.", "gauge", m.running)
        same("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge", m.waiting)
        Expanded([m.waiting], "vllm:num_requests_waiting_by_reason",
                 "Number of waiting requests by reason. Sum of all reasons equals vllm:num_requests_waiting.",
                 "gauge", VLLM_LABELS + ("reason",),
                 lambda labels, value: [(self.labels_of(labels) + (reason,), value if reason == "capacity" else 0.0)
                                        for reason in WAITING_REASONS], registry)
        same("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", m.kv_usage)
        # the name vLLM's example Grafana dashboard still queries (vLLM renamed it kv_cache_usage_perc)
        same("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (the former name of "
             "vllm:kv_cache_usage_perc).", "gauge", m.kv_usage)
        same("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter", m.prompt_tokens)
        same("vllm:generation_tokens_total", "Number of generation tokens processed.", "counter",
             m.generation_tokens)
        same("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", "counter",
             m.preemptions)
        same("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
             "counter", m.prefix_queries)
        same("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", "counter",
             m.prefix_hits)
        same("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", "counter", m.spec_drafts)
        same("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", "counter", m.spec_draft_tokens)
        same("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", "counter", m.spec_accepted)
        Expanded([m.spec_accepted_per_pos], "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 "Accepted tokens per draft position.", "counter", VLLM_LABELS + ("position",),
                 lambda labels, value: [(self.labels_of(labels) + (labels["position"],), value)], registry)
        Expanded([m.request_success], "vllm:request_success_total", "Count of successfully processed requests.",
                 "counter", VLLM_LABELS + ("finished_reason",), self._finish_reasons, registry)
        Expanded([m.requests_shed], "vllm:admission_rejections_total",
                 "Number of admission attempts rejected by a queue limit, by reason.", "counter",
                 ("model_name", "reason"),
                 lambda labels, value: [((labels["model"], reason), value if reason == "max_num_queued_reqs" else 0.0)
                                        for reason in ADMISSION_REASONS], registry)

        # cached prompt tokens of finished requests (vllm_fold.py), and the prompt tokens by source from it
        self.prompt_tokens_cached = Counter("vllm:prompt_tokens_cached",
                                            "Number of cached prompt tokens (local + external).", VLLM_LABELS,
                                            registry=registry)
        Expanded([m.prompt_tokens, self.prompt_tokens_cached], "vllm:prompt_tokens_by_source_total",
                 "Number of prompt tokens by source.", "counter", VLLM_LABELS + ("source",), self._by_source,
                 registry)
        self.cache_config_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                       CACHE_CONFIG_LABELS, registry=registry)

    # -- labels ------------------------------------------------------------------------------------

    def engine(self, replica_id: str) -> str:
        """The replica's `engine` label: its place among this registry's replicas ("0" for the first)."""
        engine = self._engines.get(replica_id)
        if engine is None:
            with self._lock:
                engine = self._engines.setdefault(replica_id, str(len(self._engines)))
        return engine

    def ids(self, key: tuple[str, ...]) -> tuple[str, str]:
        """(model_name, engine) of a child keyed (replica, model)."""
        return key[1], self.engine(key[0])

    def labels_of(self, labels: dict) -> tuple[str, str]:
        """(model_name, engine) of a sample labelled replica, model."""
        return labels["model"], self.engine(labels["replica"])

    def set_max_model_len(self, replica_id: str, model: str, max_model_len: int) -> None:
        """The token-count histograms' bounds for this replica: 1-2-5 up to its max_model_len, as vLLM's."""
        bounds = vb.request_tokens(min(max_model_len, vb.TOKENS_KEPT_UP_TO))
        for token_view in self.token_views:
            token_view.set_bounds((replica_id, model), bounds)

    def _finish_reasons(self, labels: dict, value: float):
        ours = [(self.labels_of(labels) + (labels["finished_reason"],), value)]
        if labels["finished_reason"] == "stop":  # once per replica (the stop child exists from the start): the
            ours += [(self.labels_of(labels) + (reason,), 0.0) for reason in FINISH_REASONS  # reasons ours never has
                     if reason not in OBSERVER_FINISH_REASONS]
        return ours

    def _by_source(self, labels: dict, value: float):
        if "replica" in labels:  # infersight_prompt_tokens_total: all of them count as computed here ...
            ids = self.labels_of(labels)
            return [(ids + ("local_compute",), value), (ids + ("external_kv_transfer",), 0.0)]
        ids = (labels["model_name"], labels["engine"])  # ... less the cached ones, which were hits
        return [(ids + ("local_compute",), -value), (ids + ("local_cache_hit",), value)]


# vLLM's cache_config_info labels that infersight's KV cache has a value for (vLLM shows ~35, most of
# them about its Mamba, offloading and connector options)
CACHE_CONFIG_LABELS = ("block_size", "cache_dtype", "enable_prefix_caching", "engine", "num_gpu_blocks",
                       "kv_cache_memory_bytes")


_by_registry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def vllm_families(registry: CollectorRegistry) -> VllmFamilies:
    """The registry's VllmFamilies, created on first use (after its EngineMetrics)."""
    m = engine_metrics(registry)
    with _lock:
        families = _by_registry.get(registry)
        if families is None:
            families = _by_registry[registry] = VllmFamilies(registry, m)
        return families


def vllm_family_names() -> dict[str, str]:
    """name -> type of every `vllm:*` family a replica's /metrics shows (counters with `_total`)."""
    registry = CollectorRegistry()
    vllm_families(registry)
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in registry.collect()
            if f.name.startswith("vllm:")}
