"""No byte of a response leaves before every finished request's telemetry record is journaled.

The engine reports a finished request to its observers (the recorder's `on_request_finished`,
a deque append on the engine thread) before it hands the request's last output to the server.
So syncing the recorder's request journal (telemetry/journal.py) before each message a response
sends makes every request a client was answered survive a kill -9 of the replica: the next start
finds its record on disk and stores it. With nothing new to journal the sync is a length check;
otherwise one write() covers every request finished meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable


class JournalBarrier:
    """ASGI middleware: `sync()` (never raises, returns once everything finished so far is journaled)
    before each http.response.* message."""

    def __init__(self, app, sync: Callable[[], None]):
        self.app, self.sync = app, sync

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sync = self.sync

        async def send_after_journal(message):
            sync()
            await send(message)

        return await self.app(scope, receive, send_after_journal)


def journaled(app, recorder):
    """`app` behind the barrier of `recorder`'s journal (`app` itself without a recorder)."""
    return app if recorder is None else JournalBarrier(app, recorder.sync_journal)
