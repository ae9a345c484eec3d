"""Migration 0009: per-request summaries of the token-ID arrays, MATERIALIZED by ClickHouse. Writers
send the record contract's columns only; the summaries are computed at insert, computed on read
for parts written before the migration, and never part of SELECT *."""

from __future__ import annotations

import dataclasses

from telemetry import synthetic
from telemetry.contract.records import record_fields
from telemetry.schema import migrate
from telemetry.store import open_store
from tests.telemetry.older_schema import insert_as_then

SUMMARIES = ("prompt_ids_hash", "prompt_ids_head", "prompt_ids_max", "output_ids_max", "prompt_tail_min",
             "prompt_tail_max")
# edge cases: empty arrays, a one-token prompt, IDs up to the UInt32 maximum
PROMPTS = [[], [7], [0, 0, 5], [3, 100, 2, 4294967295], [128000, 9, 128255]]
OUTPUTS = [[], [9, 500], [1], [4294967295], [2, 1]]


def _records(replica_id: str):
    base = [synthetic.request(i, replica_id=replica_id) for i in range(len(PROMPTS))]
    return [dataclasses.replace(r, prompt_token_ids=p, output_token_ids=o, prompt_tokens=len(p),
                                output_tokens=len(o), token_times=[0.01] * len(o))
            for r, p, o in zip(base, PROMPTS, OUTPUTS)]


def _expected(prompt: list[int], output: list[int]) -> dict:
    tail = prompt[1:]
    return {"prompt_ids_head": prompt[:2], "prompt_ids_max": max(prompt, default=0),
            "output_ids_max": max(output, default=0), "prompt_tail_min": min(tail, default=0),
            "prompt_tail_max": max(tail, default=0)}


def _summaries(store, replica_id: str) -> list[dict]:
    return store.query_arrow(
        f"SELECT prompt_token_ids, output_token_ids, {', '.join(SUMMARIES)}, "
        "prompt_ids_hash = cityHash64(prompt_token_ids) AS hash_ok FROM requests "
        "WHERE replica_id = {r:String} ORDER BY request_id", {"r": replica_id}).to_pylist()


def _check(rows: list[dict]) -> None:
    assert len(rows) == len(PROMPTS)
    for row in rows:
        assert row["hash_ok"], row
        got = {k: row[k] for k in SUMMARIES if k != "prompt_ids_hash"}
        assert got == _expected(row["prompt_token_ids"], row["output_token_ids"]), row


def test_summaries_are_computed_at_insert_from_the_contract_columns(store):
    store.insert_records("requests", _records("sum-new"))  # the contract's columns only
    _check(_summaries(store, "sum-new"))
    described = store.query_df("DESCRIBE TABLE requests")
    kinds = dict(zip(described["name"], described["default_type"]))
    assert {kinds[c] for c in SUMMARIES} == {"MATERIALIZED"}
    star = store.query_arrow("SELECT * FROM requests WHERE replica_id = 'sum-new' LIMIT 1")
    assert star.column_names == record_fields(type(_records("x")[0]))  # not in SELECT *


def test_parts_written_before_the_migration_read_the_same_summaries(store):
    with open_store(store.path, database="pre0009") as s:  # a second database, same data directory
        migrate(s, until=8)  # as a store before migration 0009
        assert "prompt_ids_hash" not in set(s.query_df("DESCRIBE TABLE requests")["name"])
        insert_as_then(s, "requests", _records("sum-old"))
        assert 9 in migrate(s)
        _check(_summaries(s, "sum-old"))  # computed on read: the part has no such columns
        s.insert_records("requests", _records("sum-after"))
        s.command("OPTIMIZE TABLE requests FINAL")  # a merge stores them for the old part too
        stored = s.query_df("SELECT DISTINCT column FROM system.parts_columns WHERE database = 'pre0009' "
                            "AND table = 'requests' AND active")
        assert set(SUMMARIES) <= set(stored["column"])
        _check(_summaries(s, "sum-old"))
        _check(_summaries(s, "sum-after"))
