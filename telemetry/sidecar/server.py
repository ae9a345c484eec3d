"""Run the sidecar: open the store, apply migrations, serve HTTP until stopped."""

from __future__ import annotations

import logging

import uvicorn

from telemetry.connections import bind_socket, guarded_protocol, raise_open_files_limit
from telemetry.schema import migrate
from telemetry.sidecar.app import SidecarApp
from telemetry.sidecar.handler import Sidecar, Users
from telemetry.sidecar.limits import Limits
from telemetry.sidecar.store_health import StoreHealth
from telemetry.store import open_store

log = logging.getLogger(__name__)


def serve(data_dir: str, host: str = "127.0.0.1", port: int = 8123, users: Users = Users(), name: str = "sidecar",
          max_body_bytes: int = 256 << 20, finding_active_window_seconds: float = 3600, limits: Limits = Limits(),
          query_timeout_seconds: float = 120, max_result_bytes: int = 512 << 20, max_query_memory_bytes: int = 2 << 30,
          tls_cert: str | None = None, tls_key: str | None = None, on_ready=None) -> None:
    """Blocks until SIGINT/SIGTERM. `on_ready(url)` is called once the socket listens."""
    store = open_store(data_dir, pool_size=limits.store_sessions)
    try:
        applied = migrate(store)
        if applied:
            log.info("applied migrations %s", applied)
        health = StoreHealth(store)
        health.start()  # CHECK TABLE reads every part: in the background, ingest does not wait for it
        sidecar = Sidecar(store, users, name, max_body_bytes, finding_active_window_seconds,
                          query_timeout_seconds, max_result_bytes, max_query_memory_bytes)
        sidecar.metrics.watch_store_health(health)
        raise_open_files_limit(limits.max_connections + 1024)  # + chdb's own files
        sock = bind_socket(host, port)
        bound_port = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        # no limit_concurrency: it counts idle sockets and answers everyone 503; the lanes bound the
        # work and the protocol bounds the sockets
        protocol = guarded_protocol(limits.header_timeout_seconds, limits.max_connections, sidecar.metrics.reject)
        config = uvicorn.Config(SidecarApp(sidecar, limits, health), http=protocol, log_level="warning",
                                access_log=False, lifespan="on", timeout_keep_alive=30, timeout_graceful_shutdown=10,
                                ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        server = uvicorn.Server(config)
        if on_ready:
            on_ready(f"{'https' if tls_cert else 'http'}://{url_host}:{bound_port}")
        server.run(sockets=[sock])
    finally:
        store.close()
