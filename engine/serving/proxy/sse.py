"""Server-sent events as they come: the upstream's byte stream cut at event boundaries, each
event whole and unchanged, so the client gets the very events the upstream sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

_BOUNDARIES = (b"\r\n\r\n", b"\n\n")


def _cut(buffer: bytes) -> int:
    """End of the first whole event in `buffer` (after its blank line), 0 if none yet."""
    ends = [i + len(b) for b in _BOUNDARIES if (i := buffer.find(b)) >= 0]
    return min(ends) if ends else 0


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while end := _cut(buffer):
            yield buffer[:end]
            buffer = buffer[end:]
    if buffer:  # a stream that ended without a blank line
        yield buffer


def data_json(event: bytes) -> tuple[dict, bytes, bytes] | None:
    """(the JSON object of a one-line `data:` event, its prefix, its ending), or None (comments,
    `[DONE]`, several data lines, anything not a JSON object)."""
    text = event.rstrip(b"\r\n")
    if not text.startswith(b"data:") or b"\n" in text:
        return None
    payload = text[5:]
    prefix = b"data: " if payload.startswith(b" ") else b"data:"
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return (obj, prefix, event[len(text):]) if isinstance(obj, dict) else None
