"""The remote store: any ClickHouse HTTP endpoint (the sidecar, a server, a cluster) via clickhouse-connect.

Target: `http(s)://user:password@host:port/database?option=value` (options go to
clickhouse_connect.get_client, e.g. `compress=lz4`, `verify=false`, `ca_cert=/path`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit, urlunsplit

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError
from clickhouse_connect.driver.query import arrow_buffer

from telemetry.columnar import as_one_batch
from telemetry.store.base import Store, check_dedup_token, check_identifier
from telemetry.store.errors import StoreError, StoreUnavailableError
from telemetry.store.unreachable import unreachable_reason

# urllib3 logs a warning per failed attempt and clickhouse-connect one more; the error raised below says it
# once, plainly (telemetry.store.unreachable)
for _noisy in ("urllib3.connectionpool", "clickhouse_connect.driver._backend.http_sync"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# HTTP statuses that mean "busy or restarting, try again" (ClickHouse sends 503 while starting)
_UNAVAILABLE_STATUSES = ("HTTP status 502", "HTTP status 503", "HTTP status 504", "HTTP status 429")


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _translate(e: Exception, target: str) -> StoreError:
    message = f"{redact(target)}: {e}"
    reason = unreachable_reason(e) if isinstance(e, OperationalError) else None
    if reason is not None:  # urllib3's retry text says nothing a person needs
        return StoreUnavailableError(f"store {redact(target)} unreachable: {reason}")
    if isinstance(e, OperationalError) or any(s in str(e) for s in _UNAVAILABLE_STATUSES):
        return StoreUnavailableError(message)
    return StoreError(message, getattr(e, "code", None))


class RemoteStore(Store):
    def __init__(self, url: str, connect_timeout: float = 5, send_receive_timeout: float = 120, **client_options):
        self.target = url
        options = dict(connect_timeout=connect_timeout, send_receive_timeout=send_receive_timeout,
                       autogenerate_session_id=False, query_retries=1,
                       tz_mode="aware",  # instants stay UTC-aware, as the embedded store returns them
                       interface="https" if url.startswith("https://") else "http")  # not taken from the dsn
        parts = urlsplit(url)
        if parts.hostname in LOOPBACK_HOSTS and "compress" not in parse_qs(parts.query):
            # a sidecar on this host: compressing would only spend the engine process's CPU
            options["compress"] = False
        options.update(client_options)
        try:
            self.client = clickhouse_connect.get_client(dsn=url, **options)
        except (OperationalError, DatabaseError) as e:
            raise _translate(e, url) from None
        self.database = self.client.database or "default"

    def insert_arrow(self, table: str, data: pa.Table, dedup_token: str | None = None) -> int:
        check_identifier(table)
        settings = {"insert_deduplication_token": check_dedup_token(dedup_token)} if dedup_token else None
        # clickhouse-connect's insert_arrow names every column in the INSERT, which goes in the URL,
        # and urllib3 re-encodes that URL character by character in Python: most of an insert's CPU
        # (the recorder's thread shares the GIL with the engine). Arrow carries the names and
        # ClickHouse matches Arrow columns by name, so the statement can go without them.
        # One record batch, one block: a token then names the same block however the batch was chunked.
        compression = self.client.write_compression if self.client.write_compression in ("zstd", "lz4") else None
        try:
            _, block = arrow_buffer(as_one_batch(data), compression)
            self.client.raw_insert(table, None, block, settings=settings, fmt="Arrow")
        except (OperationalError, DatabaseError) as e:
            raise _translate(e, self.target) from None
        return data.num_rows

    def query_arrow(self, sql: str, parameters: Mapping | None = None) -> pa.Table:
        try:
            return self.client.query_arrow(sql, parameters=dict(parameters or {}), use_strings=True)
        except (OperationalError, DatabaseError) as e:
            raise _translate(e, self.target) from None

    def command(self, sql: str, parameters: Mapping | None = None) -> str:
        try:
            result = self.client.command(sql, parameters=dict(parameters or {}))
        except (OperationalError, DatabaseError) as e:
            raise _translate(e, self.target) from None
        if isinstance(result, (list, tuple)):
            return "\t".join(map(str, result))
        return "" if result is None or not isinstance(result, (str, int, float)) else str(result)

    def close(self) -> None:
        self.client.close()
