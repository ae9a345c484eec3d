"""Which replicas a fleet's cross-scorer scores: its own, and those of the fleets that write to its store.

A canary is often deployed as a fleet of its own that writes to the running fleet's store (the
demo's canary, `sidecar.url` in a fleet config). The fleet that owns the store cross-scores it too:
the fleets on this host whose state file sits beside or under the owner's run directory, write to
the same store and run no cross-scorer of their own. Their files are read again before every pass,
so a canary that comes up later (or goes down) is seen at the next pass.
"""

from __future__ import annotations

from pathlib import Path

from engine.serving.fleet.cross_score_spec import CROSS_SCORE_FLAG
from engine.serving.fleet.state import STATE_FILE, FleetState



def runs_own_cross_scorer(state: FleetState) -> bool:
    return state.prober is not None and CROSS_SCORE_FLAG in state.prober.cmd


def attached_fleets(run_dir: Path, store_url: str) -> list[FleetState]:
    """Fleets beside or under `run_dir` that write to `store_url` without a cross-scorer of their own."""
    run_dir = Path(run_dir).resolve()
    found = []
    for path in sorted({*run_dir.parent.glob(f"*/{STATE_FILE}"), *run_dir.glob(f"*/{STATE_FILE}")}):
        if path.parent.resolve() == run_dir:
            continue
        try:
            other = FleetState.load(path.parent)
        except ValueError:  # going down, or half written by another process: the next pass reads it again
            continue
        if other.store_url == store_url and not runs_own_cross_scorer(other):
            found.append(other)
    return found


def cross_score_urls(run_dir: Path) -> list[str]:
    """The fleet's replica URLs, then those of its attached fleets (ValueError: the fleet is not up)."""
    state = FleetState.load(run_dir)
    urls = [r.url for r in state.replicas if not r.stopped]
    if state.store_url:
        for other in attached_fleets(Path(run_dir), state.store_url):
            urls += [r.url for r in other.replicas if not r.stopped]
    return urls
