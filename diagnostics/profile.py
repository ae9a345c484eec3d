"""A replica's py-spy profile: which process, the folded stacks as `profiles` rows, and a report of
the top functions by self time in each group (scheduler, input preparation, forward, sampling,
telemetry, server, other)."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from diagnostics.stack_groups import GROUPS, classify, is_idle, parse_stack
from telemetry.contract.records import ProfileRecord

_REPLICA_PID = """
SELECT argMax(pid, start_time) AS pid, argMax(host, start_time) AS host, max(start_time) AS started
FROM replicas WHERE replica_id = {replica:String}
"""


class TargetError(ValueError):
    pass


@dataclass
class Target:
    replica_id: str
    pid: int
    source: str  # where the pid came from


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _replica_id_from_url(url: str) -> str:
    import httpx

    try:
        return str(httpx.get(url.rstrip("/") + "/health", timeout=5).json()["replica_id"])
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise TargetError(f"{url}: cannot ask the replica who it is ({e})") from None


def resolve_target(replica: str, store=None, run_dir: str | None = None, pid: int | None = None) -> Target:
    """The process of `replica` (an id or the replica's URL): an explicit pid, the fleet's state
    file, or the pid the replica recorded at its latest start (when that was on this host)."""
    replica_id = _replica_id_from_url(replica) if replica.startswith(("http://", "https://")) else replica
    if pid is not None:
        target = Target(replica_id, int(pid), "--pid")
    elif run_dir is not None:
        from engine.serving.fleet.state import FleetState

        state = FleetState.load(run_dir)
        found = [p for p in state.replicas if p.name == replica_id]
        if not found:
            names = ", ".join(p.name for p in state.replicas)
            raise TargetError(f"no replica {replica_id!r} in the fleet at {run_dir} (replicas: {names})")
        target = Target(replica_id, found[0].pid, f"fleet state {Path(run_dir) / 'state.json'}")
    elif store is not None:
        row = store.query_arrow(_REPLICA_PID, {"replica": replica_id}).to_pylist()
        if not row or row[0]["started"] is None:
            raise TargetError(f"no replica {replica_id!r} in the store's replicas table")
        host = row[0]["host"]
        if host and host != socket.gethostname():
            raise TargetError(f"{replica_id} runs on {host}, not on this host ({socket.gethostname()}): "
                              f"run `infersight profile` there")
        target = Target(replica_id, int(row[0]["pid"]), "replicas table (latest start)")
    else:
        raise TargetError("give --pid, --run-dir (a fleet) or --store to find the replica's process")
    if not _alive(target.pid):
        raise TargetError(f"{replica_id}: process {target.pid} (from {target.source}) is not running")
    return target


def profile_records(stacks: Counter, replica_id: str, pid: int, start: float,
                    seconds: float) -> tuple[list[ProfileRecord], int]:
    """One row per distinct folded stack that was working, with its group; and the samples left out
    because the thread was only waiting (an event loop in epoll, a condition variable ...)."""
    profile_id = hashlib.sha256(f"{replica_id}|{pid}|{start}".encode()).hexdigest()[:16]
    records, idle = [], 0
    for stack, n in stacks.items():
        frames = parse_stack(stack)
        if is_idle(frames):
            idle += int(n)
            continue
        records.append(ProfileRecord(profile_id=profile_id, replica_id=replica_id, pid=pid, start_time=start,
                                     duration_seconds=seconds, stack=stack, samples=int(n), group=classify(frames)))
    return records, idle


def top_functions(records: list[ProfileRecord], per_group: int = 5) -> dict[str, dict]:
    """Per group: its share of all samples and its top functions by self time (the stack's leaf)."""
    total = sum(r.samples for r in records) or 1
    by_group: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        frames = parse_stack(r.stack)
        leaf = frames[-1].label() if frames else "?"
        by_group[r.group][leaf] += r.samples
    out = {}
    for group in GROUPS:
        counts = by_group.get(group)
        if not counts:
            continue
        n = sum(counts.values())
        out[group] = {"samples": n, "share": n / total,
                      "top": [{"function": f, "samples": c, "share": c / total}
                              for f, c in counts.most_common(per_group)]}
    return out


def format_report(replica_id: str, pid: int, seconds: float, records: list[ProfileRecord], per_group: int = 5,
                  idle: int = 0) -> str:
    total = sum(r.samples for r in records)
    lines = [f"{replica_id} (pid {pid}): {total} samples over {seconds:g} s, {len(records)} distinct stacks"
             + (f" ({idle} samples of threads only waiting left out)" if idle else "")]
    for group, g in sorted(top_functions(records, per_group).items(), key=lambda kv: -kv[1]["samples"]):
        lines.append(f"  {group:<18} {g['share']:6.1%}  ({g['samples']} samples)")
        for f in g["top"]:
            lines.append(f"      {f['share']:6.1%}  {f['function']}")
    return "\n".join(lines)


def now() -> float:
    return time.time()
