"""The flush-cost benchmark's code path at a tiny size: both stores write every row to a real
sidecar and every part of a flush is accounted (no timing asserted)."""

from __future__ import annotations

from telemetry.benchmarks.flush_cost import PARTS, measure


def test_both_stores_flush_everything_and_each_part_is_timed():
    result = measure(cycles=2, steps=5, requests=2, prompt_len=8, output_len=4)  # raises if a row is lost

    assert set(result) == {"RemoteStore", "clickhouse-connect insert_arrow, lz4"}
    for parts in result.values():
        assert set(parts) == {*PARTS, "total"}
        assert parts["insert"] > 0 and parts["total"] >= parts["insert"]
