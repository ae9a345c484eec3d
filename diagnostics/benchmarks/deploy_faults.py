"""What the deploy matrix does to a replica besides its engine options and model files: a CPU quota from
the OS, a restart with other options under the same replica id, and a tenant of its own.

- cpu_quota_group: a cgroup with a CPU quota (cgroup v1 `cpu` or v2 `cpu.max`), and the environment that
  puts a replica's process into it as it starts, before it reads its limits (the way `cgexec` or a
  container runtime would: the process starts inside the group). Where no cgroup can be created (no
  writable hierarchy with the cpu controller) it raises QuotaUnavailable: pinning with taskset or
  lowering the priority with nice is not the same fault (no quota in the identity, no throttling), so
  the fault is reported as not run rather than faked;
- restart_replica: stop one replica of a fleet and start it again on the same port and spool under the
  same id with other engine options, as an operator who edits the fleet's TOML and restarts it would;
- Tenant: the traffic a replica gets when another tenant's requests land on it: more of them, longer
  outputs, its own system prompts and seed. Nothing about the replica differs, so nothing above info
  may be said about it.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.serving.fleet.fleet import replica_command, replica_spool_dir
from engine.serving.processes import spawn, stop, wait_compiled, wait_healthy
from engine.serving.fleet.state import FleetState

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
_PROCS_ENV = "INFERSIGHT_FM_CGROUP_PROCS"
# imported by the replica's interpreter at start (a sitecustomize on its PYTHONPATH): it joins the group
# before any of its code runs, so its start row records the quota
_JOIN = f"""import os
_procs = os.environ.pop({_PROCS_ENV!r}, None)
if _procs:
    with open(_procs, "w") as _f:
        _f.write(str(os.getpid()))
"""


class QuotaUnavailable(RuntimeError):
    """No cgroup with a CPU quota can be made on this machine (and nothing else is the same fault)."""


def _hierarchy(root: Path = CGROUP_ROOT) -> tuple[str, Path]:
    """("v1" | "v2", the directory new groups go in) where this process may create one."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").is_file() and os.access(v1, os.W_OK):
        return "v1", v1
    for v2 in (root, root / "unified"):
        controllers = v2 / "cgroup.subtree_control"
        if controllers.is_file() and "cpu" in controllers.read_text().split() and os.access(v2, os.W_OK):
            return "v2", v2
    raise QuotaUnavailable(f"no writable cgroup hierarchy with the cpu controller under {root} "
                           "(a CPU quota needs one; taskset or nice would be another fault)")


@contextmanager
def cpu_quota_group(cpus: float, root: Path = CGROUP_ROOT):
    """A cgroup limited to `cpus` CPUs' worth of time; yields the env a replica spec takes to start in it."""
    version, parent = _hierarchy(root)
    group = parent / f"infersight-fm-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    group.mkdir()
    hook = Path(tempfile.mkdtemp(prefix="infersight-fm-cgroup-"))
    try:
        quota = int(cpus * PERIOD_US)
        if version == "v1":
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        (hook / "sitecustomize.py").write_text(_JOIN)
        path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
        yield {"PYTHONPATH": path, _PROCS_ENV: str(group / "cgroup.procs")}
    finally:
        (hook / "sitecustomize.py").unlink(missing_ok=True)
        hook.rmdir()
        _remove(group)


def _remove(group: Path, timeout: float = 30.0) -> None:
    """rmdir the group once its processes are gone (the fleet is brought down before this runs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def restart_replica(state: FleetState, spec, model_dir: Path, log_level: str = "warning",
                    timeout: float = 240.0) -> None:
    """Replace replica `spec.id` of the fleet `state` by a fresh `infersight serve` with `spec`'s options:
    the same id, port, store and spool; a deploy of its own (its own deploy time). The state is saved, so
    `fleet_down` stops the new process."""
    old = next(r for r in state.replicas if r.name == spec.id)
    stop([old.ref], timeout=state.stop_timeout)
    cmd = replica_command(spec, model_dir, "127.0.0.1", old.port, state.store_url or None, log_level,
                          replica_spool_dir(Path(state.run_dir), spec.id), time.time())
    ref = spawn(cmd, Path(old.log), spec.env, append=True)
    old.pid, old.start_ticks, old.cmd = ref.pid, ref.start_ticks, cmd
    state.note(f"replica {spec.id} restarted with other options")
    state.save()
    wait_healthy(old.url, ref, timeout, Path(old.log))
    wait_compiled(old.url, timeout)  # as `fleet up` waits: its traffic meets the path the replica keeps


@dataclass(frozen=True)
class Tenant:
    """The candidate's own traffic beside the fleet's (the baselines keep the default): `load` times the
    requests per second each baseline gets, a fixed output length for each side, a workload seed of its own
    (another system prompt, other sampling seeds)."""
    load: float = 1.0
    max_tokens: tuple[int | None, int | None] = (None, None)  # (the fleet's, the tenant's)
    own_seed: bool = False
