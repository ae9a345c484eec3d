"""Refused and failed requests on /metrics: by outcome and reason, and never in the latency and token
metrics of the requests the engine served; an engine failure counts in request_success{error}."""

from __future__ import annotations

import dataclasses

from telemetry import synthetic
from telemetry.contract.hooks import replay_request
from telemetry.metrics import MetricsObserver


def _value(registry, name: str, **labels) -> float:
    return registry.get_sample_value(name, {"replica": "m", "model": "tiny", **labels}) or 0.0


def test_each_outcome_lands_in_its_counter():
    observer = MetricsObserver("m", "tiny")
    rows = [("", "stop", 200), ("engine_error", "error", 0), ("client_abort", "abort", 0),
            ("queue_full", "error", 429), ("unavailable", "error", 503), ("context_length", "error", 400),
            ("context_length", "error", 400), ("unauthorized", "error", 401), ("upstream_error", "error", 502),
            ("internal_error", "error", 500), ("client_timeout", "abort", 408), ("client_abort", "abort", 499)]
    for i, (code, reason, status) in enumerate(rows):
        replay_request(observer, dataclasses.replace(synthetic.request(i, "m"), error_code=code, finish_reason=reason,
                                                     http_status=status))
    observer.fold()
    r = observer.registry
    assert _value(r, "infersight_requests_shed_total") == 2
    assert _value(r, "infersight_requests_rejected_total", reason="context_length") == 2
    assert _value(r, "infersight_requests_rejected_total", reason="unauthorized") == 1
    assert _value(r, "infersight_requests_rejected_total", reason="invalid_request") == 0  # exists from the start
    assert _value(r, "infersight_requests_failed_total", reason="upstream_error") == 1
    assert _value(r, "infersight_requests_failed_total", reason="internal_error") == 1
    assert _value(r, "infersight_request_success_total", finished_reason="error") == 1  # the engine's failure
    # the client's doing (the engine's abort, a client gone or too slow before its body was read): no error
    assert _value(r, "infersight_request_success_total", finished_reason="abort") == 3
    assert _value(r, "infersight_requests_failed_total", reason="client_timeout") == 0
    assert _value(r, "infersight_request_success_total", finished_reason="stop") == 1
    assert _value(r, "infersight_e2e_request_latency_seconds_count") == 3  # the engine's rows only
