"""The outcome vocabulary: API answers map onto the fixed error codes, and ClickHouse's outcome of a row
(outcomes.outcome_sql, what the diagnostics and dashboards group by) is Python's (outcome_of)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from telemetry import synthetic
from telemetry.contract.outcomes import ERROR_CODES, OUTCOMES, code_for, engine_error_code, outcome_of, outcome_sql


def test_api_answers_map_onto_the_vocabulary():
    assert code_for(200) == ""
    assert code_for(400, "context_length_exceeded") == "context_length"
    assert code_for(400, None, "This model's maximum context length is 96 tokens. However, ...") == "context_length"
    assert code_for(400, None, "the prompt has 70 tokens; without chunked prefill a prompt must fit in "
                               "max_num_batched_tokens (64)") == "context_length"  # a limit below the context
    assert code_for(400, "invalid_value") == code_for(422) == "invalid_request"
    assert code_for(401, "invalid_api_key") == "unauthorized"
    assert code_for(429, "queue_full") == code_for(429) == "queue_full"
    assert code_for(503) == "unavailable"
    assert code_for(500) == "internal_error" and code_for(500, upstream=True) == "upstream_error"
    assert code_for(502, upstream=True) == "upstream_error"
    assert engine_error_code("abort") == "client_abort" and engine_error_code("stop") == ""


@given(status=st.integers(100, 599), api_code=st.one_of(st.none(), st.text(max_size=30)),
       message=st.text(max_size=60), upstream=st.booleans())
def test_every_answer_gets_a_code_of_the_vocabulary(status, api_code, message, upstream):
    code = code_for(status, api_code, message, upstream)
    assert code == "" if status < 400 else code in ERROR_CODES


def test_clickhouse_outcome_is_pythons(store):
    pairs = [(code, reason) for code in ["", *ERROR_CODES, "not-a-code"] for reason in ("stop", "length", "abort",
                                                                                         "error")]
    records = [dataclasses.replace(synthetic.request(i, "oc"), error_code=code, finish_reason=reason)
               for i, (code, reason) in enumerate(pairs)]
    store.insert_records("requests", records)
    got = store.query_df(f"SELECT request_id, {outcome_sql()} AS outcome FROM requests WHERE replica_id = 'oc'")
    by_id = dict(zip(got["request_id"], got["outcome"]))
    for r in records:
        assert by_id[r.request_id] == outcome_of(r.error_code, r.finish_reason), (r.error_code, r.finish_reason)
    assert set(by_id.values()) == set(OUTCOMES)
