"""How long infersight's HTTP servers (the engine's, the recording proxy's) keep an idle connection.

A server must keep an idle connection open longer than its clients keep it: one that closes first
can close it at the moment a client sends the next request on it, and that request fails with a
connection reset (seen: an `httpx.ReadError` in a 2,000-request flood, where uvicorn's default and
httpx's pool expiry are both 5 s). Balancers keep theirs longer still (AWS ALB 60 s), so the default
outlasts them; `--timeout-keep-alive` (uvicorn's name) changes it.
"""

from __future__ import annotations

import argparse

KEEP_ALIVE_SECONDS = 75.0


def add_keep_alive_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout-keep-alive", type=float, default=KEEP_ALIVE_SECONDS, metavar="SECONDS",
                        help="how long an idle client connection stays open; keep it above the clients' and "
                             f"the balancer's idle timeout (default: {KEEP_ALIVE_SECONDS:g})")
