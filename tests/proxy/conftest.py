"""A real upstream (infersight's own server on a tiny Llama, recording its own rows as `up`), the
recording proxy in front of it (recording as `px`), both writing into one real sidecar.

Started once for every module here: the tests find their rows by their own request IDs and read
the proxy's counters relative to their start, so one sidecar, upstream and proxy serve them all."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from proxy_support import Upstream

from engine.serving.proxy.background import BackgroundProxy
from engine.serving.server.background import BackgroundServer

MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def sidecar(tmp_path_factory, migrated_copy):
    from telemetry.sidecar.process import start_sidecar

    process = start_sidecar(migrated_copy(tmp_path_factory.mktemp("proxy-store")))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def store(sidecar):
    from telemetry.store import open_store

    s = open_store(sidecar.store_url)
    yield s
    s.close()


@pytest.fixture(scope="session")
def upstream(tiny_llama, sidecar):
    """infersight's server, recording its own rows under replica id `up` (the truth the proxy's rows
    are compared with)."""
    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    # One token per decode step: the stream tests compare a direct request's chunks with a proxied one's,
    # one for one, which needs the upstream to cut the same prompt's stream the same way each time; the
    # "auto" multi-step default picks K from measured step times, so two requests may be cut differently.
    config = EngineConfig(model=str(tiny_llama), max_model_len=MAX_MODEL_LEN, num_kv_blocks=96, block_size=16,
                          max_num_seqs=8, replica_id="up", num_scheduler_steps=1)
    observer, parts = build_observer("up", Path(tiny_llama).resolve().name, store_target=sidecar.store_url,
                                     metrics=False)
    engine = AsyncLLM(config, observer)
    served = ServedModel.from_engine(engine, created=int(time.time()))
    with BackgroundServer(build_app(served)) as server:
        yield Upstream(server.url, served.name, parts)
    parts.close()


@pytest.fixture(scope="session")
def proxy(upstream, tiny_llama, sidecar):
    with BackgroundProxy.start(upstream.url, sidecar.store_url, "px", model_dir=tiny_llama) as p:
        yield p


@pytest.fixture
def clients(upstream, proxy):
    with httpx.Client(base_url=upstream.url, timeout=60) as direct, httpx.Client(base_url=proxy.url, timeout=60) as via:
        yield direct, via
