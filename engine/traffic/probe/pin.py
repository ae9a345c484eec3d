"""Pin a probe round: one replica's solo answers become the model's golden baseline.

Reads the round's solo probe rows of that replica from `requests` (the replica recorded them:
the store, not the client, is the truth), joins the identity of the replica start that served
them (the latest `replicas` row at or before each request's arrival), and writes one
ProbeBaselineRecord per probe into `probe_baselines` (the latest pin of a probe wins: see
diagnostics/baseline.py, which reads them). Rows reach the store through the replica's recorder,
in the background, so the pin first waits for them (bounded) and says which are missing.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from telemetry.contract.probes import PROBE_WORKLOAD, parse_probe_request_id
from telemetry.contract.records import ProbeBaselineRecord

# the solo rows of one replica in one round, each with its replica start's identity (ri.* is ''
# until the replica's own row has landed: ASOF LEFT JOIN fills the defaults)
_SOLO_ROWS = """
SELECT t.request_id AS request_id, if(ri.model_name != '', ri.model_name, t.model_name) AS model_name,
       t.prompt_text_hash AS prompt_text_hash, t.rendered_prompt_hash AS rendered_prompt_hash,
       t.sampling_params_json AS sampling_params_json, t.prompt_token_ids AS prompt_token_ids,
       t.output_token_ids AS output_token_ids, t.finish_reason AS finish_reason,
       ri.replica_id AS identity_of, ri.weights_hash AS weights_hash, ri.tokenizer_hash AS tokenizer_hash,
       ri.chat_template_hash AS chat_template_hash, ri.config_hash AS config_hash,
       ri.engine_version AS engine_version
FROM requests AS t
ASOF LEFT JOIN replicas AS ri ON t.replica_id = ri.replica_id AND t.arrival_time >= ri.start_time
WHERE t.replica_id = {replica:String} AND t.workload = {workload:String} AND t.error = ''
  AND startsWith(t.request_id, {prefix:String}) AND endsWith(t.request_id, {suffix:String})
ORDER BY t.request_id
LIMIT 1 BY t.request_id
"""
POLL_SECONDS = 0.5


def solo_rows(store, round_id: str, replica_id: str) -> dict[str, dict]:
    """probe_id -> its solo row in the store (with identity), for the rows whose identity has landed."""
    rows = store.query_arrow(_SOLO_ROWS, {"replica": replica_id, "workload": PROBE_WORKLOAD,
                                          "prefix": f"probe.{round_id}.",
                                          "suffix": f".solo.{replica_id}"}).to_pylist()
    out = {}
    for row in rows:
        parsed = parse_probe_request_id(row["request_id"])
        if parsed and parsed.replica_id == replica_id and row["identity_of"]:
            out[parsed.probe_id] = row
    return out


def wait_for_solo_rows(store, round_id: str, replica_id: str, expect: Collection[str] | None = None,
                       timeout: float = 30.0) -> dict[str, dict]:
    """The round's solo rows once all of `expect` (probe ids) are stored; without `expect`, once
    some are and their number held still for one poll. RuntimeError naming what is missing."""
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        rows = solo_rows(store, round_id, replica_id)
        if expect is not None and set(expect) <= set(rows):
            return {p: rows[p] for p in expect}
        if expect is None and rows and len(rows) == last:
            return rows
        last = len(rows)
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    if expect is None:
        raise RuntimeError(f"no solo probe rows of round {round_id} from replica {replica_id} in the store after "
                           f"{timeout:.0f} s (does the replica write to this store? is its own replicas row there?)")
    missing = sorted(set(expect) - set(rows))
    raise RuntimeError(f"{len(missing)} of {len(expect)} solo probe rows of round {round_id} from replica "
                       f"{replica_id} are not in the store after {timeout:.0f} s: {', '.join(missing[:8])}"
                       + (" ..." if len(missing) > 8 else "")
                       + " (does the replica write to this store, with its replicas row?)")


def pin_round(store, round_id: str, replica_id: str, note: str = "", *, expect: Collection[str] | None = None,
              timeout: float = 30.0) -> list[ProbeBaselineRecord]:
    """Pin `replica_id`'s solo answers of round `round_id` as the baseline of its model (see
    wait_for_solo_rows for `expect` and `timeout`); returns the rows written."""
    rows = wait_for_solo_rows(store, round_id, replica_id, expect, timeout)
    pinned = time.time()
    records = [ProbeBaselineRecord(
        model_name=r["model_name"], probe_id=probe_id, pinned_time=pinned, round_id=round_id, replica_id=replica_id,
        api="chat" if r["rendered_prompt_hash"] else "completions",  # only a chat's prompt is rendered
        weights_hash=r["weights_hash"], tokenizer_hash=r["tokenizer_hash"],
        chat_template_hash=r["chat_template_hash"], config_hash=r["config_hash"],
        engine_version=r["engine_version"], prompt_text_hash=r["prompt_text_hash"],
        rendered_prompt_hash=r["rendered_prompt_hash"], sampling_params_json=r["sampling_params_json"],
        prompt_token_ids=list(r["prompt_token_ids"]), output_token_ids=list(r["output_token_ids"]),
        finish_reason=r["finish_reason"], note=note) for probe_id, r in sorted(rows.items())]
    store.insert_records("probe_baselines", records)
    return records
