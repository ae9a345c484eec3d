"""`infersight eval gate --replay RUN_ID|FILE`: a replay run as one of the gate's pieces of evidence."""

from __future__ import annotations

from pathlib import Path

from evals.replay.summary import is_replay_run
from evals.results import EvalRun


def load_replay_run(spec: str, store=None) -> EvalRun:
    """A replay run from its JSON file (`infersight replay --out`) or its run id in the store."""
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        run = EvalRun.load(path)
    elif store is not None:
        run = EvalRun.from_store(store, spec)
    else:
        raise ValueError(f"--replay {spec!r}: not a run file, and without --store it cannot be a run id")
    if not is_replay_run(run):
        raise ValueError(f"--replay {spec!r}: run {run.run_id} is of suite {run.run.suite!r}, not a replay "
                         f"(infersight replay writes suites named replay:<window>)")
    if not run.items:
        raise ValueError(f"--replay {spec!r}: run {run.run_id} has no items: it compares nothing")
    return run
