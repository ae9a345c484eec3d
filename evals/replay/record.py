"""A replay as an eval run: one EvalRunRecord, one EvalItemRecord per replayed request.

An item is a stored request: `item_id` its request id, `task` its workload, `input_token_ids`
its prompt, `reference` the reference's output token IDs (JSON: production's stored answer, or
the baseline's greedy one), `output_token_ids` / `output_text` / `output_logprobs` the
candidate's, `score` 1.0 exactly when the two token sequences are equal. The run's suite is
`replay:<window>[:<workload>]`, its endpoint the candidate's URL, its configuration what was
replayed and against what (the store's URL without its password).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

from evals.replay.client import Answer, Deployment
from evals.replay.stored import StoredRequest
from evals.replay.summary import ERROR_PREFIX, SCORER, SUITE_PREFIX
from evals.results import EvalRun
from evals.runner import git_sha
from telemetry.contract.records import EvalItemRecord, EvalRunRecord


def suite_name(window_spec: str, workload: str = "") -> str:
    return SUITE_PREFIX + window_spec + (f":{workload}" if workload else "")


def new_run_id() -> str:
    return f"replay-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def replica_identity(store, replica_id: str) -> dict:
    """The candidate's identity from the store's `replicas` table (its latest start), when it records there."""
    if not replica_id:
        return {}
    df = store.query_df("SELECT weights_hash, quantization, speculative_mode, config_hash FROM replicas "
                        "WHERE replica_id = {id:String} ORDER BY start_time DESC LIMIT 1", {"id": replica_id})
    return {} if df.empty else df.iloc[0].to_dict()


def make_item(run_id: str, suite: str, request: StoredRequest, reference: list[int], answer: Answer) -> EvalItemRecord:
    ok = not answer.error
    return EvalItemRecord(
        run_id=run_id, item_id=request.request_id, suite=suite, task=request.workload, scorer=SCORER,
        score=1.0 if ok and answer.output_token_ids == reference else 0.0, reference=json.dumps(reference),
        output_text=answer.text if ok else ERROR_PREFIX + answer.error, input_token_ids=request.prompt_token_ids,
        output_token_ids=answer.output_token_ids, output_logprobs=answer.logprobs,
        latency_seconds=answer.latency_seconds)


def make_run(run_id: str, suite: str, items: list[EvalItemRecord], candidate: Deployment, config: dict,
             identity: dict, start: float, notes: str = "") -> EvalRun:
    config_json = json.dumps(config, sort_keys=True)
    record = EvalRunRecord(
        run_id=run_id, suite=suite, start_time=start, finish_time=time.time(), config_json=config_json,
        config_hash=hashlib.sha256(config_json.encode()).hexdigest()[:16], model_name=candidate.model,
        weights_hash=str(identity.get("weights_hash", "")), quantization=str(identity.get("quantization", "unknown")),
        speculative_mode=str(identity.get("speculative_mode", "unknown")), git_sha=git_sha(), num_items=len(items),
        accuracy=sum(i.score for i in items) / len(items) if items else 0.0, endpoint=candidate.url, notes=notes)
    return EvalRun(record, items)
