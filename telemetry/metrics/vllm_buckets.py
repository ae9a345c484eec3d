"""vLLM 0.32's histogram bucket boundaries (vllm/v1/metrics/buckets.py), for its metric names.

A vLLM user's dashboards and alerts may read a bucket by its bound (`le="0.5"`: the share of
requests whose TTFT was under 500 ms), so the `vllm:*` histograms a replica exports keep vLLM's
boundaries exactly. tests/telemetry/test_metrics_vllm_names.py checks them against the vLLM
installed in .venv-vllm.
"""

from __future__ import annotations

# e2e, queue, inference, prefill and decode times, seconds
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# inter-token latency and time per output token, seconds
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)

# the token-count histograms' bounds depend on the replica's max_model_len; their sources keep
# every 1-2-5 bound up to this, so that any max_model_len up to it is exported exactly
TOKENS_KEPT_UP_TO = 10_000_000


def request_tokens(max_model_len: int) -> tuple[int, ...]:
    """vLLM's `request_tokens` family: 1, 2, 5, 10, 20, 50 ... up to max_model_len."""
    bounds, decade = [], 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * decade
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(value)
        decade *= 10
