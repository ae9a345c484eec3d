"""A real replica for the API tests: AsyncLLM on a tiny Llama, telemetry into a real sidecar,
served by uvicorn on a free port (in a thread, so tests can also look inside the engine)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine.serving.server.background import BackgroundServer

REPLICA_ID = "api-test"
MAX_MODEL_LEN = 1024


@dataclass
class Live:
    url: str
    served: object  # ServedModel
    parts: object  # TelemetryParts
    store_url: str

    def flush(self) -> None:
        if self.parts.recorder is not None:
            self.parts.recorder.flush()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def wait_idle(self, timeout: float = 20.0) -> dict:
        """Until the engine holds no request and no KV block (bounded); returns the last /health."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (h["running"], h["waiting"], h["kv_blocks_used"], h["in_flight"]) == (0, 0, 0, 0):
                return h
            if time.monotonic() > deadline:
                return h
            time.sleep(0.05)


@pytest.fixture(scope="session")
def sidecar_url(tmp_path_factory, migrated_copy):
    """`infersight sidecar` in its own process, as a fleet runs it."""
    from telemetry.sidecar.process import start_sidecar

    sidecar = start_sidecar(migrated_copy(tmp_path_factory.mktemp("sidecar-store")))
    try:
        yield sidecar.store_url
    finally:
        sidecar.stop()


@pytest.fixture(scope="session")
def store(sidecar_url):
    from telemetry.store import open_store

    s = open_store(sidecar_url)
    yield s
    s.close()


@pytest.fixture(scope="session")
def live(tiny_llama, sidecar_url):
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    config = EngineConfig(model=str(tiny_llama), max_model_len=MAX_MODEL_LEN, num_kv_blocks=80, block_size=16,
                          max_num_seqs=8, replica_id=REPLICA_ID)
    observer, parts = build_observer(REPLICA_ID, Path(tiny_llama).resolve().name, store_target=sidecar_url)
    engine = AsyncLLM(config, observer)
    served = ServedModel.from_engine(engine, created=int(time.time()))
    app = build_app(served, metrics_registry=parts.registry, metrics_observer=parts.metrics)
    with BackgroundServer(app) as server:
        yield Live(server.url, served, parts, sidecar_url)
    parts.close()


@pytest.fixture
def client(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c
