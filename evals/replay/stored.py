"""The production requests a replay sends again: rows of the store's `requests` table.

What a row gives a replay (telemetry/contract/records.py): the prompt's token IDs and the output's,
always; the sampling parameters in the engine's layout (`sampling_params_json`: temperature,
max_tokens, ignore_eos, stop strings and stop token IDs). The text is not needed: a chat's
messages are not stored at all (only their hash), and its rendered prompt only with
`serve --store-text`; its prompt token IDs are the rendered prompt, so every request is replayed
as token IDs through /v1/completions, whatever API it came through.

Requests a replay sent are tagged with the workload `replay` (a candidate that records into the
same store writes them there too) and are left out unless `--workload replay` asks for them.
Rows that cannot be replayed are counted, not sent: failed or aborted requests (their output is
cut short), rows without prompt token IDs, and rows whose token IDs a recording proxy made with
its own tokenizer (`token_ids_source` in the params: not the serving engine's own IDs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from evals.replay.window import Window
from telemetry.contract.derived import window_sql

# the workload tag replayed requests carry: a later replay never picks up an earlier one's traffic
REPLAY_WORKLOAD = "replay"

SAMPLED = "sampled (temperature > 0)"
# why a row is not replayed ('' when it is): the first reason that applies; sampled rows only when
# the replay compares with production's own answers (greedy_only)
_UNREPLAYABLE = ("multiIf(error != '' OR finish_reason NOT IN ('stop', 'length'), 'failed or aborted', "
                 "length(prompt_token_ids) = 0, 'no prompt token IDs', "
                 "JSONExtractString(sampling_params_json, 'token_ids_source') != '', "
                 "'token IDs made by a proxy tokenizer', "
                 "{greedy_only:UInt8} = 1 AND NOT (JSONHas(sampling_params_json, 'temperature') "
                 f"AND JSONExtractFloat(sampling_params_json, 'temperature') = 0), '{SAMPLED}', '')")


@dataclass
class StoredRequest:
    request_id: str
    replica_id: str
    model_name: str
    workload: str
    arrival_time: float
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: dict  # the engine's SamplingParams fields, as stored
    finish_reason: str

    @property
    def greedy(self) -> bool:
        # a row without a temperature (e.g. from a stats plugin) is not known to be greedy
        return self.params.get("temperature", 1.0) == 0


@dataclass
class Selection:
    requests: list[StoredRequest]
    skipped: dict[str, int] = field(default_factory=dict)  # why -> rows in the window not replayed


@dataclass(frozen=True)
class Filters:
    workload: str = ""
    model: str = ""
    replica: str = ""

    def sql(self) -> str:
        return ("({workload:String} = '' AND workload != {replay_tag:String} OR workload = {workload:String}) "
                "AND ({model:String} = '' OR model_name = {model:String}) "
                "AND ({replica:String} = '' OR replica_id = {replica:String})")

    def parameters(self) -> dict:
        return {"workload": self.workload, "model": self.model, "replica": self.replica,
                "replay_tag": REPLAY_WORKLOAD}


def select_requests(store, window: Window, filters: Filters = Filters(), limit: int | None = None,
                    greedy_only: bool = False) -> Selection:
    """The replayable requests of the window (oldest first, each request id once), and what was left out."""
    where = f"{window_sql('arrival_time')} AND {filters.sql()}"
    params = {"start": window.start, "end": window.end, "greedy_only": int(greedy_only), **filters.parameters()}
    limit_sql = f"LIMIT {int(limit)}" if limit else ""
    rows = store.query_df(
        "SELECT request_id, replica_id, model_name, workload, toFloat64(arrival_time) AS arrival, prompt_token_ids, "
        f"output_token_ids, sampling_params_json, finish_reason FROM requests WHERE {where} AND {_UNREPLAYABLE} = '' "
        f"ORDER BY arrival_time, request_id LIMIT 1 BY request_id {limit_sql}", params)
    counts = store.query_df(f"SELECT {_UNREPLAYABLE} AS why, count() AS n FROM requests WHERE {where} "
                            "GROUP BY why HAVING why != ''", params)
    requests = [StoredRequest(r["request_id"], r["replica_id"], r["model_name"], r["workload"], float(r["arrival"]),
                              [int(t) for t in r["prompt_token_ids"]], [int(t) for t in r["output_token_ids"]],
                              json.loads(r["sampling_params_json"] or "{}"), r["finish_reason"])
                for r in rows.to_dict("records")]
    return Selection(requests, {r["why"]: int(r["n"]) for r in counts.to_dict("records")})
