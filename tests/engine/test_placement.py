"""Placement discovery and binding: a two-socket machine as a fixture tree, then this real machine."""

from __future__ import annotations

import os

import pytest

from engine.core import mempolicy
from engine.core.placement import (
    bind_replica, discover_placement, format_cpulist, normalize_pci_address, numa_topology, parse_cpulist,
)

PID = 4242
GPU = "0000:3b:00.0"


def two_socket(tmp_path, cpus_allowed: str, mems_allowed: str | None, gpu_node: int = 1):
    """sys/ and proc/ of a machine with node0 = CPUs 0-7, node1 = CPUs 8-15, a GPU on `gpu_node`."""
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    for node, cpulist in ((0, "0-7"), (1, "8-15")):
        d = sys_root / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (sys_root / "devices/system/node/possible").write_text("0-1\n")  # not a node dir: ignored
    gpu = sys_root / "bus/pci/devices" / GPU
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text(f"{gpu_node}\n")
    status = [f"Name:\tpython", f"Pid:\t{PID}", f"Cpus_allowed_list:\t{cpus_allowed}"]
    if mems_allowed is not None:
        status.append(f"Mems_allowed_list:\t{mems_allowed}")
    (proc_root / str(PID)).mkdir(parents=True)
    (proc_root / str(PID) / "status").write_text("\n".join(status) + "\n")
    return dict(sysfs_root=sys_root, proc_root=proc_root, pid=PID)


@pytest.mark.parametrize("text,expected", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("5", [5]),
    ("0-7:2", [0, 2, 4, 6]),
    (" 3, 1-2 ,1\n", [1, 2, 3]),
    ("", []),
])
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1,,x", "0-"])
def test_parse_cpulist_rejects_garbage(bad):
    with pytest.raises(ValueError, match="CPU/node list"):
        parse_cpulist(bad)


def test_format_cpulist_round_trips():
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist(format_cpulist([0, 2, 3, 4, 9])) == [0, 2, 3, 4, 9]


def test_pci_addresses_from_nvml_and_short_forms():
    assert normalize_pci_address("00000000:3B:00.0") == GPU
    assert normalize_pci_address("3b:00.0") == GPU
    with pytest.raises(ValueError, match="PCI address"):
        normalize_pci_address("gpu0")


def test_aligned_replica_on_node_1(tmp_path):
    p = discover_placement(**two_socket(tmp_path, "8-15", "1"), gpu_pci_address="00000000:3B:00.0")
    assert p.numa_nodes == {0: list(range(8)), 1: list(range(8, 16))}
    assert p.cpu_affinity == list(range(8, 16))
    assert (p.cpu_numa_nodes, p.mem_policy_nodes, p.gpu_numa_node) == ([1], [1], 1)
    assert p.gpu_pci_address == GPU
    assert p.numa_mismatch is False and p.mismatch_reasons == []
    assert p.record_fields() == {"cpu_affinity": list(range(8, 16)), "cpu_numa_nodes": [1],
                                 "mem_policy_nodes": [1], "gpu_numa_node": 1, "numa_mismatch": False}


def test_cpus_spanning_both_sockets_is_a_mismatch(tmp_path):
    p = discover_placement(**two_socket(tmp_path, "4-11", "0-1"), gpu_pci_address=GPU)
    assert p.cpu_numa_nodes == [0, 1]
    assert p.numa_mismatch is True
    assert any("span" in r for r in p.mismatch_reasons)


def test_memory_on_the_other_socket_is_a_mismatch(tmp_path):
    p = discover_placement(**two_socket(tmp_path, "8-15", "0"), gpu_pci_address=GPU)
    assert (p.cpu_numa_nodes, p.mem_policy_nodes) == ([1], [0])
    assert p.numa_mismatch is True
    assert [r for r in p.mismatch_reasons if "memory" in r]


def test_gpu_on_the_other_socket_is_a_mismatch(tmp_path):
    p = discover_placement(**two_socket(tmp_path, "0-7", "0", gpu_node=1), gpu_pci_address=GPU)
    assert (p.cpu_numa_nodes, p.mem_policy_nodes, p.gpu_numa_node) == ([0], [0], 1)
    assert p.numa_mismatch is True
    assert p.mismatch_reasons == ["GPU on NUMA node 1, CPUs on [0]"]
    # the same process with its GPU on its own socket is fine
    p = discover_placement(**two_socket(tmp_path / "b", "0-7", "0", gpu_node=0), gpu_pci_address=GPU)
    assert p.numa_mismatch is False


