"""`infersight diagnose availability` prints each replica's availability beside its latency, then the findings
(its own module: the CLI opens the embedded store by its directory, one per process)."""

from __future__ import annotations

import time

from test_availability import fleet


def test_diagnose_prints_each_replicas_availability_beside_its_latency(tmp_path, capsys, migrated_copy):
    from dashboards.console import cli
    from telemetry.store import open_store

    t0 = time.time() - 600
    with open_store(migrated_copy(tmp_path)) as store:
        fleet(store, t0, limits={"c": 96})
    assert cli.main(["diagnose", "availability", "--store", str(tmp_path), "--wide"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[1].split()
    assert header[:7] == ["MODEL", "REPLICA", "REQUESTS", "ANSWERED", "REJECTED", "SHED", "FAILED"]
    row_c = next(line.split() for line in lines if line.split()[1:2] == ["c"])
    assert row_c[2] == "300" and float(row_c[4].rstrip("%")) > 30  # c refuses its long prompts
    assert "TTFT" in lines[1] and "c (tiny) refused for length" in out  # the latency beside it, the finding below
