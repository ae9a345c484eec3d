"""`infersight diagnose`: a table, findings recorded once per (kind, subject, scope), resolved when gone."""

from __future__ import annotations

import json
import random
import time

import pytest
from diag_records import jittered, replica, request

from dashboards.console import cli
from diagnostics import run_all
from diagnostics.findings import Finding, write_findings
from diagnostics.scope import Scope
from telemetry.store import open_store


def seed(path, slow: float = 2.5):
    """`path`: a migrated store's data directory (the `migrated_copy` fixture makes one)."""
    rng = random.Random(0)
    t0 = time.time() - 1800
    with open_store(path) as store:
        store.insert_records("replicas", [replica(f"r{i}", t0 - 10) for i in range(3)])
        store.insert_records("requests", [
            request(f"r{i}", j, t0 + j, ttft=jittered(rng, 0.02 * (slow if i == 2 else 1)),
                    itl=jittered(rng, 0.01 * (slow if i == 2 else 1)))
            for i in range(3) for j in range(100)])


def findings_in(path):
    with open_store(path) as store:
        return store.query_df("SELECT finding_id, kind, severity, subject, summary, last_seen FROM findings "
                              "ORDER BY last_seen").to_dict("records")


def test_diagnose_prints_records_and_reruns_update(tmp_path, capsys, migrated_copy):
    seed(migrated_copy(tmp_path))
    assert cli.main(["diagnose", "replicas", "--store", str(tmp_path), "--fail-on", "warning"]) == 1
    out = capsys.readouterr().out
    assert "lagging_replica" in out and "r2" in out and out.splitlines()[0].startswith("SEVERITY")
    first = findings_in(tmp_path)
    assert [(f["kind"], f["subject"]) for f in first] == [("lagging_replica", "r2")]
    assert cli.main(["diagnose", "replicas", "--store", str(tmp_path)]) == 0  # --fail-on never
    again = findings_in(tmp_path)
    assert {f["finding_id"] for f in again} == {first[0]["finding_id"]}  # same id: an update, not a new finding


def test_diagnose_all_json_and_run_all(tmp_path, capsys, migrated_copy):
    seed(migrated_copy(tmp_path))
    assert cli.main(["diagnose", "all", "--store", str(tmp_path), "--json", "--no-write"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {x["diagnostic"] for x in lines} >= {"replicas", "tokenizer", "drift"}
    lagging = next(x for x in lines if x["kind"] == "lagging_replica")
    assert lagging["subject"] == "r2" and lagging["evidence"]["metrics"]
    assert findings_in(tmp_path) == []  # --no-write
    with open_store(tmp_path) as store:
        results = run_all(store)
    assert any(f.kind == "lagging_replica" and f.subject == "r2" for f in results)
    assert any(f["subject"] == "r2" for f in findings_in(tmp_path))


def test_a_finding_no_longer_seen_is_resolved(tmp_path, capsys, migrated_copy):
    seed(migrated_copy(tmp_path), slow=1.0)  # nobody is slow now
    scope = Scope.window(since="24h")  # what `diagnose` uses by default
    with open_store(tmp_path) as store:
        write_findings(store, [Finding("lagging_replica", "critical", "r1", "r1 was slow", "replicas", scope)],
                       now=time.time() - 600)
    assert cli.main(["diagnose", "replicas", "--store", str(tmp_path)]) == 0
    rows = findings_in(tmp_path)
    assert [(r["severity"], r["summary"]) for r in rows] == [("critical", "r1 was slow"),
                                                             ("info", "resolved: r1 was slow")]
    assert len({r["finding_id"] for r in rows}) == 1


@pytest.mark.parametrize("argv,message", [
    (["--baseline", "version=1"], "give both --baseline and --candidate"),
    (["--since", "last tuesday"], "not a time"),
    (["--model-dir", "nodir"], "expected NAME=DIR"),
    (["--baseline", "colour=red", "--candidate", "version=2"], "unknown key"),
])
def test_bad_arguments_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert cli.main(["diagnose", "regression", "--store", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
