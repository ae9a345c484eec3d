"""Helpers for the proxy tests: rows read back, responses compared."""

from __future__ import annotations

import json
from dataclasses import dataclass

# what differs between two answers to the same request: their ids and creation times
VOLATILE = ("id", "created")


@dataclass
class Upstream:
    url: str
    model: str
    parts: object  # TelemetryParts

    def flush(self) -> None:
        self.parts.recorder.flush()


def without_volatile(body: dict) -> dict:
    """The answer without what differs between two answers to one request: ids, creation times, and
    the prefix-cache hits in usage (the second of two identical prompts finds the first's blocks)."""
    out = {k: v for k, v in body.items() if k not in VOLATILE}
    if isinstance(out.get("usage"), dict):
        out["usage"] = {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}
    return out


def sse_payloads(text: str) -> list:
    """The data payloads of an SSE body, JSON parsed ([DONE] kept as the string)."""
    out = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            payload = event[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def rows(store, replica_id: str, request_ids: list[str]) -> dict[str, dict]:
    df = store.query_df("SELECT * FROM requests WHERE replica_id = {r:String} AND has({ids:Array(String)}, request_id)",
                        {"r": replica_id, "ids": list(request_ids)})
    return {r["request_id"]: r for r in df.to_dict("records")}
