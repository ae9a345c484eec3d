"""Run the sidecar: open the store, apply migrations, serve HTTP until stopped."""

from __future__ import annotations

import logging
import socket

import uvicorn

from telemetry.schema import migrate
from telemetry.sidecar.app import SidecarApp
from telemetry.sidecar.handler import Sidecar, Users
from telemetry.store import open_store

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port; read it back from getsockname())."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def serve(data_dir: str, host: str = "127.0.0.1", port: int = 8123, users: Users = Users(), name: str = "sidecar",
          max_body_bytes: int = 256 << 20, finding_active_window_seconds: float = 3600, worker_threads: int = 16,
          query_timeout_seconds: float = 120, max_result_bytes: int = 512 << 20,
          tls_cert: str | None = None, tls_key: str | None = None, on_ready=None) -> None:
    """Blocks until SIGINT/SIGTERM. `on_ready(url)` is called once the socket listens."""
    store = open_store(data_dir)
    try:
        applied = migrate(store)
        if applied:
            log.info("applied migrations %s", applied)
        sidecar = Sidecar(store, users, name, max_body_bytes, finding_active_window_seconds,
                          query_timeout_seconds, max_result_bytes)
        sock = bind_socket(host, port)
        bound_port = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        config = uvicorn.Config(SidecarApp(sidecar, worker_threads), log_level="warning", access_log=False,
                                lifespan="on", timeout_keep_alive=30, timeout_graceful_shutdown=10,
                                limit_concurrency=1024, ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        server = uvicorn.Server(config)
        if on_ready:
            on_ready(f"{'https' if tls_cert else 'http'}://{url_host}:{bound_port}")
        server.run(sockets=[sock])
    finally:
        store.close()