def test_a_cpuset_allowing_both_nodes_is_not_a_mismatch(tmp_path):
    # default policy allocates on the local node, and the local node is allowed
    p = discover_placement(**two_socket(tmp_path, "8,10-11", "0-1"))
    assert p.cpu_affinity == [8, 10, 11]
    assert p.mem_policy == "cpuset" and p.mem_policy_nodes == [0, 1]
    assert p.gpu_numa_node == -1 and p.numa_mismatch is False


def test_unknown_gpu_address_and_missing_process(tmp_path):
    fixture = two_socket(tmp_path, "0-7", "0")
    assert discover_placement(**fixture, gpu_pci_address="0000:af:00.0").gpu_numa_node == -1
    with pytest.raises(ValueError, match="Cpus_allowed_list"):
        discover_placement(fixture["sysfs_root"], pid=1, proc_root=fixture["proc_root"])
    with pytest.raises(ValueError, match="pid"):
        discover_placement(pid=2**22 + 12345)


def test_real_discovery_on_this_machine():
    p = discover_placement()
    assert p.cpu_affinity == sorted(os.sched_getaffinity(0))
    topology = numa_topology()
    assert p.numa_nodes == topology
    assert p.cpu_numa_nodes == sorted(n for n, cpus in topology.items() if set(cpus) & set(p.cpu_affinity))
    if mempolicy.available():
        assert p.mem_policy in mempolicy.MODES.values()
    if len(topology) == 1:
        assert p.cpu_numa_nodes == [next(iter(topology))] and p.numa_mismatch is False


@pytest.fixture
def restore_binding():
    affinity = os.sched_getaffinity(0)
    yield
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), affinity)
        except OSError:
            pass
    mempolicy.set_mempolicy(mempolicy.MPOL_DEFAULT, [])


def test_bind_to_a_node_pins_every_thread_and_memory(tmp_path, restore_binding):
    cpus = sorted(os.sched_getaffinity(0))
    real_node = next(iter(numa_topology()), 0)
    # a fixture topology over this machine's CPUs: node `real_node` holds only the first CPU
    sys_root = tmp_path / "sys"
    (sys_root / f"devices/system/node/node{real_node}").mkdir(parents=True)
    (sys_root / f"devices/system/node/node{real_node}/cpulist").write_text(str(cpus[0]))
    p = bind_replica(numa_node=real_node, sysfs_root=sys_root)
    assert p.cpu_affinity == [cpus[0]]
    assert all(os.sched_getaffinity(int(t)) == {cpus[0]} for t in os.listdir("/proc/self/task"))
    if mempolicy.available():
        assert (p.mem_policy, p.mem_policy_nodes) == ("bind", [real_node])
    else:
        assert any("memory policy not set" in n for n in p.notes)


def test_bind_to_a_cpu_list(restore_binding):
    first = min(os.sched_getaffinity(0))
    p = bind_replica(cpus=str(first))
    assert p.cpu_affinity == [first] and os.sched_getaffinity(0) == {first}


def test_bind_rejects_what_cannot_be_done(tmp_path):
    with pytest.raises(ValueError, match="cpus, numa_node"):
        bind_replica()
    with pytest.raises(ValueError, match="NUMA node 7 does not exist"):
        bind_replica(numa_node=7, sysfs_root=two_socket(tmp_path, "0-7", "0")["sysfs_root"])
    with pytest.raises(ValueError, match="cannot pin"):
        bind_replica(cpus=[4095])


def test_a_cpu_replica_has_no_gpu_node_and_auto_finds_none_without_cuda(tmp_path):
    fixture = two_socket(tmp_path, "0-7", "0")
    assert discover_placement(**fixture).gpu_numa_node == -1
    import engine.core.placement as placement

    if not placement.visible_gpu_pci_address():
        p = discover_placement(**fixture, gpu_pci_address="auto")
        assert p.gpu_numa_node == -1 and "no visible CUDA device found" in p.notes
