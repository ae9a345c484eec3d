"""The proxy lets go of an idle upstream connection before the upstream closes it.

uvicorn (vLLM's server, infersight's) closes an idle connection after 5 s by default; a pool that keeps
it as long may send a request on it as the upstream closes it, and the client gets a 502 for a reset.
"""

from __future__ import annotations

import httpx
import uvicorn

from engine.serving.proxy.background import BackgroundProxy


def test_the_proxys_upstream_pool_expires_idle_connections_before_uvicorns_default(upstream, sidecar):
    with BackgroundProxy.start(upstream.url, sidecar.store_url, "px-keepalive") as p:
        assert httpx.get(p.url + "/v1/models", timeout=30).status_code == 200  # the pool is the lifespan's
        pool = p.proxy._client._transport._pool
        assert pool._keepalive_expiry < uvicorn.Config(app=None).timeout_keep_alive
