"""A lagging finding whose worst metric is a tail test (ttft_p90, queue_p90; diagnostics.tail_latency)
shows its base metric's distribution per replica (dashboards.finding_views._distribution), run by
streamlit's AppTest on a real store with a few synthetic requests."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from telemetry import synthetic


def view(worst: str) -> None:
    import pandas as pd

    from dashboards import finding_views
    from telemetry import synthetic

    evidence = {"replica": "r1", "peers": ["r0"], "unit": "request",
                "metrics": {worst: {"ratio_to_peers": 2.0, "ratio_ci": [1.5, 2.5], "holm_p": 1e-4}}}
    row = pd.Series({"subject": "r1", "window_start": pd.Timestamp(synthetic.T0 - 60, unit="s"),
                     "window_end": pd.Timestamp(synthetic.T0 + 60, unit="s")})
    finding_views.lagging(evidence, row, "tv")


@pytest.fixture(scope="module")
def requests_in_store(store):
    store.insert_records("requests", [synthetic.request(i, r) for r in ("r0", "r1") for i in range(20)])
    data.use_store(store)
    yield store
    data.use_store(None)


@pytest.mark.parametrize("worst, metric", [("ttft_p90", "ttft"), ("queue_p90", "queue"), ("ttft", "ttft")])
def test_a_tail_finding_shows_the_distribution_of_its_base_metric(requests_in_store, worst, metric):
    at = AppTest.from_function(view, args=(worst,), default_timeout=30)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    charts = {c.proto.id.split("-")[-1]: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    dist = charts["tv_dist"]
    assert {t["name"] for t in dist["data"]} == {"r0 (20)", "r1 (20)"}
    assert dist["layout"]["title"]["text"].startswith(metric)
