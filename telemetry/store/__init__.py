"""The telemetry store: `open_store(target)` -> Store.

- a directory (the default everywhere): the embedded chdb store, one process per directory;
- `http(s)://user:password@host:port/database`: any ClickHouse HTTP endpoint via
  clickhouse-connect, e.g. the sidecar (`infersight sidecar`) or a real ClickHouse cluster.
"""

from __future__ import annotations

import os

from telemetry.store.base import Store
from telemetry.store.errors import StoreError, StoreLockedError, StoreUnavailableError

__all__ = ["Store", "StoreError", "StoreLockedError", "StoreUnavailableError", "open_store", "is_remote"]


def is_remote(target) -> bool:
    return isinstance(target, str) and target.startswith(("http://", "https://"))


def open_store(target: str | os.PathLike | Store, **options) -> Store:
    """Open the store at `target` (a data directory, or an http(s) URL). A Store passes through."""
    if isinstance(target, Store):
        return target
    if is_remote(target):
        from telemetry.store.remote import RemoteStore
        return RemoteStore(target, **options)
    from telemetry.store.embedded import EmbeddedStore
    return EmbeddedStore(target, **options)
