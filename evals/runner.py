"""Run a suite against a backend (in-process engine or HTTP replica) and score every item."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from evals.backends import EngineBackend, HttpBackend
from evals.results import EvalRun
from evals.scorers import score
from evals.suite import Suite
from telemetry.contract.records import EvalItemRecord, EvalRunRecord

DEFAULT_MAX_TOKENS = 32


def git_sha(cwd: str | Path | None = None) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def run_suite(suite: Suite, backend: EngineBackend | HttpBackend, max_tokens: int = DEFAULT_MAX_TOKENS,
              run_id: str | None = None, progress: bool = True, notes: str = "") -> EvalRun:
    """Greedy-generate every item, score it, and return the run (not yet stored anywhere)."""
    run_id = run_id or f"{suite.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    start = time.time()
    gens = backend.generate(suite.items, max_tokens, progress=progress)
    items = []
    for item, gen in zip(suite.items, gens):
        items.append(EvalItemRecord(
            run_id=run_id, item_id=item.id, suite=suite.name, task=item.task, scorer=item.scorer,
            score=0.0 if gen.error else score(item.scorer, gen.text, item.reference), reference=item.reference,
            output_text=gen.text if not gen.error else f"[error] {gen.error}",
            input_token_ids=gen.prompt_token_ids, output_token_ids=gen.output_token_ids,
            output_logprobs=gen.logprobs, latency_seconds=gen.latency_seconds))
    ident = backend.identity()
    accuracy = sum(i.score for i in items) / len(items) if items else 0.0
    run = EvalRunRecord(
        run_id=run_id, suite=suite.name, start_time=start, finish_time=time.time(), config_json=ident.config_json,
        config_hash=ident.config_hash, model_name=ident.model_name, weights_hash=ident.weights_hash,
        quantization=ident.quantization, speculative_mode=ident.speculative_mode, git_sha=git_sha(),
        num_items=len(items), accuracy=accuracy, endpoint=ident.endpoint, notes=notes)
    return EvalRun(run, items)


def store_run(run: EvalRun, target) -> None:
    """Write a run into the store at `target` (directory or URL), creating the tables if needed."""
    from telemetry.schema import migrate
    from telemetry.store import open_store

    store = open_store(target)
    try:
        migrate(store)
        run.write_to_store(store)
    finally:
        if store is not target:
            store.close()


def summarize(run: EvalRun) -> str:
    """A few lines for the terminal: overall and per-task accuracy with Wilson intervals."""
    from evals.stats import wilson_interval

    lines = [f"run {run.run_id}: suite {run.run.suite}, model {run.run.model_name}, "
             f"quantization {run.run.quantization}"]
    groups = [("overall", run.items)] + list(run.by_task().items())
    for name, items in groups:
        k = int(sum(i.score >= 0.5 for i in items))
        lo, hi = wilson_interval(k, len(items))
        lines.append(f"  {name or '(no task)':<14} {k:>4}/{len(items):<4} = {k / max(len(items), 1):6.1%}  "
                     f"[95% CI {lo:.1%} - {hi:.1%}]")
    return "\n".join(lines)
