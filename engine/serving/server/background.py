"""Serve an app from a background thread (tests, notebooks): `with BackgroundServer(app) as s: s.url`."""

from __future__ import annotations

import threading
import time

from engine.util import free_port
from engine.serving.server.keep_alive import KEEP_ALIVE_SECONDS


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, drain_timeout: float = 5.0,
                 keep_alive: float = KEEP_ALIVE_SECONDS, http=None):
        import uvicorn

        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        extra = {"http": http} if http is not None else {}  # a protocol class: telemetry.connections' guard
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=drain_timeout, timeout_keep_alive=keep_alive,
                                                    **extra))
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
