"""The insert deduplication token of a recorder batch: the batch's identity, not its bytes.

    <replica>.<run start>.<table>.<seq>     e.g. replica-0.1767225600123456.requests.42

replica: the replica id in the tokens' alphabet (see `safe_replica_id`); run start: when the
recorder started, in microseconds since the epoch (unique within a process); table; seq: the
table's batch number in that run, from 1.

The token is fixed when a batch is formed and travels with it (a spool file keeps it), so a
retry, a replay by this process or by the next one, or the same rows encoded again are all one
batch to ClickHouse, which keeps the first copy (`insert_deduplication_token`, remembered for the
last `non_replicated_deduplication_window` blocks of each table). The other side of it: ClickHouse
silently discards a *different* batch sent under a token it has seen, so no two batches may share
one; hence the run start and the hash in `safe_replica_id`.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # '.' separates the token's fields
_MAX_ID = 48
_last_start = 0
_start_lock = threading.Lock()


def safe_replica_id(replica_id: str) -> str:
    """The replica id as a token field and a file name. An id that had to change (other characters,
    too long) gets a short hash of the original, so two ids never map to the same name."""
    replica_id = replica_id or "replica"
    safe = _UNSAFE.sub("_", replica_id)
    if safe == replica_id and len(safe) <= _MAX_ID:
        return safe
    digest = hashlib.sha256(replica_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[:_MAX_ID]}-{digest}"


def unique_run_start_us() -> int:
    """Now, in microseconds since the epoch, never the same value twice in this process."""
    global _last_start
    with _start_lock:
        _last_start = max(time.time_ns() // 1000, _last_start + 1)
        return _last_start


def run_prefix(replica_id: str, run_start_us: int) -> str:
    return f"{safe_replica_id(replica_id)}.{run_start_us}"


def batch_token(prefix: str, table: str, seq: int) -> str:
    return f"{prefix}.{table}.{seq}"
