"""cgroup limits read from both layouts (v2 unified, v1 per controller), in temporary trees shaped like
the kernel's, and from this machine's own /sys/fs/cgroup (whatever it is)."""

from __future__ import annotations

from pathlib import Path

from engine.core import cgroup_limits


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def test_v2_quota_cpuset_memory_and_throttling_of_the_process_group(tmp_path):
    sysfs, proc = tmp_path / "cgroup", tmp_path / "proc"
    _write(proc, {"42/cgroup": "0::/fleet/r1.scope"})
    _write(sysfs, {"cgroup.controllers": "cpu cpuset memory",
                   "cpu.max": "max 100000",  # the root: unlimited; the replica's own group is what counts
                   "fleet/r1.scope/cpu.max": "30000 100000",
                   "fleet/r1.scope/cpuset.cpus.effective": "0-1",
                   "fleet/r1.scope/memory.max": "1073741824",
                   "fleet/r1.scope/cpu.stat": "usage_usec 5\nnr_periods 200\nnr_throttled 150\nthrottled_usec 2500000"})
    limits = cgroup_limits.limits(sysfs, proc, 42)
    assert limits == {"version": "v2", "cpu_max": "30000 100000", "cpu_quota_cpus": 0.3, "cpuset_cpus": "0-1",
                      "memory_max_bytes": 1073741824}
    assert cgroup_limits.throttling(sysfs, proc, 42) == {"nr_periods": 200, "nr_throttled": 150,
                                                         "throttled_seconds": 2.5}


def test_v1_controllers_and_no_limit(tmp_path):
    sysfs, proc = tmp_path / "cgroup", tmp_path / "proc"
    _write(proc, {"7/cgroup": "4:memory:/box\n2:cpu,cpuacct:/\n3:cpuset:/"})
    _write(sysfs, {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
                   "cpu/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0",
                   "cpuset/cpuset.effective_cpus": "0-3",
                   "memory/box/memory.limit_in_bytes": "9223372036854771712"})
    assert cgroup_limits.limits(sysfs, proc, 7) == {"version": "v1", "cpu_max": "max 100000", "cpu_quota_cpus": "max",
                                                    "cpuset_cpus": "0-3", "memory_max_bytes": "max"}
    _write(sysfs, {"cpu/cpu.cfs_quota_us": "50000", "memory/box/memory.limit_in_bytes": "536870912"})
    limits = cgroup_limits.limits(sysfs, proc, 7)
    assert (limits["cpu_quota_cpus"], limits["memory_max_bytes"]) == (0.5, 536870912)
    assert cgroup_limits.throttling(sysfs, proc, 7)["nr_throttled"] == 0


def test_no_cgroup_says_nothing(tmp_path):
    assert cgroup_limits.limits(tmp_path / "none", tmp_path, 1) == {}
    assert cgroup_limits.throttling(tmp_path / "none", tmp_path, 1) == {}


def test_this_machine_reads_without_error():
    limits = cgroup_limits.limits()
    assert limits == {} or limits["version"] in ("v1", "v2")


def test_the_throttling_sampler_reads_at_most_once_an_interval_and_zeros_where_nothing_is_readable():
    readings = iter([{"nr_periods": 10, "nr_throttled": 3, "throttled_seconds": 0.2},
                     {"nr_periods": 20, "nr_throttled": 9, "throttled_seconds": 0.7}])
    calls = []

    def read():
        calls.append(1)
        return next(readings)

    sampler = cgroup_limits.ThrottlingSampler(interval=3600.0, read=read)
    assert sampler.read() == (10, 3, 0.2) and sampler.read() == (10, 3, 0.2)
    assert len(calls) == 1  # the second step within the interval reuses the reading
    sampler._next = 0.0  # the interval has passed
    assert sampler.read() == (20, 9, 0.7)
    none = cgroup_limits.ThrottlingSampler(interval=0.0, read=lambda: {})
    assert none.read() == (0, 0, 0.0) and none.read() == (0, 0, 0.0)
