"""`infersight eval`: run suites, measure drift, gate a deploy.

    infersight eval run --suite evals/suites/reference_heldout.jsonl --model evals/reference/models/target \
        [--quantization int8 ...] [--store DIR|URL] [--out run.json]
    infersight eval run --suite S --endpoint http://127.0.0.1:8000 --out run.json
    infersight eval drift --baseline base.json --candidate cand.json|cand.toml|MODEL_DIR \
        [--candidate-set quantization=int8]
    infersight eval gate --baseline base.json|base.toml|MODEL_DIR --candidate ... --policy evals/policies/default.toml \
        [--report-md gate.md] [--report-json gate.json] [--replay RUN_ID|replay.json ...]

Exit codes: 0 success / gate passed, 1 the gate failed (drift), 2 error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_POLICY = str(Path(__file__).parent / "policies" / "default.toml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from engine.serving.server.engine_args import add_engine_arguments

    sub = parser.add_subparsers(dest="eval_command", metavar="{run,drift,gate}", required=True)

    run = sub.add_parser("run", help="run suites against an engine config, a model or an HTTP endpoint")
    run.add_argument("--suite", action="append", required=True, help="suite JSONL file (repeatable)")
    target = run.add_mutually_exclusive_group(required=True)
    target.add_argument("--engine", metavar="CONFIG.toml", help="EngineConfig as TOML")
    target.add_argument("--model", metavar="DIR", help="model directory (EngineConfig defaults + the flags below)")
    target.add_argument("--endpoint", metavar="URL", help="an OpenAI-compatible replica, e.g. http://127.0.0.1:8000")
    run.add_argument("--api-key", help="bearer token for --endpoint")
    run.add_argument("--store", metavar="TARGET", help="store directory or http(s) URL: write eval_runs / eval_items")
    run.add_argument("--out", metavar="FILE", help="also write the run as JSON (several suites: FILE stem + suite)")
    _subset_args(run)
    run.add_argument("--run-id", help="run id (default: suite + UTC time + random suffix)")
    run.add_argument("--notes", default="")
    run.add_argument("--no-progress", action="store_true")
    add_engine_arguments(run)

    drift = sub.add_parser("drift", help="drift of a candidate from a baseline run (teacher-forced KL, top-1, Δp)")
    _side_args(drift)
    drift.add_argument("--json", metavar="FILE", help="write the statistics as JSON")

    gate = sub.add_parser("gate", help="pass/fail a candidate against a baseline under a policy")
    _side_args(gate)
    gate.add_argument("--policy", default=DEFAULT_POLICY, help="policy TOML (default: evals/policies/default.toml)")
    gate.add_argument("--report-md", metavar="FILE", help="write the markdown report here")
    gate.add_argument("--report-json", metavar="FILE", help="write the full result as JSON here")
    gate.add_argument("--replay", action="append", default=[], metavar="RUN_ID|FILE",
                      help="a run of `infersight replay` against the candidate (file, or run id with --store): "
                           "fails the gate below the policy's min_replay_agreement; repeatable")
    gate.add_argument("--no-progress", action="store_true")


def _subset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-items", type=int, help="first N items of each suite")
    p.add_argument("--per-task", type=int, help="first N items of every task")
    p.add_argument("--max-tokens", type=int, default=32, help="generation limit per item (default 32)")


def _side_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", action="append", required=True, metavar="RUN|CONFIG",
                   help="run file (.json), run id (with --store), engine config (.toml) or model dir; repeatable")
    p.add_argument("--candidate", action="append", required=True, metavar="RUN|CONFIG")
    p.add_argument("--baseline-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override an EngineConfig field of the baseline (e.g. dtype=float32)")
    p.add_argument("--candidate-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override an EngineConfig field of the candidate (e.g. quantization=int8)")
    p.add_argument("--store", metavar="TARGET", help="store to read run ids from (and write gate runs to)")


def run(args: argparse.Namespace) -> int:
    handlers = {"run": _run, "drift": _drift, "gate": _gate}
    try:
        return handlers[args.eval_command](args)
    except Exception as e:  # noqa: BLE001 - any failure to decide is exit 2, with the reason
        from engine.core.models.errors import ModelLoadError
        from evals.suite import SuiteError

        known = (ValueError, FileNotFoundError, ConnectionError, SuiteError, ModelLoadError, OSError)
        if not isinstance(e, known):
            raise
        print(f"infersight eval {args.eval_command}: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from engine.serving.server.engine_args import engine_overrides
    from evals.backends import EngineBackend, HttpBackend
    from evals.runner import run_suite, store_run, summarize
    from evals.sides import load_engine_config
    from evals.suite import load_suite

    suites = [load_suite(p).subset(args.max_items, args.per_task) for p in args.suite]  # fail fast on a bad file
    overrides = engine_overrides(args)
    if args.endpoint:
        if overrides:
            raise ValueError(f"engine options {sorted(overrides)} do not apply to --endpoint")
        backend = HttpBackend(args.endpoint, api_key=args.api_key)
    else:
        backend = EngineBackend(load_engine_config(args.engine or args.model, overrides))
    try:
        for i, suite in enumerate(suites):
            run_id = args.run_id if len(suites) == 1 else (f"{args.run_id}-{suite.name}" if args.run_id else None)
            result = run_suite(suite, backend, args.max_tokens, run_id=run_id, progress=not args.no_progress,
                               notes=args.notes)
            print(summarize(result))
            if args.out:
                out = Path(args.out)
                if len(suites) > 1:
                    out = out.with_name(f"{out.stem}.{suite.name}{out.suffix or '.json'}")
                print(f"  written to {result.save(out)}")
            if args.store:
                store_run(result, args.store)
                print(f"  stored in eval_runs / eval_items at {args.store}")
    finally:
        backend.close()
    return 0


def _overrides(pairs: list[str]) -> dict:
    from evals.sides import parse_override

    return dict(parse_override(p) for p in pairs)


def _sides(args, store):
    from evals.sides import resolve_side

    return (resolve_side("baseline", args.baseline, store, _overrides(args.baseline_set)),
            resolve_side("candidate", args.candidate, store, _overrides(args.candidate_set)))


def _open_store(target):
    if not target:
        return None
    from telemetry.store import open_store

    return open_store(target)


def _drift(args) -> int:
    from engine.core.engine import LLMEngine
    from evals.logit_drift import compute_drift
    from evals.report import drift_lines
    from evals.teacher_forcing import EngineScorer

    store = _open_store(args.store)
    try:
        base, cand = _sides(args, store)
    finally:
        if store is not None:
            store.close()
    if not base.runs:
        raise ValueError("drift needs baseline runs (their outputs are what gets teacher-forced)")
    runs = list(base.runs.values())
    scorers = None
    if base.config is not None and cand.config is not None:
        scorers = (EngineScorer(LLMEngine(base.config)), EngineScorer(LLMEngine(cand.config)))
    elif not cand.runs:
        raise ValueError(f"no configuration to teacher-force with ({base.config_note or cand.config_note}) "
                         "and no candidate runs to compare outputs with")
    cand_runs = [cand.runs[s] for s in base.runs if s in cand.runs]
    report = compute_drift(runs, *(scorers or (None, None)), candidate_runs=cand_runs or None)
    print(f"drift of {cand.describe()} from {base.describe()}:")
    print("\n".join(drift_lines(report)))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


def _gate(args) -> int:
    from evals.gate import run_gate
    from evals.policy import load_policy
    from evals.report import gate_markdown

    policy = load_policy(args.policy)
    store = _open_store(args.store)
    try:
        from evals.replay.evidence import load_replay_run

        replays = [load_replay_run(spec, store) for spec in args.replay]  # fail fast, before any suite runs
        base, cand = _sides(args, store)
        result = run_gate(base, cand, policy, progress=not args.no_progress, store_target=store, replays=replays)
    finally:
        if store is not None:
            store.close()
    md = gate_markdown(result)
    print(md)
    if args.report_md:
        Path(args.report_md).write_text(md, encoding="utf-8")
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    return 0 if result.passed else 1
