"""What a replica's memory is made of at start: its resident set against the weights and the KV pool.

The target the start summary is read against: RSS <= weights + KV pool + ~400 MB of interpreter, torch and
libraries. `overhead_bytes` is that last part; when it grows, an import or a copy crept in (measure with
`python -X importtime -m dashboards.console.cli serve --model DIR`; tests/engine/test_replica_imports.py
keeps the compiler out of a replica that does not compile).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemoryAtStart:
    rss_bytes: int
    peak_rss_bytes: int
    weights_bytes: int  # parameters and buffers, each storage counted once (tied embeddings, views); packed copies
    kv_bytes: int

    @property
    def overhead_bytes(self) -> int:
        return self.rss_bytes - self.weights_bytes - self.kv_bytes

    def describe(self) -> str:
        mib = 2**20
        return (f"memory: RSS {self.rss_bytes / mib:.0f} MiB (peak {self.peak_rss_bytes / mib:.0f} MiB) = weights "
                f"{self.weights_bytes / mib:.0f} MiB + KV pool {self.kv_bytes / mib:.0f} MiB + the rest "
                f"{self.overhead_bytes / mib:.0f} MiB")


def process_rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes, from /proc (0, 0 where there is none)."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found.get("VmRSS", 0), found.get("VmHWM", 0)


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def memory_at_start(model: torch.nn.Module, kv_caches) -> MemoryAtStart:
    rss, peak = process_rss()
    # meta tensors stand for plain weights freed once their packed copies served every row (models/packed_linear.py)
    weights = _storage_bytes([t for t in (*model.parameters(), *model.buffers()) if t.device.type != "meta"])
    weights += sum(mm.nbytes for mm in getattr(model, "packed_matmuls", ()))  # models without packing: none
    kv = _storage_bytes([t for pair in kv_caches for t in pair])
    return MemoryAtStart(rss, peak, weights, kv)
