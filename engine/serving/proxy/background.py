"""A recording proxy served from a background thread (tests, notebooks), its rows written by a real
Recorder: `with BackgroundProxy.start(upstream_url, store_url, "v0") as p: p.url`."""

from __future__ import annotations

import time

from engine.serving.proxy.app import RecordingProxy
from engine.serving.server.background import BackgroundServer
from telemetry.replica_wiring import build_observer


class BackgroundProxy:
    def __init__(self, proxy: RecordingProxy, parts, server: BackgroundServer):
        self.proxy, self.parts, self.server = proxy, parts, server
        self.url = server.url

    @classmethod
    def start(cls, upstream_url: str, store_url: str | None, replica_id: str, model_dir=None,
              recorder_kwargs: dict | None = None, **proxy_kwargs) -> BackgroundProxy:
        tokenizer = None
        if model_dir is not None:
            from engine.core.tokenization import Tokenizer

            tokenizer = Tokenizer(model_dir)
        observer, parts = build_observer(replica_id, "proxied", store_target=store_url, metrics=False,
                                         recorder_kwargs=recorder_kwargs)
        proxy = RecordingProxy(upstream_url, observer, replica_id, tokenizer=tokenizer, registry=parts.registry,
                               **proxy_kwargs)
        return cls(proxy, parts, BackgroundServer(proxy.app()).start())

    def wait_recorded(self, n: int, timeout: float = 20.0) -> None:
        """Until `n` rows in all have been handed to the recorder (rows are built after each response)."""
        deadline = time.monotonic() + timeout
        while self.proxy.recorded < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.proxy.recorded} of {n} rows recorded after {timeout:.0f} s")
            time.sleep(0.02)

    def flush(self) -> None:
        if self.parts.recorder is not None:
            self.parts.recorder.flush()

    def close(self) -> None:
        self.server.stop()
        self.parts.close()

    def __enter__(self) -> BackgroundProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
