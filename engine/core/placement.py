"""Where a replica runs: its CPUs, their NUMA nodes, its memory policy, its GPU's node, and binding.

Everything is read from sysfs and procfs, whose roots are parameters so tests can
describe a two-socket machine in a temporary directory. A mismatch (CPUs over
several nodes, memory or GPU on a node the CPUs are not on) is the classic cause
of "replica 3 is always slower".
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.core import mempolicy


@dataclass
class Placement:
    cpu_affinity: list[int]
    cpu_numa_nodes: list[int]  # nodes of the CPUs in cpu_affinity
    mem_policy_nodes: list[int]  # nodes memory may come from
    gpu_numa_node: int = -1  # -1: no GPU, or the platform does not say
    numa_mismatch: bool = False
    numa_nodes: dict[int, list[int]] = field(default_factory=dict)  # the machine: node -> its CPUs
    mem_policy: str = "cpuset"  # get_mempolicy's mode ("default", "bind" ...), or "cpuset" (Mems_allowed_list)
    gpu_pci_address: str = ""
    mismatch_reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read or set

    def record_fields(self) -> dict:
        """The ReplicaRecord placement fields."""
        return {"cpu_affinity": self.cpu_affinity, "cpu_numa_nodes": self.cpu_numa_nodes,
                "mem_policy_nodes": self.mem_policy_nodes, "gpu_numa_node": self.gpu_numa_node,
                "numa_mismatch": self.numa_mismatch}


# -- cpulist format ("0-3,8,10-11") ------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_cpulist(text: str) -> list[int]:
    """The kernel's list format: "0-3,8,10-11" (and "0-7:2" strides) -> sorted unique ints."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad CPU/node list {text!r}: expected e.g. '0-3,8,10-11'")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if high < low:
            raise ValueError(f"bad CPU/node list {text!r}: range {part} runs backwards")
        out.update(range(low, high + 1, int(m.group(3) or 1)))
    return sorted(out)


def format_cpulist(values) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8"."""
    values = sorted(set(values))
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


# -- discovery --------------------------------------------------------------------------

def numa_topology(sysfs_root: str | os.PathLike = "/sys") -> dict[int, list[int]]:
    """{node: its CPUs} from <sysfs>/devices/system/node/node*/cpulist ({} when sysfs has no NUMA view)."""
    topology = {}
    for path in Path(sysfs_root, "devices/system/node").glob("node*/cpulist"):
        node = path.parent.name.removeprefix("node")
        if node.isdigit():
            topology[int(node)] = parse_cpulist(path.read_text())
    return dict(sorted(topology.items()))


