"""The limits the OS puts on this process through its cgroup: CPU quota, cpuset, memory limit, and
the CPU throttling counters.

Placement by affinity (engine/core/placement.py) says which CPUs a replica may run on; a cgroup can say
how much of them it gets (30% of one CPU is as slow as it sounds, on the same CPU list as its peers).
Both cgroup layouts are read: v2 (one hierarchy: cpu.max, cpuset.cpus.effective, memory.max,
cpu.stat with nr_throttled / throttled_usec) and v1 (one per controller: cpu.cfs_quota_us /
cpu.cfs_period_us, cpuset.effective_cpus, memory.limit_in_bytes, cpu.stat with throttled_time in ns).
The process's own group comes from /proc/<pid>/cgroup; where its directory is not visible (a
container shows its own group as the root) the root of the hierarchy is read. Every value is
best effort: what cannot be read is left out, never guessed.

`limits()` are identity (they change how fast a replica can be); `throttling()` are counters, read at
start as a reference, and over time by a ThrottlingSampler (every step record carries its latest reading,
so the share of periods throttled over any window is a difference of two rows).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

UNLIMITED = "max"
# a v1 memory limit at or above this is "no limit" (the kernel's page-rounded LONG_MAX)
_V1_NO_LIMIT = 1 << 62


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _groups(proc_root: Path, pid: int | str) -> dict[str, str]:
    """controller -> the process's group path ('' key: the v2 unified hierarchy)."""
    text = _read(proc_root / str(pid) / "cgroup") or ""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in (controllers.split(",") if controllers else [""]):
            out[c] = path
    return out


def _dir(base: Path, group: str | None) -> Path | None:
    """The group's directory under `base`, or `base` itself where the group's is not visible."""
    if not base.is_dir():
        return None
    own = base / (group or "/").lstrip("/")
    return own if group and own.is_dir() else base


def _stat(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _locate(root: Path, proc_root: Path, pid) -> tuple[str, dict[str, Path | None]]:
    """("v2" | "v1" | "", controller -> its directory)."""
    groups = _groups(proc_root, pid)
    if (root / "cgroup.controllers").is_file():  # v2 mounted at the root
        d = _dir(root, groups.get(""))
        return "v2", {"cpu": d, "cpuset": d, "memory": d}
    dirs = {c: _dir(root / c, groups.get(c)) for c in ("cpu", "cpuset", "memory")}
    if any(dirs.values()):
        return "v1", dirs
    return "", {}


def limits(root: str | os.PathLike = "/sys/fs/cgroup", proc_root: str | os.PathLike = "/proc",
           pid: int | str = "self") -> dict:
    """{version, cpu_quota_cpus (CPUs' worth of time per period, "max": none), cpu_max (as the OS says it),
    cpuset_cpus, memory_max_bytes ("max": none)}: what is readable, {} where there is no cgroup."""
    version, dirs = _locate(Path(root), Path(proc_root), pid)
    if not version:
        return {}
    out: dict = {"version": version}
    cpu, cpuset, memory = dirs.get("cpu"), dirs.get("cpuset"), dirs.get("memory")
    if version == "v2":
        text = _read(cpu / "cpu.max") if cpu else None
        if text:
            quota, _, period = text.partition(" ")
            out["cpu_max"] = text
            out["cpu_quota_cpus"] = UNLIMITED if quota == UNLIMITED else round(int(quota) / int(period or 100000), 4)
        cpus = _read(cpuset / "cpuset.cpus.effective") if cpuset else None
        mem = _read(memory / "memory.max") if memory else None
        if mem:
            out["memory_max_bytes"] = UNLIMITED if mem == UNLIMITED else int(mem)
    else:
        quota = _read(cpu / "cpu.cfs_quota_us") if cpu else None
        period = _read(cpu / "cpu.cfs_period_us") if cpu else None
        if quota and period:
            out["cpu_max"] = f"{'max' if int(quota) < 0 else quota} {period}"
            out["cpu_quota_cpus"] = UNLIMITED if int(quota) < 0 else round(int(quota) / int(period), 4)
        cpus = (_read(cpuset / "cpuset.effective_cpus") or _read(cpuset / "cpuset.cpus")) if cpuset else None
        mem = _read(memory / "memory.limit_in_bytes") if memory else None
        if mem and mem.isdigit():
            out["memory_max_bytes"] = UNLIMITED if int(mem) >= _V1_NO_LIMIT else int(mem)
    if cpus:
        out["cpuset_cpus"] = cpus
    return out


def throttling(root: str | os.PathLike = "/sys/fs/cgroup", proc_root: str | os.PathLike = "/proc",
               pid: int | str = "self") -> dict:
    """{nr_periods, nr_throttled, throttled_seconds}: the cgroup's CPU throttling counters, {} where unreadable."""
    version, dirs = _locate(Path(root), Path(proc_root), pid)
    cpu = dirs.get("cpu")
    stat = _stat(_read(cpu / "cpu.stat")) if cpu else {}
    if "nr_periods" not in stat:
        return {}
    throttled = (stat.get("throttled_usec", 0) / 1e6 if version == "v2" else stat.get("throttled_time", 0) / 1e9)
    return {"nr_periods": stat["nr_periods"], "nr_throttled": stat.get("nr_throttled", 0),
            "throttled_seconds": throttled}


class ThrottlingSampler:
    """The cgroup's throttling counters, read at most once per `interval` seconds (a step runs every few
    milliseconds; cpu.stat is a file read): `read()` gives the latest (nr_periods, nr_throttled,
    throttled_seconds), zeros where the counters are not readable."""

    def __init__(self, interval: float = 1.0, read=throttling):
        self.interval = interval
        self._read = read
        self._next = 0.0
        self._last = (0, 0, 0.0)
        self._readable = True

    def read(self) -> tuple[int, int, float]:
        now = time.monotonic()
        if self._readable and now >= self._next:
            self._next = now + self.interval
            t = self._read()
            self._readable = bool(t)  # no cgroup counters now: none later in this process either
            if t:
                self._last = (int(t["nr_periods"]), int(t["nr_throttled"]), float(t["throttled_seconds"]))
        return self._last
