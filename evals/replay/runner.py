"""Replay stored production requests against a candidate deployment and diff the outputs token by token.

What the candidate's answers are compared with (the reference):
- without `--greedy`: production's own stored answers. Only greedy requests (temperature 0) have
  an answer to compare with; sampled ones are left out (counted), and a window with none but
  sampled requests is an error saying what to add;
- with `--greedy`: every selected prompt is sent greedily. With `--baseline-url` the reference is
  the baseline deployment's greedy answer to the same request (sent at the same time); without it
  the reference stays production's answer, so every selected request must have been greedy.
Either way the candidate gets the stored max_tokens, ignore_eos and stop conditions.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import httpx
from tqdm import tqdm

from evals.replay.client import Answer, complete_all, completion_body, discover
from evals.replay.record import make_item, make_run, new_run_id, replica_identity, suite_name
from evals.replay.stored import SAMPLED, Filters, Selection, StoredRequest, select_requests
from evals.replay.window import parse_window
from evals.results import EvalRun
from telemetry.store.remote import redact


class ReplayError(ValueError):
    """Nothing to replay, or not with these options: the message says what to change."""


@dataclass
class ReplayOptions:
    window: str
    to: str
    workload: str = ""
    model: str = ""
    replica: str = ""
    greedy: bool = False
    baseline_url: str | None = None
    limit: int | None = None
    concurrency: int = 4
    timeout: float = 300.0
    api_key: str | None = None
    run_id: str | None = None

    def validate(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ReplayError(f"--limit must be >= 1, got {self.limit}")
        if self.concurrency < 1:
            raise ReplayError(f"--concurrency must be >= 1, got {self.concurrency}")


def _describe_skipped(selection: Selection) -> str:
    return ", ".join(f"{n} {why}" for why, n in selection.skipped.items()) or "none"


def check_selection(selection: Selection, options: ReplayOptions, where: str) -> list[str]:
    """ReplayError when the selection cannot be compared under `options`; else notes for the run."""
    sampled_skipped = selection.skipped.get(SAMPLED, 0)
    if not selection.requests:
        if sampled_skipped:
            raise ReplayError(
                f"the {sampled_skipped} stored request(s) {where} were all sampled (temperature > 0): production's "
                f"answers to them are no reference. Add --greedy --baseline-url URL (a deployment of the production "
                f"configuration) to replay them greedily on both, or select greedy traffic (loadgen --greedy-share)")
        raise ReplayError(f"no replayable request {where} (left out: {_describe_skipped(selection)})")
    sampled = [r for r in selection.requests if not r.greedy]
    if sampled and not options.baseline_url:
        raise ReplayError(
            f"{len(sampled)} of the {len(selection.requests)} stored requests {where} were sampled "
            f"(temperature > 0): --greedy needs --baseline-url URL (a deployment of the production configuration) "
            f"whose greedy answers are their reference")
    notes = []
    if selection.skipped:
        hint = " (add --greedy --baseline-url URL to replay the sampled ones too)" if sampled_skipped else ""
        notes.append(f"left out: {_describe_skipped(selection)}{hint}")
    return notes


def pair(run_id: str, suite: str, requests: list[StoredRequest], answers: list[Answer],
         baseline: list[Answer] | None) -> tuple[list, int]:
    """(items, baseline failures): each candidate answer against its reference, production's stored
    answer or the baseline's; a request the baseline failed has no reference and is left out."""
    items, failed = [], 0
    for i, (request, answer) in enumerate(zip(requests, answers)):
        if baseline is not None and baseline[i].error:
            failed += 1
            continue
        reference = baseline[i].output_token_ids if baseline is not None else request.output_token_ids
        items.append(make_item(run_id, suite, request, reference, answer))
    return items, failed


async def _replay(store, options: ReplayOptions, progress: bool, store_label: str) -> tuple[EvalRun, list[str]]:
    window = parse_window(options.window)
    filters = Filters(options.workload, options.model, options.replica)
    where = f"in window {window.spec}" + "".join(f" {k}={v}" for k, v in asdict(filters).items() if v)
    selection = select_requests(store, window, filters, options.limit, greedy_only=not options.greedy)
    notes = check_selection(selection, options, where)
    requests = selection.requests
    run_id = options.run_id or new_run_id()
    suite = suite_name(window.spec, options.workload)
    start = time.time()
    limits = httpx.Limits(max_connections=2 * options.concurrency + 2)
    async with httpx.AsyncClient(limits=limits, timeout=options.timeout) as client:
        candidate = await discover(client, options.to, "candidate (--to)", options.api_key)
        baseline = (await discover(client, options.baseline_url, "baseline (--baseline-url)", options.api_key)
                    if options.baseline_url else None)
        with tqdm(total=len(requests) * (2 if baseline else 1), disable=not progress, desc="replay", unit="req",
                  dynamic_ncols=True) as bar:
            def send(target, tag):
                return complete_all(client, target, [completion_body(r, target.model) for r in requests],
                                    [f"{run_id}-{i:05d}{tag}" for i in range(len(requests))], options.concurrency,
                                    options.api_key, options.timeout, on_done=lambda _: bar.update(1))

            sides = [send(candidate, "")] + ([send(baseline, "-base")] if baseline else [])
            answers, *base = await asyncio.gather(*sides)
    items, base_failed = pair(run_id, suite, requests, answers, base[0] if base else None)
    if base_failed:
        notes.append(f"{base_failed} request(s) left out: the baseline answered them with an error")
    config = {"replay": {"store": store_label, "window": window.spec, "start": window.start, "end": window.end,
                         "workload": options.workload, "model": options.model, "replica": options.replica,
                         "greedy": options.greedy, "limit": options.limit,
                         "reference": baseline.url if baseline else "production"},
              "endpoint": candidate.url, "model": candidate.model, "replica_id": candidate.replica_id}
    identity = replica_identity(store, candidate.replica_id)
    run = make_run(run_id, suite, items, candidate, config, identity, start, notes="; ".join(notes))
    return run, notes


def replay(store, options: ReplayOptions, progress: bool = False, write: bool = True,
           store_label: str = "") -> tuple[EvalRun, list[str]]:
    """Replay, write the run into `store` (eval_runs / eval_items) unless `write` is False; (run, notes)."""
    options.validate()
    run, notes = asyncio.run(_replay(store, options, progress, redact(str(store_label or store.target))))
    if write:
        run.write_to_store(store)
    return run, notes