def normalize_pci_address(address: str) -> str:
    """NVML's "00000000:3B:00.0" or "3b:00.0" -> sysfs's "0000:3b:00.0"."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", address.strip())
    if not m:
        raise ValueError(f"bad PCI address {address!r}: expected e.g. 0000:3b:00.0")
    domain = int(m.group(1) or "0", 16) & 0xFFFF
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def gpu_numa_node(sysfs_root, pci_address: str) -> int:
    """<sysfs>/bus/pci/devices/<addr>/numa_node; -1 when absent or unknown."""
    path = Path(sysfs_root, "bus/pci/devices", normalize_pci_address(pci_address), "numa_node")
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


def visible_gpu_pci_address(device_index: int = 0) -> str:
    """The PCI address of a visible CUDA device ("" without one): torch when it is loaded, else NVML."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and device_index < torch.cuda.device_count():
            p = torch.cuda.get_device_properties(device_index)
            return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:
        pass
    try:
        import pynvml  # optional (nvidia-ml-py)

        pynvml.nvmlInit()
        try:
            bus_id = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(device_index)).busId
            return normalize_pci_address(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return ""


def _status_field(proc_root, pid: int, key: str) -> str | None:
    try:
        for line in Path(proc_root, str(pid), "status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == key:
                return rest.strip()
    except OSError:
        return None
    return None


def discover_placement(sysfs_root: str | os.PathLike = "/sys", pid: int | None = None,
                       gpu_pci_address: str | None = None, proc_root: str | os.PathLike = "/proc") -> Placement:
    """Placement of process `pid` (this one by default).

    On the real /proc, affinity comes from sched_getaffinity and, for this process,
    the memory policy from get_mempolicy; otherwise (or as fallback) from
    /proc/<pid>/status. gpu_pci_address: the replica's GPU ("0000:3b:00.0" or NVML's
    "00000000:3B:00.0"), None for a CPU replica, "auto" for the first visible CUDA device.
    """
    pid = os.getpid() if pid is None else pid
    real_proc = Path(proc_root) == Path("/proc")
    notes: list[str] = []
    topology = numa_topology(sysfs_root)

    if real_proc:
        try:
            cpus = sorted(os.sched_getaffinity(pid))
        except ProcessLookupError:
            raise ValueError(f"no process with pid {pid}") from None
    else:
        allowed = _status_field(proc_root, pid, "Cpus_allowed_list")
        if allowed is None:
            raise ValueError(f"no Cpus_allowed_list in {Path(proc_root, str(pid), 'status')}")
        cpus = parse_cpulist(allowed)
    cpu_nodes = sorted({node for node, node_cpus in topology.items() if set(node_cpus) & set(cpus)})

    mems_allowed = _status_field(proc_root, pid, "Mems_allowed_list")
    mem_nodes = parse_cpulist(mems_allowed) if mems_allowed else sorted(topology)
    mem_policy = "cpuset"
    if mems_allowed is None:
        notes.append("Mems_allowed_list unreadable: assuming all nodes")
    policy = mempolicy.get_mempolicy() if real_proc and pid == os.getpid() else None
    if policy is not None:
        mem_policy, policy_nodes = policy
        if policy_nodes:  # default / local policies name no nodes: the cpuset's nodes apply
            mem_nodes = policy_nodes
    elif real_proc and pid == os.getpid():
        notes.append("get_mempolicy unavailable (no libnuma): memory nodes from Mems_allowed_list")

    if gpu_pci_address == "auto":
        gpu_pci_address = visible_gpu_pci_address()
        if not gpu_pci_address:
            notes.append("no visible CUDA device found")
    gpu_node = gpu_numa_node(sysfs_root, gpu_pci_address) if gpu_pci_address else -1

    reasons = mismatch_reasons(cpu_nodes, mem_nodes, mem_policy, gpu_node)
    return Placement(
        cpu_affinity=cpus, cpu_numa_nodes=cpu_nodes, mem_policy_nodes=mem_nodes, gpu_numa_node=gpu_node,
        numa_mismatch=bool(reasons), numa_nodes=topology, mem_policy=mem_policy,
        gpu_pci_address=normalize_pci_address(gpu_pci_address) if gpu_pci_address else "",
        mismatch_reasons=reasons, notes=notes,
    )


def mismatch_reasons(cpu_nodes: list[int], mem_nodes: list[int], mem_policy: str, gpu_node: int) -> list[str]:
    """Why CPUs, memory and GPU do not sit on one node ([] when they do, or when there is no NUMA view)."""
    if not cpu_nodes:
        return []
    reasons = []
    if len(cpu_nodes) > 1:
        reasons.append(f"CPUs span NUMA nodes {cpu_nodes}")
    cpu_set, mem_set = set(cpu_nodes), set(mem_nodes)
    # bind / preferred / default allocate on the nearest allowed node: fine while every CPU node is allowed;
    # interleave spreads pages over all its nodes: fine only when those are exactly the CPUs' nodes
    spread = mem_policy in ("interleave", "weighted_interleave")
    if mem_nodes and (mem_set != cpu_set if spread else not cpu_set <= mem_set):
        reasons.append(f"memory policy ({mem_policy}) nodes {mem_nodes} are not the CPUs' nodes {cpu_nodes}")
    if gpu_node >= 0 and gpu_node not in cpu_set:
        reasons.append(f"GPU on NUMA node {gpu_node}, CPUs on {cpu_nodes}")
    return reasons


# -- binding ----------------------------------------------------------------------------

def bind_replica(cpus: list[int] | str | None = None, numa_node: int | None = None,
                 sysfs_root: str | os.PathLike = "/sys", bind_memory: bool = True) -> Placement:
    """Pin this process to `cpus` (a list or "0-3,8") or to `numa_node`'s CPUs, and bind memory to the node.

    Affinity is set on every thread of the process. The memory policy (set_mempolicy
    MPOL_BIND through libnuma) applies to the calling thread and the threads it
    starts afterwards, so call this early, before the engine starts its threads.
    Returns the resulting Placement; `notes` says what could not be applied.
    """
    if cpus is None and numa_node is None:
        raise ValueError("bind_replica needs cpus, numa_node, or both")
    topology = numa_topology(sysfs_root)
    if numa_node is not None and numa_node not in topology:
        raise ValueError(f"NUMA node {numa_node} does not exist here (nodes: {sorted(topology) or 'none'})")
    targets = parse_cpulist(cpus) if isinstance(cpus, str) else sorted(set(cpus or topology[numa_node]))
    if not targets:
        raise ValueError("bind_replica: empty CPU list")
    try:
        os.sched_setaffinity(0, targets)
    except OSError as e:
        raise ValueError(f"cannot pin to CPUs {format_cpulist(targets)}: {e.strerror}") from None
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, targets)
        except OSError:  # a thread that just ended
            pass
    notes = []
    if numa_node is not None and bind_memory:
        error = mempolicy.set_mempolicy(mempolicy.MPOL_BIND, [numa_node])
        if error:
            notes.append(f"memory policy not set ({error}); memory follows the CPUs by first touch")
    placement = discover_placement(sysfs_root)
    placement.notes.extend(notes)
    return placement


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []
